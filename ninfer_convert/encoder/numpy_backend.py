"""Production host encoder for MAXABS_F16_RECIP_RNE_V1, vectorised numpy (spec Section 7).

Contract: bit-identical to :mod:`.oracle` for every finite input (tests prove it on the
boundary corpus and on generated matrices).  Why plain numpy arithmetic is exact here: numpy's
float32 ``/`` and ``*`` are single IEEE-754 operations rounded to nearest-even (numpy never
enables flush-to-zero or fast-math), float32 -> float16 ``astype`` rounds to nearest-even with
subnormals and overflows to inf, float16 -> float32 is exact, and ``np.rint`` rounds ties to
even.  Each step of Section 7 is one such operation, in the spec's order.

Memory is bounded: rows are processed in chunks of about ``CHUNK_ELEMENTS`` values (sized to
stay in the L2 cache), so the temporaries never scale with the tensor.  Chunks are spread over
``threads`` worker threads; numpy releases the GIL inside every ufunc used here.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from ..formats import NumericFormat
from ..logical import GroupedCodes
from .common import locate_nonfinite, nonfinite_error, overflow_error, to_f32

__all__ = ["CHUNK_ELEMENTS", "encode_numpy"]

CHUNK_ELEMENTS = 1 << 16
"""Source values per chunk: 256 KiB of binary32, a few such temporaries fit in L2."""


def _encode_rows(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    row0: int,
    codes_out: npt.NDArray[np.int8],
    scales_out: npt.NDArray[np.uint16],
    tensor: str | None,
) -> None:
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = words.shape
    n_groups = -(-k // g)
    x = to_f32(words, source_dtype)
    if k % g:
        # Zero-fill the partial last group: |0| never raises amax, and the codes computed for
        # the fill are dropped, so the group is computed from its logical values only.
        padded = np.zeros((n, n_groups * g), dtype=np.float32)
        padded[:, :k] = x
        x = padded
    xg = x.reshape(n, n_groups, g)
    # amax via max and -min avoids a full-size abs temporary; NaN propagates through both.
    amax = np.maximum(xg.max(axis=2), np.negative(xg.min(axis=2)))
    # max(+0, -(+0)) may pick -0.0 for an all-zero group; abs on the small per-group array
    # restores +0 so the scale word is 0x0000, never 0x8000.
    np.abs(amax, out=amax)
    finite = np.isfinite(amax)
    if not finite.all():
        r, grp, col = locate_nonfinite(x[:, :k], row0, g)
        word = int(np.asarray(words)[r - row0, col])
        raise nonfinite_error(tensor, r, grp, col, word, source_dtype)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        raw_scale32 = amax / np.float32(fmt.qmax)
        scale16 = raw_scale32.astype(np.float16)
    bits = scale16.view(np.uint16)
    # 2^-24 rescue: a nonzero amax whose scale rounded to +0 gets the smallest subnormal.
    bits[(bits == 0) & (amax > 0)] = 0x0001
    overflow = bits == 0x7C00
    if overflow.any():
        r, grp = (int(i) for i in np.argwhere(overflow)[0])
        raise overflow_error(tensor, row0 + r, grp, float(raw_scale32[r, grp]))
    scale32 = scale16.astype(np.float32)
    # All-zero groups keep inv = 0 so their codes come out 0 without a 0 * inf NaN.
    inv32 = np.zeros_like(scale32)
    np.divide(np.float32(1.0), scale32, out=inv32, where=scale32 > 0)
    q = np.multiply(xg, inv32[:, :, None])
    np.rint(q, out=q)
    np.clip(q, fmt.qmin, fmt.qmax, out=q)
    codes_out[:, :] = q.reshape(n, n_groups * g)[:, :k]
    scales_out[:, :] = bits


def encode_numpy(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    *,
    tensor: str | None = None,
    threads: int = 2,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> GroupedCodes:
    assert fmt.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // fmt.group_size)), dtype=np.uint16)
    rows = max(1, chunk_elements // k)
    starts = range(0, n, rows)

    def run(r0: int) -> None:
        r1 = min(n, r0 + rows)
        _encode_rows(words[r0:r1], source_dtype, fmt, r0, codes[r0:r1], scales[r0:r1], tensor)

    if threads <= 1 or len(starts) == 1:
        for r0 in starts:
            run(r0)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            # list() re-raises the first worker exception in chunk order (deterministic).
            list(pool.map(run, starts))
    return GroupedCodes(codes=codes, scales=scales)
