"""Reconstruction oracles in binary32 (spec Sections 3.3, 3.4 and 6.2).

Contract: every function returns the exact binary32 value the spec defines.

* grouped: ``binary32(s32 * q)``.  The product of a binary16 value (11 significant bits) and a
  code of at most 8 bits has at most 19 significant bits and stays inside binary32's normal
  range, so numpy's float32 multiply computes it exactly.
* NVFP4: ``e2m1 * e4m3 / d_w`` rounded once.  The numerator has at most 2 + 4 significant bits
  and lies in [2^-10, 2688], so the float32 product is exact and the one float32 division is
  the single rounding.
* FP8 row: ``binary32(c32 * s32)``, one float32 multiply (RNE; may round or underflow exactly as
  the spec's binary32 expression does).
numpy float32 arithmetic is IEEE round-to-nearest-even without flush-to-zero.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .errors import UsageError
from .formats import Category, NumericFormat, lookup_format
from .layouts.base import ceil_div
from .logical import DirectWords, FP8RowWords, GroupedCodes, LogicalTensor, NVFP4Words
from .words import bf16_to_f32_words, e2m1_to_f32, e4m3fn_to_f32, f16_to_f32_words

__all__ = [
    "dequantize_fp8_row",
    "dequantize_grouped",
    "dequantize_logical",
    "dequantize_nvfp4",
]

F32 = npt.NDArray[np.float32]


def dequantize_grouped(
    codes: npt.NDArray[np.int8], scales: npt.NDArray[np.uint16], format: str | NumericFormat
) -> F32:
    """Public API: float32 [N, K] = binary32(s32 * q) for a grouped format."""
    fmt = lookup_format(format)
    if not fmt.is_grouped or fmt.group_size is None:
        raise UsageError(f"{fmt.name} is not a grouped signed-integer format")
    codes = np.asarray(codes)
    n, k = codes.shape
    n_groups = ceil_div(k, fmt.group_size)
    if np.asarray(scales).shape != (n, n_groups):
        raise UsageError(
            f"scales shape {list(np.shape(scales))} does not match codes {[n, k]} "
            f"(expected {[n, n_groups]} for G={fmt.group_size})"
        )
    s32 = f16_to_f32_words(np.asarray(scales, dtype=np.uint16)).view(np.float32)
    per_elem = np.repeat(s32, fmt.group_size, axis=1)[:, :k]
    return np.multiply(per_elem, codes.astype(np.float32))


def dequantize_nvfp4(
    codes: npt.NDArray[np.uint8], scales: npt.NDArray[np.uint8], divisor: int
) -> F32:
    k = codes.shape[1]
    block = np.repeat(e4m3fn_to_f32(scales), 16, axis=1)[:, :k]
    d = np.array([divisor & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]
    return np.divide(np.multiply(e2m1_to_f32(codes), block), d)


def dequantize_fp8_row(codes: npt.NDArray[np.uint8], scales: npt.NDArray[np.uint16]) -> F32:
    s32 = bf16_to_f32_words(np.asarray(scales, dtype=np.uint16)).view(np.float32)
    return np.multiply(e4m3fn_to_f32(codes), s32[:, None])


def dequantize_logical(fmt: str | NumericFormat, logical: LogicalTensor) -> F32:
    """float32 values of a logical tensor of a floating-point format (direct BF16/FP32
    exactly).  I32 is refused: its values are integers, which binary32 holds exactly only up
    to 2^24 (16777217 would come back as 16777216); read its words instead."""
    entry = lookup_format(fmt)
    if entry.name == "I32":
        raise UsageError(
            "I32 values are integers and have no exact float32 form (binary32 rounds odd "
            "values above 2^24)",
            hint="use the int32 words (Artifact.read(name).words, or Artifact.dequantize, "
            "which returns them exactly)",
        )
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if entry.category is Category.DIRECT and isinstance(logical, DirectWords):
            if entry.name == "BF16":
                return bf16_to_f32_words(logical.words.astype(np.uint16)).view(np.float32)
            if entry.name == "FP32":
                return np.ascontiguousarray(logical.words).view(np.float32).copy()
        if entry.category is Category.GROUPED and isinstance(logical, GroupedCodes):
            return dequantize_grouped(logical.codes, logical.scales, entry)
        if entry.category is Category.BLOCK_SCALED and isinstance(logical, NVFP4Words):
            return dequantize_nvfp4(logical.codes, logical.scales, logical.divisor)
        if entry.category is Category.ROW_SCALED and isinstance(logical, FP8RowWords):
            return dequantize_fp8_row(logical.codes, logical.scales)
    raise UsageError(f"{type(logical).__name__} is not the logical representation of {entry.name}")
