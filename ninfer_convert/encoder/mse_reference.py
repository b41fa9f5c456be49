"""Exact reference for the encoder profiles MSE_F16_SEARCH_V1 and MSE_F16_SEARCH_IW_V1
(docs/encoder-profiles.md).

Contract: like :mod:`.oracle`, this module never asks the floating-point unit to round
anything.  Every value it handles is dyadic (an integer times a power of two): binary32 source
values, binary16 scales, their products with integer codes, and every binary64 result of the
error sum.  Candidate scales are exact rationals rounded once to binary16 by
:func:`~.oracle.round_to_binary`; codes are ``round(Fraction)`` (exact ties-to-even); the
binary64 error accumulation is emulated with integer significands and an explicit
round-to-nearest-even shift.  The fast numpy backend (:mod:`.mse_search`) must match it bit
for bit.  It is slow (milliseconds per group) and meant to be read against the document.

MSE_F16_SEARCH_IW_V1 is the same search with an importance-weighted error: every function that
takes ``weights`` (binary32 words, one per value of the group, or one per column of the matrix)
multiplies each squared difference by the exact widening of its weight, one more emulated
binary64 rounding, before it is added.  ``weights=None`` is MSE_F16_SEARCH_V1 exactly.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import numpy.typing as npt

from ..layouts.base import ceil_div
from .oracle import (
    BINARY16,
    BINARY32,
    OracleFailure,
    decode_binary,
    encode_group_oracle,
    encode_matrix,
)
from .oracle import round_to_binary as _round_to_binary

__all__ = [
    "CANDIDATE_RATIOS",
    "candidate_scales_reference",
    "encode_group_mse_reference",
    "encode_mse_reference",
    "group_error_reference",
    "weight_problem",
]

CANDIDATE_RATIOS: tuple[int, ...] = tuple(range(29, 41))
"""c in the candidate denominators D = qmax * c / 32 (candidates 2..13 of the document)."""

_F64_FRAC = 52
_F64_EMIN = -1022  # exponent of the smallest binary64 normal


def _shift_rne(m: int, s: int) -> int:
    """round(m / 2^s) ties to even, s >= 1, m of any sign (Python's >> floors)."""
    q = m >> s
    rem = m - (q << s)
    half = 1 << (s - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


def _rne64(m: int, e: int) -> tuple[int, int]:
    """The binary64 round-to-nearest-even of the dyadic m * 2^e, as (m', e').

    Overflow cannot occur: |values| stay below 2^300 (squares of binary32 differences times 64).
    """
    if m == 0:
        return 0, 0
    mag = -m if m < 0 else m
    top = mag.bit_length() - 1 + e
    quantum = max(top, _F64_EMIN) - _F64_FRAC
    if e >= quantum:
        return m, e
    n = _shift_rne(mag, quantum - e)
    return (-n if m < 0 else n), quantum


def _dyadic32(word: int) -> tuple[int, int]:
    sign = -1 if word >> 31 else 1
    exp = (word >> 23) & 0xFF
    frac = word & BINARY32.frac_mask
    if exp == 0:
        return sign * frac, -149
    return sign * (frac | 0x800000), exp - 150


def _dyadic16(word: int) -> tuple[int, int]:
    exp = (word >> 10) & 0x1F
    frac = word & BINARY16.frac_mask
    if exp == 0:
        return frac, -24
    return frac | 0x400, exp - 25


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    (ma, ea), (mb, eb) = a, b
    e = min(ea, eb)
    return (ma << (ea - e)) + (mb << (eb - e)), e


def candidate_scales_reference(x_words: list[int], qmin: int, qmax: int) -> list[int | None]:
    """The candidate binary16 scale words of one finite, not all-zero group, in index order.

    ``None`` marks a candidate that rounds to binary16 infinity (never chosen).  Raises
    :class:`~.oracle.OracleFailure` where the canonical profile refuses the group.
    """
    canonical, _ = encode_group_oracle(x_words, qmin, qmax)
    amax = decode_binary(max(w & BINARY32.magnitude_mask for w in x_words), BINARY32)
    denominators = [Fraction(-qmin)] + [Fraction(qmax * c, 32) for c in CANDIDATE_RATIOS]
    out: list[int | None] = [canonical]
    for d in denominators:
        word = _round_to_binary(amax / d, BINARY16)
        if word == 0:
            word = 0x0001  # the Section 7 rescue, applied to every candidate
        out.append(None if (word >> 10) & 0x1F == 0x1F else word)
    return out


def _codes_for(x_words: list[int], scale16: int, qmin: int, qmax: int) -> list[int]:
    s = decode_binary(scale16, BINARY16)
    return [min(max(round(decode_binary(w, BINARY32) / s), qmin), qmax) for w in x_words]


def weight_problem(word: int) -> str | None:
    """Why a binary32 importance word is refused, or ``None`` when it is usable: the sign bit
    must be clear (negative values and -0 are refused, so that a stored vector has one
    spelling) and the value finite (exponent field not all ones)."""
    if word >> 31:
        return "is negative (sign bit set; -0 too: write +0)"
    if (word >> 23) & 0xFF == 0xFF:
        return "is not finite (NaN or infinity)"
    return None


def group_error_reference(
    x_words: list[int], scale16: int, codes: list[int], weights: list[int] | None = None
) -> Fraction:
    """The document's binary64 error: acc = +0; for i in order: r = s * q (exact),
    d = RNE64(x - r), t = RNE64(d * d), [u = RNE64(w64[i] * t),] acc = RNE64(acc + u).
    Returned as its exact value; ``weights`` are binary32 words (one per value), already
    checked by :func:`weight_problem`."""
    sm, se = _dyadic16(scale16)
    ws: list[tuple[int, int] | None] = (
        [None] * len(x_words) if weights is None else [_dyadic32(w) for w in weights]
    )
    acc = (0, 0)
    for w, q, wt in zip(x_words, codes, ws, strict=True):
        xm, xe = _dyadic32(w)
        d = _rne64(*_add((xm, xe), (-sm * q, se)))
        t = _rne64(d[0] * d[0], 2 * d[1])
        if wt is not None:
            t = _rne64(wt[0] * t[0], wt[1] + t[1])
        acc = _rne64(*_add(acc, t))
    return Fraction(acc[0]) * Fraction(2) ** acc[1]


def encode_group_mse_reference(
    x_words: list[int], qmin: int, qmax: int, weights: list[int] | None = None
) -> tuple[int, list[int]]:
    """Encode one group of binary32 words; returns (binary16 scale word, signed codes).

    With ``weights`` (one binary32 word per value) this is MSE_F16_SEARCH_IW_V1, else
    MSE_F16_SEARCH_V1.  Raises :class:`~.oracle.OracleFailure` exactly where
    MAXABS_F16_RECIP_RNE_V1 does (non-finite value, canonical scale overflowing binary16);
    weights must have passed :func:`weight_problem` (the caller names the tensor and column).
    """
    if weights is not None:
        if len(weights) != len(x_words):
            raise ValueError("one weight per value of the group")
        if any(weight_problem(w) for w in weights):
            raise ValueError("weights must be finite binary32 words with the sign bit clear")
    for i, w in enumerate(x_words):
        if (w >> 23) & 0xFF == 0xFF:
            raise OracleFailure(-1, -1, i, float("nan"))
    if max(w & BINARY32.magnitude_mask for w in x_words) == 0:
        return 0x0000, [0] * len(x_words)
    best: tuple[Fraction, int, list[int]] | None = None
    for scale in candidate_scales_reference(x_words, qmin, qmax):
        if scale is None:
            continue
        codes = _codes_for(x_words, scale, qmin, qmax)
        err = group_error_reference(x_words, scale, codes, weights)
        if best is None or err < best[0]:  # strict: the smallest index wins a tie
            best = (err, scale, codes)
    assert best is not None  # candidate 0 (canonical) is always finite here
    return best[1], best[2]


def encode_mse_reference(
    x_words: npt.NDArray[np.uint32],
    group_size: int,
    qmin: int,
    qmax: int,
    weights: npt.NDArray[np.uint32] | None = None,
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.uint16]]:
    """Encode an [N, K] matrix of binary32 words group by group with the reference; with
    ``weights`` ([K] binary32 words, one per column) the importance-weighted profile.

    Raises :class:`~.oracle.OracleFailure` with the row, group (and column) of the first failure.
    """
    if weights is None:
        return encode_matrix(encode_group_mse_reference, x_words, group_size, qmin, qmax)
    per_column = [int(w) for w in np.asarray(weights, dtype=np.uint32).reshape(-1)]
    if len(per_column) != x_words.shape[1]:
        raise ValueError("one weight per column")
    k = x_words.shape[1]
    n_groups = ceil_div(k, group_size)
    # encode_matrix hands each group over without its column; groups are visited row by row,
    # group by group, so the g-th call of a row is group g (columns g*G .. ).
    calls = iter(range(x_words.shape[0] * n_groups))

    def weighted(x: list[int], lo_q: int, hi_q: int) -> tuple[int, list[int]]:
        g = next(calls) % n_groups
        lo = g * group_size
        return encode_group_mse_reference(x, lo_q, hi_q, per_column[lo : lo + len(x)])

    return encode_matrix(weighted, x_words, group_size, qmin, qmax)
