"""``contiguous-le-v1``: direct words, row-major, little-endian (BF16, FP32, I32).

Contract (docs/layouts.md, section contiguous-le-v1):

* Shape: any rank from 0 (a scalar, one word) to 16; every dimension in [0, 2^40].  A zero-size
  tensor has an empty plane.
* One plane ``words``: the logical words in row-major (C) order, each word little-endian
  (BF16: 2 bytes, FP32 and I32: 4 bytes).  ``nbytes = prod(shape) * width / 8``.
* No padding.  Words are moved as integers, so every NaN payload, signed zero and
  quiet/signalling bit round-trips bit-exactly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from ..formats import NumericFormat
from ..logical import DirectWords, LogicalTensor
from .base import Layout, PlaneSpec, check_array

__all__ = ["CONTIGUOUS_LE_V1", "ContiguousLE"]


class ContiguousLE(Layout):
    name = "contiguous-le-v1"
    formats = frozenset({"BF16", "FP32", "I32"})
    logical_type = DirectWords

    def _check_shape(self, fmt: NumericFormat, shape: tuple[int, ...]) -> None:
        return None  # every rank and size already bounded by Layout.check_shape

    def _physical(self, fmt: NumericFormat, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def _planes(self, fmt: NumericFormat, shape: tuple[int, ...]) -> list[PlaneSpec]:
        count = 1
        for d in shape:
            count *= d
        word = np.dtype(fmt.word_dtype).newbyteorder("<")
        return [PlaneSpec("words", count * word.itemsize, (count,), word.str)]

    def _pack(
        self, fmt: NumericFormat, shape: tuple[int, ...], logical: LogicalTensor
    ) -> list[npt.NDArray[np.uint8]]:
        if not isinstance(logical, DirectWords):
            raise UsageError(f"{fmt.name} packs DirectWords, not {type(logical).__name__}")
        want = np.dtype(fmt.word_dtype)
        words = check_array(logical.words, f"{fmt.name} words", want.kind, want.itemsize, shape)
        # astype to the explicit little-endian dtype byte-swaps on a big-endian host and never
        # touches a value: the words are integers, not floats.
        le = np.ascontiguousarray(words).astype(want.newbyteorder("<"), copy=False)
        return [le.reshape(-1).view(np.uint8)]

    def _unpack(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> LogicalTensor:
        want = np.dtype(fmt.word_dtype)
        words = planes[0].view(want.newbyteorder("<")).astype(want.newbyteorder("="), copy=True)
        return DirectWords(words.reshape(shape))


CONTIGUOUS_LE_V1 = ContiguousLE()
