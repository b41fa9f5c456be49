"""Exact reference for the encoder profiles MSE_F16_SEARCH_V1 and MSE_F16_SEARCH_IW_V1
(docs/encoder-profiles.md).

Contract: like :mod:`.oracle`, this module never asks the floating-point unit to round
anything.  Every value it handles is dyadic (an integer times a power of two): binary32 source
values, binary16 scales, their products with integer codes, and every binary64 result of the
error sum.  It computes in integers only: a value is an (integer, exponent) pair; candidate
scales are exact rationals of such pairs rounded once to binary16 (or binary32 for the canonical
raw scale) by integer division with round-half-even, the same rounding as
:func:`~.oracle.round_to_binary`; a group is put on one common exponent so that each code is
one integer division with round-half-even and each residual ``x - s * q`` an exact integer; the
binary64 error accumulation keeps the top 53 bits with an explicit round-to-nearest-even shift
(every intermediate lies far inside binary64's normal range).  A candidate stops as soon as its
running error reaches the best so far: the sum only grows, so it cannot win.  The fast backends
(:mod:`.mse_search`, the C kernel, torch) must match it bit for bit; tests hold it to a literal
Fraction transcription of the document.  About 1.5 ms per 64-value group, for the oracle sample
of verify and for tests, not for converting.

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
from .oracle import BINARY16, BINARY32, OracleFailure, encode_matrix
from .oracle import dyadic32 as _dyadic32

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


def _round_ratio(n: int, d: int, frac_bits: int, emin: int, emax: int) -> int:
    """The magnitude bits (exponent field and trailing fraction) of the RNE rounding of the
    positive rational n / d to the binary format with ``frac_bits`` fraction bits, smallest
    normal exponent ``emin`` and largest ``emax``; overflow gives the infinity bits.  The same
    rounding as :func:`~.oracle.round_to_binary` (tests compare the two), in integers."""
    e = n.bit_length() - d.bit_length()  # floor(log2(n / d)) is e or e - 1
    if (n if e >= 0 else n << -e) < (d << e if e >= 0 else d):
        e -= 1
    e = max(e, emin)
    sh = frac_bits - e  # the quantum is 2^(e - frac_bits)
    m = _div_rne(n << sh, d) if sh >= 0 else _div_rne(n, d << -sh)
    if m == 1 << (frac_bits + 1):  # rounding carried into the next binade
        m >>= 1
        e += 1
    bias = 1 - emin
    if e > emax:
        return (2 * bias + 1) << frac_bits  # the all-ones exponent field, fraction 0
    if m < 1 << frac_bits:  # subnormal (only when e == emin)
        return m
    return ((e + bias) << frac_bits) | (m - (1 << frac_bits))


def _div_rne(n: int, d: int) -> int:
    """round(n / d) ties to even, d > 0, n of any sign (``divmod`` floors)."""
    q, r = divmod(n, d)
    r += r
    if r > d or (r == d and q & 1):
        q += 1
    return q


def _group_scales(x_words: list[int], qmin: int, qmax: int) -> list[int | None]:
    """The candidate scale words of one finite, not all-zero group (None: binary16 infinity);
    raises :class:`~.oracle.OracleFailure` where the canonical profile does."""
    am, ae = _dyadic32(max(w & BINARY32.magnitude_mask for w in x_words))
    # Candidate 0, the canonical scale: RN16(RN32(amax / qmax)), rescued to 2^-24.
    n, d = (am << ae, qmax) if ae >= 0 else (am, qmax << -ae)
    raw32 = _round_ratio(n, d, 23, -126, 127)
    rm, re_ = _dyadic32(raw32)
    scale = (
        _round_ratio(rm << re_, 1, 10, -14, 15)
        if re_ >= 0
        else _round_ratio(rm, 1 << -re_, 10, -14, 15)
    )
    scale = scale or 0x0001
    if scale >> 10 == 0x1F:
        raise OracleFailure(-1, -1, -1, float(Fraction(rm) * Fraction(2) ** re_))
    out: list[int | None] = [scale]
    # Candidates 1..13: RN16(amax / D), D = -qmin, then qmax * c / 32 = (qmax * c) / 32.
    for num, den in [(1, -qmin)] + [(32, qmax * c) for c in CANDIDATE_RATIOS]:
        n, d = (am * num << ae, den) if ae >= 0 else (am * num, den << -ae)
        word = _round_ratio(n, d, 10, -14, 15) or 0x0001  # the Section 7 rescue, every candidate
        out.append(None if word >> 10 == 0x1F else word)
    return out


def candidate_scales_reference(x_words: list[int], qmin: int, qmax: int) -> list[int | None]:
    """The candidate binary16 scale words of one finite, not all-zero group, in index order.

    ``None`` marks a candidate that rounds to binary16 infinity (never chosen).  Raises
    :class:`~.oracle.OracleFailure` where the canonical profile refuses the group.
    """
    return _group_scales(x_words, qmin, qmax)


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


def _search(
    xs: list[int],
    e0: int,
    scale16: int,
    qmin: int,
    qmax: int,
    ws: list[tuple[int, int]] | None,
    bound: tuple[int, int] | None,
) -> tuple[int, int, list[int]] | None:
    """Codes and binary64 error (m, e) of one candidate for the group x_i = xs[i] * 2^e0, or
    None once the running error reaches ``bound`` (the sum only grows: every term is >= 0 and
    RNE is monotone, so such a candidate cannot be strictly smaller).  ``ws``: the weights as
    dyadic pairs (MSE_F16_SEARCH_IW_V1), or None.

    The same arithmetic as :func:`group_error_reference` on one common exponent: with
    s = sm * 2^se and g = min(e0, se), x / s = N / D and x - s * q = (N - D * q) * 2^g.  Every
    intermediate value lies in [2^-298, 2^300] (or is 0), [2^-447, 2^428] with a binary32
    weight, inside binary64's normal range, so RNE64 keeps the top 53 significant bits."""
    sm, se = _dyadic16(scale16)
    shift_x = e0 - se
    if shift_x >= 0:
        nums, den, g = [x << shift_x for x in xs], sm, se
    else:
        nums, den, g = xs, sm << -shift_x, e0
    am, ae = 0, g  # the accumulator, m * 2^e
    codes = []
    for i, n in enumerate(nums):
        q, r = divmod(n, den)
        r += r
        if r > den or (r == den and q & 1):
            q += 1
        q = qmin if q < qmin else qmax if q > qmax else q
        codes.append(q)
        dm = n - den * q
        if not dm:
            continue  # t = 0 and acc + 0 = acc
        de = g
        b = (dm if dm > 0 else -dm).bit_length() - 53
        if b > 0:
            dm, de = _shift_rne(dm, b), de + b
        tm, te = dm * dm, 2 * de
        b = tm.bit_length() - 53
        if b > 0:
            tm, te = _shift_rne(tm, b), te + b
        if ws is not None:  # u = RNE64(w * t)
            wm, we = ws[i]
            if not wm:
                continue
            tm, te = wm * tm, we + te
            b = tm.bit_length() - 53
            if b > 0:
                tm, te = _shift_rne(tm, b), te + b
        if te >= ae:
            am += tm << (te - ae)
        else:
            am, ae = (am << (ae - te)) + tm, te
        b = am.bit_length() - 53
        if b > 0:
            am, ae = _shift_rne(am, b), ae + b
        if bound is not None:
            bm, be = bound
            if (am << (ae - be) >= bm) if ae >= be else (am >= bm << (be - ae)):
                return None
    if bound is not None and not bound[0]:
        return None  # the best so far is exactly 0 and this one is too (every term was 0)
    return am, ae, codes


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
    scales = _group_scales(x_words, qmin, qmax)
    dy = [_dyadic32(w) for w in x_words]
    e0 = min(e for _, e in dy)
    xs = [m << (e - e0) for m, e in dy]
    ws = None if weights is None else [_dyadic32(w) for w in weights]
    best: tuple[int, int, int, list[int]] | None = None
    for scale in scales:
        if scale is None:
            continue
        bound = None if best is None else (best[0], best[1])
        got = _search(xs, e0, scale, qmin, qmax, ws, bound)
        if got is not None:  # strictly smaller than the best so far: the smallest index wins a tie
            best = (got[0], got[1], scale, got[2])
    assert best is not None  # candidate 0 (canonical) is always finite here
    return best[2], best[3]


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
