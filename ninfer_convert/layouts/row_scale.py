"""``row-scale-v1``: FP8_E4M3FN_ROW_BF16S codes row-major plus one BF16 multiplier per row.

Contract (docs/layouts.md, section row-scale-v1 is normative):

* Format FP8_E4M3FN_ROW_BF16S on a rank-two [N, K] matrix, N >= 1, K >= 1.
* Plane ``codes`` (N * K bytes): the E4M3FN code words, row-major, one byte each.
* Plane ``scales`` (2 * N bytes): the BF16 word of row n's multiplier at bytes 2n, 2n+1,
  little-endian.
* No padding.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from ..formats import NumericFormat
from ..logical import FP8RowWords, LogicalTensor
from .base import Layout, PlaneSpec, check_array

__all__ = ["ROW_SCALE_V1", "RowScale"]


class RowScale(Layout):
    name = "row-scale-v1"
    formats = frozenset({"FP8_E4M3FN_ROW_BF16S"})
    logical_type = FP8RowWords

    def _check_shape(self, fmt: NumericFormat, shape: tuple[int, ...]) -> None:
        if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
            raise UsageError(
                f"{fmt.name} needs a rank-two [N, K] shape with N >= 1 and K >= 1, "
                f"got {list(shape)}"
            )

    def _physical(self, fmt: NumericFormat, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def _planes(self, fmt: NumericFormat, shape: tuple[int, ...]) -> list[PlaneSpec]:
        n, k = shape
        return [PlaneSpec("codes", n * k, (n, k), "u1"), PlaneSpec("scales", 2 * n, (n,), "<u2")]

    def _pack(
        self, fmt: NumericFormat, shape: tuple[int, ...], logical: LogicalTensor
    ) -> list[npt.NDArray[np.uint8]]:
        if not isinstance(logical, FP8RowWords):
            raise UsageError(f"{fmt.name} packs FP8RowWords, not {type(logical).__name__}")
        n, k = shape
        codes = check_array(logical.codes, f"{fmt.name} codes", "u", 1, (n, k))
        scales = check_array(logical.scales, f"{fmt.name} scales", "u", 2, (n,))
        return [
            np.ascontiguousarray(codes, dtype=np.uint8).reshape(-1),
            np.ascontiguousarray(scales).astype("<u2", copy=False).view(np.uint8),
        ]

    def _unpack(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> LogicalTensor:
        n, k = shape
        return FP8RowWords(
            codes=planes[0].reshape(n, k).copy(),
            scales=planes[1].view("<u2").astype(np.uint16),
        )


ROW_SCALE_V1 = RowScale()
