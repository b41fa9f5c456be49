"""Shared pieces of the grouped encoder backends: source kinds, results and error reports."""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError
from ..formats import NumericFormat, lookup_format
from ..words import first_index

__all__ = [
    "SourceDtype",
    "check_words",
    "grouped_format",
    "locate_nonfinite",
    "nonfinite_error",
    "overflow_error",
    "to_f32",
]

SourceDtype = Literal["BF16", "F16", "F32"]
"""Source element types the grouped encoder accepts, as safetensors spells them."""

_WORD_DTYPES = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32}


def grouped_format(fmt: str | NumericFormat) -> NumericFormat:
    entry = lookup_format(fmt)
    if not entry.is_grouped:
        raise EncodeError(
            f"{entry.name} is not a grouped signed-integer format",
            hint="MAXABS_F16_RECIP_RNE_V1 encodes Q4G64_F16S, Q5G64_F16S, Q6G64_F16S and "
            "W8G32_F16S only",
        )
    return entry


def check_words(words: npt.NDArray[np.generic], source_dtype: str) -> None:
    if source_dtype not in _WORD_DTYPES:
        raise EncodeError(
            f"source dtype {source_dtype!r} cannot be quantized",
            hint="grouped formats take BF16, F16 or F32 sources",
        )
    if words.ndim != 2 or words.shape[0] <= 0 or words.shape[1] <= 0:
        raise EncodeError(
            f"grouped encoding needs a rank-two [N, K] matrix with N, K > 0, got shape "
            f"{list(words.shape)}",
            hint="add a reshape or transpose to the recipe rule",
        )
    want = _WORD_DTYPES[source_dtype]
    if words.dtype != want and not (source_dtype == "F32" and words.dtype == np.float32):
        raise EncodeError(
            f"{source_dtype} source must arrive as {np.dtype(want).name} words, got {words.dtype}"
        )


def to_f32(words: npt.NDArray[np.generic], source_dtype: str) -> npt.NDArray[np.float32]:
    """Exact conversion of a chunk of source words to binary32 values (spec Section 7)."""
    if source_dtype == "BF16":
        # BF16 is the high half of a binary32 word: shift into place and reinterpret.
        # One pass: the ufunc widens each word to uint32 inside its loop before shifting.
        return np.left_shift(words, np.uint32(16), dtype=np.uint32).view(np.float32)
    if source_dtype == "F16":
        # binary16 -> binary32 is exact for every finite value (widening conversion).
        return np.asarray(words).view(np.float16).astype(np.float32)
    return np.ascontiguousarray(words).view(np.float32)


def nonfinite_error(
    tensor: str | None, row: int, group: int, column: int, word: int, source_dtype: str
) -> EncodeError:
    return EncodeError(
        f"non-finite source value (word 0x{word:x} {source_dtype}) at row {row}, column "
        f"{column} (group {group}); NaN and infinity are never quantized",
        tensor=tensor,
        kind="non_finite_value",
        rule="spec Section 7",
        hint="fix the source checkpoint or keep this tensor in a direct format",
    )


def overflow_error(tensor: str | None, row: int, group: int, raw_scale: float) -> EncodeError:
    return EncodeError(
        f"row {row}, group {group}: scale amax/qmax = {raw_scale!r} overflows binary16 "
        "(largest finite 65504)",
        tensor=tensor,
        kind="scale_overflow",
        rule="spec Section 7",
        hint="this group's magnitude cannot be represented by an F16S format; choose a direct "
        "format for this tensor",
    )


def locate_nonfinite(
    x: npt.NDArray[np.float32], row0: int, group_size: int
) -> tuple[int, int, int]:
    """(row, group, column) of the first non-finite value of a chunk."""
    r, c = first_index(~np.isfinite(x))
    return row0 + r, c // group_size, c
