"""Block-compensated encoding (docs/encoder-profiles.md, "Error compensation across columns"):
:func:`encode_compensated` with the C kernel (``_gptqkernel.c``) or the vectorised numpy
encoder, and the check of its factor.

Contract: both encoders are bit-identical to :mod:`.gptq_reference` for every input, every
compensated value included (tests prove it on a boundary corpus and on generated matrices),
refusing the same rows at the same column for the same reason.  :func:`encode_compensated`
runs the C kernel when it was built (``NINFER_REQUIRE_NATIVE=1`` makes a missing one an
import error, as for the other kernels), else numpy; ``kernel="numpy"`` and
:func:`encode_compensated_numpy` run numpy only.  The C kernel's own argument is in its
source's header.

numpy: rows never interact, so the work is vectorised across rows only: every document step
``RN64(a op b)`` is one elementwise binary64 numpy ufunc over a chunk of rows (numpy never
fuses a multiply and an add, and never reorders elementwise operations), and the column loop
runs in the document's order.  The two steps that are not binary64 arithmetic are exact here
too: numpy's float64 -> float32 cast is one RNE rounding (subnormals, overflow to infinity),
and ``rint(w / s)`` equals the exact ``round_half_even(w / s)`` because a binary64 quotient of
a binary64 ``w`` by a binary16 ``s`` is never moved onto or across a half-integer (the argument
is in the document); adding +0 turns rint's -0 into the integer code 0.

The scale of each group is MSE_F16_SEARCH_V1's choice on the binary32 roundings
(MSE_F16_SEARCH_IW_V1's with importance weights), computed for both encoders by that profile's
own host encoder (:func:`.host.encode_rows`: its C kernel when built, else its numpy encoder;
both write the same bytes).

Memory follows the row chunk: one binary64 copy of :data:`ROW_CHUNK` rows (numpy) or of about
:data:`NATIVE_CHUNK_VALUES` values (C), never the tensor.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError
from ..formats import MSE_F16_SEARCH_IW_V1, MSE_F16_SEARCH_V1, NumericFormat
from ..ieee import BINARY16, BINARY32
from ..layouts.base import ceil_div
from ..logical import GroupedCodes
from ..native import optional_module
from .common import to_f32
from .gptq_reference import BLOCK_UNIT
from .mse_search import check_weights

__all__ = [
    "KERNELS",
    "NATIVE_CHUNK_VALUES",
    "ROW_CHUNK",
    "check_factor",
    "encode_compensated",
    "encode_compensated_numpy",
    "native_available",
]

_native: Any = optional_module("_gptqkernel")  # None when the build skipped it

KERNELS = ("native", "numpy")

ROW_CHUNK = 256
"""Rows per pass of the numpy encoder: with B = 128 a [256, B] binary64 slab (256 KiB) stays
in the L2 cache."""

NATIVE_CHUNK_VALUES = 1 << 20
"""Values per pass of the C kernel (8 MiB of binary64): it walks four rows at a time, so the
chunk only bounds memory and amortises the per-group Python calls."""

CHECK_CHUNK_VALUES = 1 << 18
"""Factor entries per chunk of :func:`check_factor` (its temporaries: a few MiB)."""

_FACTOR_RULES = (
    "is not finite",
    "must be +0 (outside the upper triangle of its block)",
    "must be > +0",
)

_SEARCH, _NONFINITE = 1, 2
_REASONS = {
    _SEARCH: "the scale search refuses the group",
    _NONFINITE: "the compensated value is not finite",
}


def native_available() -> bool:
    """Whether the C kernel (``_gptqkernel.c``) was built."""
    return _native is not None


def check_factor(
    factor: npt.NDArray[np.generic], k: int, tensor: str | None
) -> npt.NDArray[np.uint32]:
    """The factor of a tensor with K columns as contiguous [K, B] binary32 words (B a positive
    multiple of 128), or an :class:`~ninfer_convert.errors.EncodeError` naming the tensor and
    the first bad entry.

    Rules (the document's "Factor"): every entry finite; row i's diagonal entry
    ``F[i, i mod B]`` > +0; every entry left of the diagonal, and right of the block's last
    column in a partial last block, exactly +0 (so that one factor has one spelling)."""
    name = tensor or "<array>"
    f = np.asarray(factor)
    if f.dtype == np.float32:
        f = f.view(np.uint32)
    good = f.ndim == 2 and f.shape[0] == k and f.shape[1] > 0 and f.shape[1] % BLOCK_UNIT == 0
    if f.dtype != np.uint32 or not good:
        raise EncodeError(
            f"tensor {name}: the compensation factor must be [K, B] binary32 words with "
            f"K = {k} and B a positive multiple of {BLOCK_UNIT}, got {f.dtype} with shape "
            f"{list(f.shape)}",
            hint="recompute the factor file with ninfer calibrate for this source",
        )
    block = f.shape[1]
    col = np.arange(block)[None, :]
    # Rule by rule, then row-major (the first entry of the first rule broken), over chunks of
    # rows so that the temporaries stay about CHECK_CHUNK_VALUES entries, not K x B.
    rows = max(1, CHECK_CHUNK_VALUES // block)
    for rule, why in enumerate(_FACTOR_RULES):
        for r0 in range(0, k, rows):
            part = f[r0 : r0 + rows]
            row = np.arange(r0, r0 + part.shape[0])[:, None]
            diag_c = row % block
            if rule == 0:
                bad = (part & np.uint32(BINARY32.magnitude_mask)) >= np.uint32(BINARY32.exp_mask)
            elif rule == 1:
                width = np.minimum(block, k - (row - diag_c))  # columns of row i's block
                bad = ((col < diag_c) | (col >= width)) & (part != 0)
            else:
                bad = (col == diag_c) & ((part >= np.uint32(BINARY32.sign_mask)) | (part == 0))
            if bad.any():
                i, c = (int(v) for v in np.argwhere(bad)[0])
                raise EncodeError(
                    f"tensor {name}: compensation factor entry [{r0 + i}, {c}] (binary32 word "
                    f"0x{int(part[i, c]):08X}) {why}",
                    hint="recompute the factor file with ninfer calibrate for this source",
                )
    return np.ascontiguousarray(f)


def _refusal(tensor: str | None, row: int, column: int, reason: str, weighted: bool) -> EncodeError:
    plain = MSE_F16_SEARCH_IW_V1 if weighted else MSE_F16_SEARCH_V1
    return EncodeError(
        f"tensor {tensor or '<array>'}: row {row}, column {column}: {reason} under error "
        "compensation",
        hint="check the source values and the compensation factor (ninfer calibrate); "
        f"{plain} encodes the tensor without compensation",
    )


def _search(
    v: npt.NDArray[np.uint32],
    fmt: NumericFormat,
    g0: int,
    weights: npt.NDArray[np.uint32] | None,
) -> npt.NDArray[np.uint16]:
    """The scale words [n] that the search profile chooses for the binary32 groups ``v``
    [n, width] (columns g0 .. g0 + width - 1; every value finite, no canonical scale
    overflowing): one search for both kernels, the profile's own host encoder."""
    from .host import encode_rows  # the scale search: MSE_F16_SEARCH_V1's host encoder

    n, width = v.shape
    s_words = np.empty((n, 1), dtype=np.uint16)
    c_scratch = np.empty((n, width), dtype=np.int8)
    encode_rows(
        v, "F32", fmt, 0, c_scratch, s_words, None,
        profile=MSE_F16_SEARCH_V1 if weights is None else MSE_F16_SEARCH_IW_V1,
        importance=None if weights is None else np.ascontiguousarray(weights[g0 : g0 + width]),
    )  # fmt: skip
    return s_words.reshape(n)


def _group_scale(
    values: npt.NDArray[np.float64],
    fmt: NumericFormat,
    g0: int,
    failed: npt.NDArray[np.int64],
    reason: npt.NDArray[np.int8],
    weights: npt.NDArray[np.uint32] | None,
) -> npt.NDArray[np.uint16]:
    """The scale word [n] of the group starting at column ``g0`` from its current values
    [n, g1 - g0]: the search profile's choice on their binary32 roundings.  Rows whose group
    the search refuses are marked in ``failed``/``reason`` (their word is meaningless)."""
    assert fmt.qmax is not None
    with np.errstate(over="ignore", invalid="ignore"):
        v = values.astype(np.float32)  # RN32, overflow to infinity
    bits = v.view(np.uint32) & np.uint32(BINARY32.magnitude_mask)
    amax = bits.max(axis=1).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        canonical = (amax / np.float32(fmt.qmax)).astype(np.float16)
    refuse = (bits.max(axis=1) >= np.uint32(BINARY32.exp_mask)) | (
        canonical.view(np.uint16) >= np.uint16(BINARY16.exp_mask)
    )
    new = refuse & (failed < 0)
    failed[new] = g0
    reason[new] = _SEARCH
    v[failed >= 0] = 0.0  # refused rows: any finite stand-in, the result is discarded
    return _search(np.ascontiguousarray(v).view(np.uint32), fmt, g0, weights)


def _encode_chunk(
    x: npt.NDArray[np.float64],
    f64: npt.NDArray[np.float64],
    fmt: NumericFormat,
    codes: npt.NDArray[np.int8],
    scales: npt.NDArray[np.uint16],
    failed: npt.NDArray[np.int64],
    reason: npt.NDArray[np.int8],
    trace: npt.NDArray[np.float64] | None,
    weights: npt.NDArray[np.uint32] | None,
) -> None:
    """Encode the rows ``x`` [n, K] in place of ``codes``/``scales`` with numpy; rows the
    document refuses get their first failing column in ``failed`` (-1: none) and why in
    ``reason`` (:data:`_REASONS`).  ``trace`` [n, K], when given, receives each value at the
    moment its code is chosen."""
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = x.shape
    w = x  # updated in place, column by column
    q = np.empty(n, dtype=np.float64)
    d = np.empty(n, dtype=np.float64)
    e = np.empty(n, dtype=np.float64)
    block = f64.shape[1]
    tmp = np.empty((n, block), dtype=np.float64)
    for b0 in range(0, k, block):
        b1 = min(k, b0 + block)
        for g0 in range(b0, b1, g):
            g1 = min(b1, g0 + g)
            s_words = _group_scale(w[:, g0:g1], fmt, g0, failed, reason, weights)
            scales[:, g0 // g] = s_words
            s = s_words.view(np.float16).astype(np.float64)
            live = s > 0
            for i in range(g0, g1):
                col = w[:, i]
                if trace is not None:
                    trace[:, i] = col
                bad = ~np.isfinite(col) & (failed < 0)
                failed[bad] = i
                reason[bad] = _NONFINITE
                q.fill(0.0)
                with np.errstate(invalid="ignore", over="ignore"):
                    np.divide(col, s, out=q, where=live)
                    np.rint(q, out=q)
                    np.clip(q, fmt.qmin, fmt.qmax, out=q)
                    # the code is an integer: +0, never rint's -0 (then s * q is the
                    # document's exact +0 and d keeps the sign of w)
                    np.add(q, 0.0, out=q)
                if (failed >= 0).any():  # NaN only in refused rows, whose codes are dropped
                    q[failed >= 0] = 0.0
                codes[:, i] = q
                with np.errstate(invalid="ignore", over="ignore"):
                    np.multiply(q, s, out=d)  # exact: s * q has at most 15 significant bits
                    np.subtract(col, d, out=d)
                    np.divide(d, f64[i, i - b0], out=e)
                    if i + 1 < b1:
                        c0, c1 = i + 1 - b0, b1 - b0
                        t = tmp[:, : c1 - c0]
                        np.multiply(e[:, None], f64[i, c0:c1][None, :], out=t)
                        np.subtract(w[:, i + 1 : b1], t, out=w[:, i + 1 : b1])


def _encode_chunk_native(
    x: npt.NDArray[np.float64],
    fwords: npt.NDArray[np.uint32],
    fmt: NumericFormat,
    codes: npt.NDArray[np.int8],
    scales: npt.NDArray[np.uint16],
    failed: npt.NDArray[np.int64],
    reason: npt.NDArray[np.int8],
    trace: npt.NDArray[np.float64] | None,
    weights: npt.NDArray[np.uint32] | None,
) -> None:
    """:func:`_encode_chunk` with the C kernel (``_gptqkernel.c``): per group, the binary32
    values and the search's refusals, the search (:func:`_search`), then the group's columns;
    the same results, failures and trace."""
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = x.shape
    block = fwords.shape[1]
    v = np.empty((n, g), dtype=np.uint32)
    for g0 in range(0, k, g):  # blocks are multiples of g: these are each block's groups
        width = min(k, g0 + g) - g0
        vg = v if width == g else np.empty((n, width), dtype=np.uint32)
        _native.group_values(x, n, k, g0, g, fmt.qmax, failed, reason, vg)
        s_words = _search(vg, fmt, g0, weights)
        scales[:, g0 // g] = s_words
        _native.group_columns(
            x, n, k, fwords, block, g0, g, fmt.qmin, fmt.qmax, s_words, codes, failed, reason,
            trace,
        )  # fmt: skip


def encode_compensated(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    factor: npt.NDArray[np.generic],
    *,
    tensor: str | None = None,
    row_chunk: int | None = None,
    row0: int = 0,
    trace: npt.NDArray[np.float64] | None = None,
    weights: npt.NDArray[np.generic] | None = None,
    kernel: str = "native",
    checked: bool = False,
) -> GroupedCodes:
    """Encode an [N, K] matrix of source words with its [K, B] factor (checked here);
    ``weights`` ([K] binary32 importance words, checked here) weight the scale search.
    ``checked``: the factor and weights are the words :func:`check_factor` and
    ``check_weights`` already returned for this K (a plan entry's attached ones), so a caller
    that encodes a tensor block by block does not check them again for every block.
    ``trace`` ([N, K] C-contiguous float64, for tests) receives the compensated value each code
    was chosen from, so that parity can be checked on every intermediate, not only on codes.
    ``kernel`` "native" runs the C kernel (``_gptqkernel.c``) when it was built, "numpy" (or
    a build without it) the numpy encoder: the same bytes, trace and refusals.  ``row_chunk``
    rows are encoded at a time (default: :data:`ROW_CHUNK` for numpy, about
    :data:`NATIVE_CHUNK_VALUES` values for the C kernel).  A refusal names its row counted
    from ``row0`` (the tensor row of ``words``' first row, for callers that encode blocks)."""
    assert fmt.group_size is not None
    if kernel not in KERNELS:
        raise ValueError(f"unknown compensation kernel {kernel!r} (known: {', '.join(KERNELS)})")
    native = kernel == "native" and _native is not None
    n, k = words.shape
    if checked:
        fwords = cast("npt.NDArray[np.uint32]", factor)
        wts = None if weights is None else cast("npt.NDArray[np.uint32]", weights)
    else:
        fwords = check_factor(factor, k, tensor)
        wts = None if weights is None else check_weights(weights, k, tensor)
    f64 = None if native else fwords.view(np.float32).astype(np.float64)
    if trace is not None and (
        trace.dtype != np.float64 or trace.shape != (n, k) or not trace.flags.c_contiguous
    ):
        raise ValueError(f"trace must be a C-contiguous float64 array of shape {[n, k]}")
    if row_chunk is None:
        row_chunk = max(1, NATIVE_CHUNK_VALUES // k) if native else ROW_CHUNK
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, ceil_div(k, fmt.group_size)), dtype=np.uint16)
    for r0 in range(0, n, row_chunk):
        r1 = min(n, r0 + row_chunk)
        x = to_f32(np.ascontiguousarray(words[r0:r1]), source_dtype).astype(np.float64)
        failed = np.full(r1 - r0, -1, dtype=np.int64)
        reason = np.zeros(r1 - r0, dtype=np.int8)
        part = None if trace is None else trace[r0:r1]
        if native:
            _encode_chunk_native(
                x, fwords, fmt, codes[r0:r1], scales[r0:r1], failed, reason, part, wts
            )
        else:
            assert f64 is not None
            _encode_chunk(x, f64, fmt, codes[r0:r1], scales[r0:r1], failed, reason, part, wts)
        if (failed >= 0).any():
            r = int(np.flatnonzero(failed >= 0)[0])
            raise _refusal(
                tensor, row0 + r0 + r, int(failed[r]), _REASONS[int(reason[r])], wts is not None
            )
    return GroupedCodes(codes, scales)


def encode_compensated_numpy(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    factor: npt.NDArray[np.generic],
    *,
    tensor: str | None = None,
    row_chunk: int = ROW_CHUNK,
    trace: npt.NDArray[np.float64] | None = None,
    weights: npt.NDArray[np.generic] | None = None,
) -> GroupedCodes:
    """:func:`encode_compensated` with the numpy encoder only (the baseline of tests and
    benchmarks)."""
    return encode_compensated(
        words, source_dtype, fmt, factor, tensor=tensor, row_chunk=row_chunk, trace=trace,
        weights=weights, kernel="numpy",
    )  # fmt: skip
