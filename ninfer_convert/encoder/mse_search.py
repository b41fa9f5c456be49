"""Host encoder for the profiles MSE_F16_SEARCH_V1 and MSE_F16_SEARCH_IW_V1, vectorised numpy
(docs/encoder-profiles.md).

Contract: bit-identical to :mod:`.mse_reference` for every input (tests prove it on the
profile's boundary corpus and on generated matrices), and it refuses exactly the groups that
MAXABS_F16_RECIP_RNE_V1 refuses, with the same messages, because it starts from the canonical
per-block encoder (:func:`.numpy_backend._encode_rows`), whose scale is candidate 0.

Why plain numpy arithmetic is exact here (the arguments are spelled out in the document):

* a candidate's raw scale is ``binary64(amax) * 32 / (qmax * c)`` or ``amax / |qmin|``: the
  numerator is exact in binary64, the division is one IEEE binary64 rounding, and because the
  denominator is an integer below 2^41 that rounding can never land on, or cross, a binary16
  rounding boundary; numpy's float64 -> float16 cast is then one correct RNE rounding, so the
  result is the single rounding of the exact rational;
* a code is ``rint(binary64(x) / binary64(s))`` clamped: for the same reason the binary64
  quotient is never moved onto or across a half-integer, so this is the exact nearest code with
  ties to even;
* the error is the document's binary64 sum, written as the same IEEE operations in the same
  order: the block is held group-major ([G, groups]), so ``acc = acc + t[i]`` for i = 0, 1, ...
  is one contiguous binary64 ``np.add`` per value index (never ``np.sum``, whose pairwise
  order differs), and numpy ufuncs never fuse a multiply and an add.

With importance weights (MSE_F16_SEARCH_IW_V1) each squared difference is multiplied by its
column's weight, widened exactly from binary32, in one more binary64 ``np.multiply`` before it
is added; weights are checked first by :func:`check_weights` (finite, sign bit clear).

Memory follows the block (a few float64 temporaries of :data:`CHUNK_ELEMENTS` values), never
the tensor.  The converter runs the profile's C kernel (``_msekernel.c``, dispatched by
:func:`.host.encode_rows`) when it was built and this encoder otherwise; both write the same
bytes.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError
from ..formats import MSE_F16_SEARCH_IW_V1, NumericFormat
from ..ieee import BINARY16, BINARY32
from ..layouts.base import ceil_div
from ..logical import GroupedCodes
from .common import to_f32
from .mse_reference import CANDIDATE_RATIOS, weight_problem
from .numpy_backend import _encode_rows, encode_chunked

__all__ = [
    "CHUNK_ELEMENTS",
    "check_weights",
    "encode_mse_numpy",
    "encode_rows_mse",
    "group_errors",
]


def check_weights(
    weights: npt.NDArray[np.generic], k: int, tensor: str | None
) -> npt.NDArray[np.uint32]:
    """The importance vector of a tensor with K columns as contiguous binary32 words, or an
    :class:`~ninfer_convert.errors.EncodeError` naming the tensor and the first bad column."""
    name = tensor or "<array>"
    w = np.asarray(weights)
    if w.dtype == np.float32:
        w = w.view(np.uint32)
    if w.dtype != np.uint32 or w.ndim != 1:
        raise EncodeError(
            f"tensor {name}: the importance vector must be one-dimensional binary32 "
            f"(float32 or uint32 words), got {w.dtype} with shape {list(w.shape)}",
            hint=f"{MSE_F16_SEARCH_IW_V1} takes one binary32 weight per input column",
        )
    if w.shape[0] != k:
        raise EncodeError(
            f"tensor {name}: the importance vector has {w.shape[0]} weights but the matrix "
            f"has K = {k} columns",
            hint="the vector must have one weight per column of the [N, K] matrix the "
            "encoder sees (after the rule's transforms)",
        )
    exp = np.uint32(BINARY32.exp_mask)
    bad = (w >= np.uint32(BINARY32.sign_mask)) | ((w & exp) == exp)
    if bad.any():
        col = int(np.argmax(bad))
        word = int(w[col])
        raise EncodeError(
            f"tensor {name}: importance weight of column {col} (binary32 word 0x{word:08X}) "
            f"{weight_problem(word)}",
            hint=f"{MSE_F16_SEARCH_IW_V1} weights must be finite and >= +0; recompute the "
            "importance file (ninfer calibrate) or fix that entry",
        )
    return np.ascontiguousarray(w)


CHUNK_ELEMENTS = 1 << 16
"""Source values per block: 14 candidates each need several float64 temporaries."""


def _candidates(
    amax64: npt.NDArray[np.float64], canonical: npt.NDArray[np.uint16], fmt: NumericFormat
) -> npt.NDArray[np.uint16]:
    """Candidate binary16 words [n, groups, 14]; 0x7C00 marks a candidate that is infinite."""
    assert fmt.qmin is not None and fmt.qmax is not None
    denominators = [float(-fmt.qmin)] + [float(fmt.qmax * c) for c in CANDIDATE_RATIOS]
    numerators = [1.0] + [32.0] * len(CANDIDATE_RATIOS)
    out = np.empty((*amax64.shape, 1 + len(denominators)), dtype=np.uint16)
    out[..., 0] = canonical
    with np.errstate(over="ignore"):
        for j, (num, den) in enumerate(zip(numerators, denominators, strict=True), start=1):
            raw = (amax64 * num) / den  # *32 is exact; one binary64 rounding in the division
            out[..., j] = raw.astype(np.float16).view(np.uint16)
    out[(out == 0) & (amax64 > 0)[..., None]] = 0x0001  # the Section 7 rescue, per candidate
    return out


def group_errors(
    xt: npt.NDArray[np.float64],
    s: npt.NDArray[np.float64],
    fmt: NumericFormat,
    q: npt.NDArray[np.float64],
    t: npt.NDArray[np.float64],
    acc: npt.NDArray[np.float64],
    wt: npt.NDArray[np.float64] | None = None,
) -> None:
    """For groups stored column-wise, ``xt`` [G, m] (column j is group j), and scales ``s`` [m]:
    the nearest codes into ``q`` [G, m] and the document's binary64 error of each group into
    ``acc`` [m] (``t`` is scratch).  ``wt`` [G, m] are the widened importance weights of the
    same positions (MSE_F16_SEARCH_IW_V1).  Group-major rows keep every operation contiguous."""
    assert fmt.qmin is not None and fmt.qmax is not None
    np.divide(xt, s, out=q)
    np.rint(q, out=q)
    np.maximum(q, fmt.qmin, out=q)
    np.minimum(q, fmt.qmax, out=q)
    np.multiply(q, s, out=t)  # s * q: exact (at most 19 significant bits)
    np.subtract(xt, t, out=t)
    np.multiply(t, t, out=t)
    if wt is not None:
        np.multiply(wt, t, out=t)  # u = round_f64(w64 * t): one more binary64 rounding
    # acc = +0; acc = acc + t[i] for i = 0, 1, ... in index order (+0 + t[0] is t[0] exactly).
    np.copyto(acc, t[0])
    for i in range(1, t.shape[0]):
        np.add(acc, t[i], out=acc)


def encode_rows_mse(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    row0: int,
    codes_out: npt.NDArray[np.int8],
    scales_out: npt.NDArray[np.uint16],
    tensor: str | None,
    weights: npt.NDArray[np.uint32] | None = None,
) -> None:
    """Encode a block of rows (tensor rows from ``row0``) into the outputs; same signature and
    refusals as :func:`.numpy_backend._encode_rows`.  Works through the block in pieces of
    about :data:`CHUNK_ELEMENTS` values so that the float64 temporaries stay in cache.
    ``weights`` ([K] binary32 words that passed :func:`check_weights`) select
    MSE_F16_SEARCH_IW_V1."""
    n, k = words.shape
    rows = max(1, CHUNK_ELEMENTS // k)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        _encode_piece(
            words[r0:r1], source_dtype, fmt, row0 + r0, codes_out[r0:r1], scales_out[r0:r1],
            tensor, weights,
        )  # fmt: skip


def _encode_piece(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    row0: int,
    codes_out: npt.NDArray[np.int8],
    scales_out: npt.NDArray[np.uint16],
    tensor: str | None,
    weights: npt.NDArray[np.uint32] | None,
) -> None:
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = words.shape
    n_groups = ceil_div(k, g)
    m = n * n_groups
    # Candidate 0 and every refusal come from the canonical encoder.
    _encode_rows(words, source_dtype, fmt, row0, codes_out, scales_out, tensor)
    canonical = scales_out.reshape(m).copy()
    x32 = to_f32(np.ascontiguousarray(words), source_dtype)
    x = np.zeros((n, n_groups * g), dtype=np.float64)
    x[:, :k] = x32  # +0 fill of a partial group adds exactly +0 to every error sum
    xt = np.ascontiguousarray(x.reshape(m, g).T)  # [G, m]: row i holds value i of every group
    del x
    wt: npt.NDArray[np.float64] | None = None
    if weights is not None:
        w64 = np.zeros(n_groups * g, dtype=np.float64)  # exact widening; +0 pads (t is +0)
        w64[:k] = weights.view(np.float32)
        wt = np.ascontiguousarray(np.tile(w64.reshape(n_groups, g).T, (1, n)))  # [G, m]
    amax64 = np.abs(xt).max(axis=0)
    cands = _candidates(amax64, canonical, fmt)
    best_err = np.full(m, np.inf)
    best_scale = np.zeros(m, dtype=np.uint16)
    q = np.empty_like(xt)
    t = np.empty_like(xt)
    err = np.empty(m, dtype=np.float64)
    live = amax64 > 0
    better = np.empty(m, dtype=bool)
    for j in range(cands.shape[-1]):
        word = cands[:, j]
        usable = live & (word < BINARY16.exp_mask)
        s = word.view(np.float16).astype(np.float64)
        s[~usable] = 1.0  # placeholder; these groups never take this candidate
        group_errors(xt, s, fmt, q, t, err, wt)
        np.less(err, best_err, out=better)  # strict: the smallest index wins a tie
        better &= usable
        np.copyto(best_err, err, where=better)
        np.copyto(best_scale, word, where=better)
    # The chosen candidate's codes, recomputed by the same statements (cheaper than keeping the
    # best codes through the search).  All-zero groups were never updated: +0 scale, and their
    # values are all zero, so their codes are zero whatever placeholder divides them.
    s = best_scale.view(np.float16).astype(np.float64)
    s[~live] = 1.0
    group_errors(xt, s, fmt, q, t, err)
    scales_out[:, :] = best_scale.reshape(n, n_groups)
    codes_out[:, :] = q.T.reshape(n, n_groups * g)[:, :k]


def encode_mse_numpy(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    *,
    tensor: str | None = None,
    threads: int = 2,
    chunk_elements: int = CHUNK_ELEMENTS,
    weights: npt.NDArray[np.generic] | None = None,
) -> GroupedCodes:
    """Encode a whole matrix; ``weights`` (checked here) select MSE_F16_SEARCH_IW_V1."""
    encoder = encode_rows_mse
    if weights is not None:
        encoder = partial(encode_rows_mse, weights=check_weights(weights, words.shape[1], tensor))
    return encode_chunked(
        encoder, words, source_dtype, fmt,
        tensor=tensor, threads=threads, chunk_elements=chunk_elements,
    )  # fmt: skip
