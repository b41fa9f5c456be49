"""Bit-level oracle for MAXABS_F16_RECIP_RNE_V1 (spec Section 7).

Contract: this module never asks the floating-point unit to round anything.  Every value is an
exact :class:`fractions.Fraction` built from integer bit fields, every rounding to binary32 or
binary16 is done by :func:`round_to_binary` with explicit round-to-nearest, ties-to-even, and
the integral rounding uses ``round(Fraction)``, which Python defines as exact ties-to-even.  It is
deliberately slow and small so that it can be read against the spec line by line; the numpy and
torch backends must match it bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from ..ieee import BINARY16, BINARY32, BinaryFormat
from ..layouts.base import ceil_div

__all__ = [
    "BINARY16",
    "BINARY32",
    "BinaryFormat",
    "OracleFailure",
    "decode_binary",
    "encode_group_oracle",
    "encode_oracle",
    "round_to_binary",
]


class OracleFailure(ValueError):
    """A group the profile must refuse: ``column`` >= 0 for a non-finite value, else overflow."""

    def __init__(self, row: int, group: int, column: int, raw_scale: float) -> None:
        self.row, self.group, self.column, self.raw_scale = row, group, column, raw_scale
        super().__init__(f"row {row}, group {group}, column {column}")


def decode_binary(word: int, fmt: BinaryFormat) -> Fraction:
    """Exact value of a finite word; raises ValueError for inf/NaN (never quantized)."""
    sign = -1 if word & fmt.sign_mask else 1
    exp = (word >> fmt.frac_bits) & fmt.exp_max
    frac = word & fmt.frac_mask
    if exp == fmt.exp_max:
        raise ValueError(f"non-finite word 0x{word:x}")
    if exp == 0:  # zero or subnormal: frac * 2^(1 - bias - frac_bits)
        return sign * Fraction(frac) * Fraction(2) ** (1 - fmt.bias - fmt.frac_bits)
    return (
        sign
        * Fraction((1 << fmt.frac_bits) | frac)
        * Fraction(2) ** (exp - fmt.bias - fmt.frac_bits)
    )


def _floor_log2(value: Fraction) -> int:
    """floor(log2(value)) for value > 0, exactly."""
    e = value.numerator.bit_length() - value.denominator.bit_length()
    # 2^e <= value < 2^(e+1) after at most one correction step each way.
    if Fraction(2) ** e > value:
        e -= 1
    elif Fraction(2) ** (e + 1) <= value:
        e += 1
    return e


def round_to_binary(value: Fraction, fmt: BinaryFormat, *, negative_zero: bool = False) -> int:
    """Round an exact rational to the nearest word of ``fmt``, ties to even; overflow gives inf.

    ``negative_zero`` selects the sign of a zero result (a product's sign for ``-x * inv``).
    """
    sign_bit = fmt.sign_mask
    if value == 0:
        return sign_bit if negative_zero else 0
    sign = sign_bit if value < 0 else 0
    mag = -value if value < 0 else value
    emin = 1 - fmt.bias  # exponent of the smallest normal
    e = max(_floor_log2(mag), emin)
    # Quantum (unit in the last place) for numbers in [2^e, 2^(e+1)), or the subnormal quantum.
    quantum = Fraction(2) ** (e - fmt.frac_bits)
    n = round(mag / quantum)  # Fraction.__round__ is round-half-even: exactly RNE.
    if n == (1 << (fmt.frac_bits + 1)):  # rounding carried into the next binade
        n >>= 1
        e += 1
    if e > fmt.exp_max - 1 - fmt.bias:  # above the largest finite binade: infinity
        return sign | fmt.exp_mask
    if n < (1 << fmt.frac_bits):  # subnormal (only possible when e == emin)
        return sign | n
    return sign | ((e + fmt.bias) << fmt.frac_bits) | (n - (1 << fmt.frac_bits))


def dyadic32(word: int) -> tuple[int, int]:
    """A finite binary32 word as an exact (signed integer m, exponent e) with value m * 2^e."""
    sign = -1 if word >> 31 else 1
    exp = (word >> 23) & 0xFF
    frac = word & BINARY32.frac_mask
    if exp == 0:
        return sign * frac, -149
    return sign * (frac | 0x800000), exp - 150


def _shift_rne(m: int, s: int) -> int:
    """round(m / 2^s), ties to even, for s >= 1, in integers (Python's >> floors)."""
    q = m >> s
    rem = m - (q << s)  # 0 <= rem < 2^s
    half = 1 << (s - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


def _round_dyadic32(m: int, e: int) -> tuple[int, int]:
    """round_to_binary(m * 2^e, BINARY32) for a dyadic value, as (m', e') with m' * 2^e' the
    rounded value; the same rounding as :func:`round_to_binary`, in integer shifts instead of
    :class:`Fraction` operations (the oracle's per-element hot path; tests compare the two).
    Overflow never happens here (|x * inv| stays far below the binary32 range)."""
    if m == 0:
        return 0, 0
    mag = -m if m < 0 else m
    top = mag.bit_length() - 1 + e  # floor(log2 |value|)
    quantum_exp = max(top, -126) - 23  # exponent of the last kept bit (subnormals: -149)
    if e >= quantum_exp:
        return m, e  # already representable
    n = _shift_rne(mag, quantum_exp - e)
    return (-n if m < 0 else n), quantum_exp


def encode_group_oracle(x_words: list[int], qmin: int, qmax: int) -> tuple[int, list[int]]:
    """Encode one group of binary32 words; returns (binary16 scale word, signed codes).

    Raises :class:`OracleFailure` for a non-finite input or a scale that overflows binary16.
    """
    for i, w in enumerate(x_words):
        if (w >> 23) & 0xFF == 0xFF:
            raise OracleFailure(-1, -1, i, float("nan"))
    # max |x|: for finite IEEE words with the sign bit cleared, the integer order is the order
    # of the magnitudes (exponent above fraction, both unsigned), so the largest such word is
    # the word of amax.
    magnitude = BINARY32.magnitude_mask
    amax = decode_binary(max(w & magnitude for w in x_words), BINARY32)
    if amax == 0:
        return 0x0000, [0] * len(x_words)
    raw_scale32 = decode_binary(round_to_binary(amax / qmax, BINARY32), BINARY32)
    scale16 = round_to_binary(raw_scale32, BINARY16)
    if scale16 == 0x0000:
        scale16 = 0x0001  # 2^-24 underflow rescue
    if (scale16 >> 10) & 0x1F == 0x1F:
        raise OracleFailure(-1, -1, -1, float(raw_scale32))
    scale32 = decode_binary(scale16, BINARY16)  # exact binary16 -> binary32
    inv_m, inv_e = dyadic32(round_to_binary(1 / scale32, BINARY32))
    codes = []
    for w in x_words:
        # normalized32 = round_f32(x * inv32): the exact product of two dyadics is dyadic.
        x_m, x_e = dyadic32(w)
        n_m, n_e = _round_dyadic32(x_m * inv_m, x_e + inv_e)
        # round_to_integral_ties_to_even(normalized32), exactly.
        rounded = n_m << n_e if n_e >= 0 else _shift_rne(n_m, -n_e)
        codes.append(min(max(rounded, qmin), qmax))
    return scale16, codes


GroupEncoder = Callable[[list[int], int, int], tuple[int, list[int]]]
"""One group's binary32 words and (qmin, qmax) -> (binary16 scale word, codes)."""


def encode_matrix(
    encode_group: GroupEncoder,
    x_words: npt.NDArray[np.uint32],
    group_size: int,
    qmin: int,
    qmax: int,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.uint16]]:
    """Encode an [N, K] matrix of binary32 words group by group with ``encode_group``.

    Raises :class:`OracleFailure` with the row, group (and column) of the first failure.
    """
    n_rows, k = x_words.shape
    n_groups = ceil_div(k, group_size)
    codes = np.zeros((n_rows, k), dtype=np.int8)
    scales = np.zeros((n_rows, n_groups), dtype=np.uint16)
    for r in range(n_rows):
        for g in range(n_groups):
            lo, hi = g * group_size, min(k, (g + 1) * group_size)
            group = [int(w) for w in x_words[r, lo:hi]]
            try:
                s, c = encode_group(group, qmin, qmax)
            except OracleFailure as exc:
                col = lo + exc.column if exc.column >= 0 else -1
                raise OracleFailure(r, g, col, exc.raw_scale) from None
            scales[r, g] = s
            codes[r, lo:hi] = c
    return codes, scales


def encode_oracle(
    x_words: npt.NDArray[np.uint32], group_size: int, qmin: int, qmax: int
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.uint16]]:
    """Encode an [N, K] matrix of binary32 words group by group with the oracle.

    Raises :class:`OracleFailure` with the row, group (and column) of the first failure.
    """
    return encode_matrix(encode_group_oracle, x_words, group_size, qmin, qmax)
