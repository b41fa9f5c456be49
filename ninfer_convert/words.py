"""Exact word codecs: decode oracles of spec Section 3 and the recipe's source-type conversions.

Contract:

* Decoding any registered word (BF16, binary16, FP32, E2M1, E4M3FN) to binary32 is exact and
  keeps signed zeros; it is done with integer bit manipulation, never through a host cast whose
  rounding or NaN handling could differ between machines.
* Copying words never canonicalises a NaN payload: direct words are moved as integers.
* Conversions between *different* types exist only as the named functions below, which a
  checkpoint recipe must request explicitly (spec Section 3.1): BF16 / binary16 -> binary32
  (exact), binary32 -> BF16 round-to-nearest-even (non-finite input rejected unless kept on
  request), and integer -> I32 with a range check (never wraps).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .errors import EncodeError
from .ieee import BINARY16, BINARY32

__all__ = [
    "E2M1_VALUES",
    "E4M3FN_VALUES",
    "bf16_to_f32_words",
    "e2m1_to_f32",
    "e4m3fn_is_nan",
    "e4m3fn_to_f32",
    "f16_to_f32_words",
    "f32_to_bf16_rne",
    "first_index",
    "int_to_i32",
    "words_to_f32",
]

U16 = npt.NDArray[np.uint16]
U32 = npt.NDArray[np.uint32]
F32 = npt.NDArray[np.float32]


def first_index(mask: npt.NDArray[np.bool_]) -> tuple[int, ...]:
    """Row-major index of the first True in ``mask`` (callers check ``mask.any()`` first)."""
    flat = int(np.argmax(mask.reshape(-1)))
    return tuple(int(i) for i in np.unravel_index(flat, mask.shape))


# ---------------------------------------------------------------------------------------------
# BF16 <-> binary32


def bf16_to_f32_words(words: npt.NDArray[np.uint16]) -> U32:
    """Exact BF16 -> binary32: the BF16 word becomes the high half, the low half is zero."""
    return np.left_shift(words.astype(np.uint32), np.uint32(16))


def f32_to_bf16_rne(
    words: npt.NDArray[np.uint32], *, keep_nonfinite: bool = False, tensor: str | None = None
) -> U16:
    """binary32 words -> BF16 words, round to nearest, ties to even.

    Derivation: dropping the low 16 bits truncates; adding ``0x7FFF + lsb`` (lsb = bit 16, the
    last kept bit) first carries into the kept part exactly when the dropped half is above the
    halfway point 0x8000, or equal to it with an odd kept part.  A carry out of the fraction
    correctly bumps the exponent (finite max rounds to +-inf, as RNE requires).  NaN inputs are
    kept as NaN with their top payload bits (quiet bit forced so truncation cannot make an inf)
    only when ``keep_nonfinite``; otherwise any non-finite input is an :class:`EncodeError`.
    """
    w = np.asarray(words, dtype=np.uint32)
    exp_mask = np.uint32(BINARY32.exp_mask)
    exp_all_ones = (w & exp_mask) == exp_mask
    if not keep_nonfinite and exp_all_ones.any():
        idx = first_index(exp_all_ones)
        raise EncodeError(
            f"non-finite FP32 value (word 0x{int(w[idx]):08x}) at index {list(idx)} "
            "cannot be converted to BF16",
            tensor=tensor,
            hint="fix the source, or allow non-finite values for this rule explicitly",
        )
    lsb = (w >> np.uint32(16)) & np.uint32(1)
    rounded = ((w + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    if exp_all_ones.any():
        is_nan = exp_all_ones & ((w & np.uint32(BINARY32.frac_mask)) != 0)
        passthrough = (w >> np.uint32(16)).astype(np.uint16)
        rounded = np.where(exp_all_ones, passthrough, rounded)
        rounded = np.where(is_nan, rounded | np.uint16(0x0040), rounded)
    return rounded


# ---------------------------------------------------------------------------------------------
# binary16 -> binary32 (bit-level; no FPU involvement)


def f16_to_f32_words(words: npt.NDArray[np.uint16]) -> U32:
    """Exact binary16 -> binary32 words, including subnormals, infinities and NaN payloads.

    Normal: rebias the exponent by 127 - 15 = 112 and shift the 10-bit fraction up by 13.
    Subnormal (exponent 0): value = f * 2^-24; normalise by the position of f's top bit.
    """
    h = np.asarray(words, dtype=np.uint16).astype(np.uint32)
    sign = (h & np.uint32(BINARY16.sign_mask)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(BINARY16.exp_max)
    frac = h & np.uint32(BINARY16.frac_mask)
    normal = sign | ((exp + np.uint32(112)) << np.uint32(23)) | (frac << np.uint32(13))
    special = sign | np.uint32(BINARY32.exp_mask) | (frac << np.uint32(13))
    # Subnormal f in [1, 1023]: with p = floor(log2 f), value = 2^(p-24) * (f / 2^p); the
    # binary32 exponent field is p - 24 + 127 and the fraction is (f - 2^p) << (23 - p).
    f_safe = np.maximum(frac, np.uint32(1))
    p = (np.floor(np.log2(f_safe.astype(np.float64)))).astype(np.uint32)
    sub_frac = ((f_safe - (np.uint32(1) << p)) << (np.uint32(23) - p)) & np.uint32(
        BINARY32.frac_mask
    )
    subnormal = sign | ((p + np.uint32(103)) << np.uint32(23)) | sub_frac
    out = np.where(exp == 0, np.where(frac == 0, sign, subnormal), normal)
    out = np.where(exp == 0x1F, special, out)
    return out.astype(np.uint32)


def words_to_f32(words: npt.NDArray[np.uint32]) -> F32:
    """Reinterpret binary32 words as float32 values (no conversion)."""
    return np.ascontiguousarray(words, dtype=np.uint32).view(np.float32)


# ---------------------------------------------------------------------------------------------
# E2M1 and E4M3FN (spec Section 3.3)

# Positive E2M1 words 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (exact hex: 0x0p0 0x1p-1 0x1p0 0x1.8p0
# 0x1p1 0x1.8p1 0x1p2 0x1.8p2); bit 3 negates, so 0x8 is -0.0.
_E2M1_POS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
E2M1_VALUES: F32 = np.array(_E2M1_POS + [-v for v in _E2M1_POS], dtype=np.float32)
E2M1_VALUES.setflags(write=False)


def _e4m3fn_table() -> F32:
    vals = np.empty(256, dtype=np.float32)
    for w in range(256):
        sign = -1.0 if w & 0x80 else 1.0
        e = (w >> 3) & 0xF
        m = w & 0x7
        if e == 15 and m == 7:
            vals[w] = np.float32(np.nan) if sign > 0 else -np.float32(np.nan)
        elif e == 0:
            vals[w] = sign * m * 2.0**-9  # subnormal; m == 0 gives the signed zero
        else:
            vals[w] = sign * (1 + m / 8) * 2.0 ** (e - 7)
    return vals


E4M3FN_VALUES: F32 = _e4m3fn_table()
"""binary32 value of every E4M3FN word; words 0x7f and 0xff are NaN (E4M3FN has no inf)."""
E4M3FN_VALUES.setflags(write=False)


def e2m1_to_f32(codes: npt.NDArray[np.uint8]) -> F32:
    """Exact E2M1 decode; only the low 4 bits of each byte are meaningful."""
    return E2M1_VALUES[np.asarray(codes, dtype=np.uint8) & np.uint8(0x0F)]


def e4m3fn_to_f32(words: npt.NDArray[np.uint8]) -> F32:
    """Exact E4M3FN decode (NaN for 0x7f/0xff)."""
    return E4M3FN_VALUES[np.asarray(words, dtype=np.uint8)]


def e4m3fn_is_nan(words: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    return (np.asarray(words, dtype=np.uint8) & np.uint8(0x7F)) == np.uint8(0x7F)


# ---------------------------------------------------------------------------------------------
# integer sources -> I32

_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1


def int_to_i32(
    values: npt.NDArray[np.generic], *, tensor: str | None = None
) -> npt.NDArray[np.int32]:
    """Integer or bool array -> int32 with a range check; never wraps, truncates or saturates."""
    arr = np.asarray(values)
    if arr.dtype == np.bool_:
        return arr.astype(np.int32)
    if not np.issubdtype(arr.dtype, np.integer):
        raise EncodeError(
            f"I32 takes integer sources only, got {arr.dtype}",
            tensor=tensor,
            hint="store floating-point tensors as BF16 or FP32",
        )
    if arr.size and arr.dtype.itemsize >= 4:
        low = int(arr.min())
        high = int(arr.max())
        if low < _I32_MIN or high > _I32_MAX:
            bad = (arr < _I32_MIN) | (arr > _I32_MAX) if arr.dtype.kind == "i" else arr > _I32_MAX
            idx = first_index(np.asarray(bad))
            raise EncodeError(
                f"value {int(arr[idx])} at index {list(idx)} is outside the I32 range "
                f"[{_I32_MIN}, {_I32_MAX}]",
                tensor=tensor,
                hint="I32 never wraps; keep this tensor out of I32 or fix the source",
            )
    return arr.astype(np.int32)
