"""Exact reference for block-compensated encoding (docs/encoder-profiles.md, "Error compensation
across columns"): plain Python, one row at a time, written to be read beside the document.

Contract: for every row the function below is the document's loop, statement by statement.
Python floats are IEEE-754 binary64 and every ``+ - * /`` on two of them is one correctly
rounded operation (round to nearest, ties to even; CPython never fuses a multiply and an add),
so each ``RN64(...)`` of the document is one Python operation here.  The two steps that are
*not* binary64 arithmetic are done exactly: the binary32 rounding of the current values before
the scale search (:func:`round_f32_word`, integer arithmetic on the binary64 bits) and the code
choice ``clamp(round_half_even(w / s))`` (a :class:`~fractions.Fraction` quotient).  The scale
search itself is MSE_F16_SEARCH_V1's exact reference (with importance weights
MSE_F16_SEARCH_IW_V1's: :func:`~.mse_reference.encode_group_mse_reference`).  Slow (pure
Python, about N * K * B / 2 multiply-subtract pairs): for tests, not for converting.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from ..ieee import BINARY32
from ..layouts.base import ceil_div
from .mse_reference import encode_group_mse_reference
from .oracle import OracleFailure

__all__ = ["BLOCK_UNIT", "CompensationFailure", "encode_compensated_reference", "round_f32_word"]

BLOCK_UNIT = 128
"""The block width B of a factor ([K, B]) is a positive multiple of this, so a multiple of
every group width (64 and 32); B >= K is one block over the whole row (full compensation)."""


class CompensationFailure(ValueError):
    """A row that the document refuses: ``row``, ``column`` and why (``reason``)."""

    def __init__(self, row: int, column: int, reason: str) -> None:
        super().__init__(f"row {row}, column {column}: {reason}")
        self.row = row
        self.column = column
        self.reason = reason


def round_f32_word(v: float) -> int:
    """The binary32 word of RN32(v) for a finite binary64 v (ties to even, subnormals, overflow
    to infinity), computed on the binary64 bits with integers only."""
    bits = struct.unpack("<Q", struct.pack("<d", v))[0]
    sign = (bits >> 63) << 31
    exp = (bits >> 52) & 0x7FF
    frac = bits & ((1 << 52) - 1)
    if exp == 0 and frac == 0:
        return sign
    # v = m * 2^e exactly, m an integer below 2^53
    m, e = (frac | (1 << 52), exp - 1075) if exp else (frac, -1074)
    # binary32 keeps 24 significant bits, and its quantum is never below 2^-149
    top = m.bit_length() + e  # 2^(top-1) <= |v| < 2^top
    q_exp = max(top - 24, -149)
    shift = q_exp - e
    if shift <= 0:
        r = m << -shift
    else:
        r = m >> shift
        rem = m - (r << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and r & 1):
            r += 1
    # r * 2^q_exp, with r <= 2^24 (a carry into the next binade is still exact)
    if r == 0:
        return sign
    value_top = r.bit_length() + q_exp
    if value_top > 128:  # |RN32(v)| >= 2^128: overflow
        return sign | BINARY32.exp_mask
    if r.bit_length() + q_exp <= -126:  # subnormal: exponent field 0, r < 2^23
        return sign | r
    while r >= 1 << 24:
        r >>= 1
        q_exp += 1
    while r < 1 << 23:
        r <<= 1
        q_exp -= 1
    return sign | ((q_exp + 23 + 127) << 23) | (r - (1 << 23))


def _f32(word: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", word))[0])


def _f16(word: int) -> float:
    return float(np.array([word], np.uint16).view(np.float16)[0])


def _nearest_code(w: float, s: float, qmin: int, qmax: int) -> int:
    """clamp(round_half_even(w / s), qmin, qmax) of the exact quotient (s > 0)."""
    q = Fraction(w) / Fraction(s)
    return max(qmin, min(qmax, round(q)))  # Fraction.__round__ rounds half to even


def encode_compensated_reference(
    x_words: npt.NDArray[np.uint32],
    factor_words: npt.NDArray[np.uint32],
    group_size: int,
    qmin: int,
    qmax: int,
    trace: npt.NDArray[np.float64] | None = None,
    weights: npt.NDArray[np.uint32] | None = None,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.uint16]]:
    """Codes [N, K] and binary16 scale words [N, ceil(K/G)] of an [N, K] matrix of binary32
    words with the factor ([K, B] binary32 words, B a multiple of :data:`BLOCK_UNIT`, already
    checked: see :func:`~.gptq.check_factor`).  Raises :class:`CompensationFailure`
    (non-finite current value, refused scale search) at the first failing row and column, in
    row order.  ``trace`` [N, K], when given, receives each value as its code is chosen;
    ``weights`` ([K] binary32 words, finite, sign clear) make the scale search
    MSE_F16_SEARCH_IW_V1's."""
    per_column = None if weights is None else [int(v) for v in np.asarray(weights).reshape(-1)]
    n, k = x_words.shape
    g = group_size
    block = int(np.asarray(factor_words).shape[1])
    if block % g or block % BLOCK_UNIT:
        raise ValueError("the block width must be a multiple of 128")
    # The part of a factor row in use, widened exactly (a binary32 memoryview's tolist) when it
    # is used: memory follows a row of B entries, not the K x B factor (verify samples whole
    # rows with this).
    f32 = np.ascontiguousarray(factor_words, dtype=np.uint32).reshape(-1).view(np.float32).data
    codes = np.zeros((n, k), dtype=np.int8)
    scales = np.zeros((n, ceil_div(k, g)), dtype=np.uint16)
    for r in range(n):
        w = [_f32(int(v)) for v in x_words[r]]
        for b0 in range(0, k, block):
            b1 = min(k, b0 + block)
            for g0 in range(b0, b1, g):
                g1 = min(b1, g0 + g)
                v = [round_f32_word(w[i]) if math.isfinite(w[i]) else BINARY32.exp_mask
                     for i in range(g0, g1)]  # fmt: skip
                try:
                    wg = None if per_column is None else per_column[g0:g1]
                    s16, _ = encode_group_mse_reference(v, qmin, qmax, wg)
                except OracleFailure:
                    raise CompensationFailure(r, g0, "the scale search refuses the group") from None
                scales[r, g0 // g] = s16
                s = _f16(s16)
                for i in range(g0, g1):
                    if not math.isfinite(w[i]):
                        raise CompensationFailure(r, i, "the compensated value is not finite")
                    if trace is not None:
                        trace[r, i] = w[i]
                    q = 0 if s == 0.0 else _nearest_code(w[i], s, qmin, qmax)
                    codes[r, i] = q
                    fi = f32[block * i + i - b0 : block * i + b1 - b0].tolist()  # u(i, i..b1-1)
                    d = w[i] - s * q  # s * q is exact; one rounding in the subtraction
                    e = d / fi[0]
                    for j in range(i + 1, b1):
                        w[j] = w[j] - e * fi[j - i]
    return codes, scales
