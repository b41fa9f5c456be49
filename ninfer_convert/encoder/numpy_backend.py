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

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from ..formats import NumericFormat
from ..ieee import BFLOAT16, BINARY16, BINARY32
from ..layouts.base import ceil_div
from ..logical import GroupedCodes
from .common import locate_nonfinite, nonfinite_error, overflow_error, to_f32

__all__ = ["CHUNK_ELEMENTS", "encode_numpy"]

CHUNK_ELEMENTS = 1 << 18
"""Source values per chunk (1 MiB of binary32 per temporary): measured fastest on 2 cores."""


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
    n_groups = ceil_div(k, g)
    if source_dtype == "F16":
        words = to_f32(words, "F16").view(np.uint32)  # exact widening, then as F32
    wide = words.dtype.itemsize == 4
    if k % g:
        # Zero-fill the partial last group: +0 never raises amax, and the codes computed for
        # the fill are dropped, so the group is computed from its logical values only.
        padded = np.zeros((n, n_groups * g), dtype=words.dtype)
        padded[:, :k] = words
        words = padded
    # amax on the integer words: for IEEE formats, clearing the sign bit leaves a word whose
    # unsigned order is the order of |x| (inf and NaN above every finite magnitude).  An
    # integer max is several times faster than a float reduction and cannot produce -0.0.
    sign_clear = np.uint32(BINARY32.magnitude_mask) if wide else np.uint16(BFLOAT16.magnitude_mask)
    amax_bits = np.bitwise_and(words, sign_clear).reshape(n, n_groups, g).max(axis=2)
    if wide:
        nonfinite = amax_bits >= np.uint32(BINARY32.exp_mask)
        amax = amax_bits.view(np.float32)
    else:  # BF16
        nonfinite = amax_bits >= np.uint16(BFLOAT16.exp_mask)
        amax = np.left_shift(amax_bits.astype(np.uint32), np.uint32(16)).view(np.float32)
    if nonfinite.any():
        x = to_f32(words, "F32" if wide else "BF16")
        r, grp, col = locate_nonfinite(x[:, :k], row0, g)
        raise nonfinite_error(
            tensor, r, grp, col, _source_word(words, r - row0, col, source_dtype), source_dtype
        )
    with np.errstate(over="ignore"):
        raw_scale32 = amax / np.float32(fmt.qmax)
        scale16 = raw_scale32.astype(np.float16)
    bits = scale16.view(np.uint16)
    # 2^-24 rescue: a nonzero amax whose scale rounded to +0 gets the smallest subnormal.
    bits[(bits == 0) & (amax_bits > 0)] = 0x0001
    overflow = bits == BINARY16.exp_mask
    if overflow.any():
        r, grp = (int(i) for i in np.argwhere(overflow)[0])
        raise overflow_error(tensor, row0 + r, grp, float(raw_scale32[r, grp]))
    scale32 = scale16.astype(np.float32)
    # All-zero groups keep inv = 0 so their codes come out 0 without a 0 * inf NaN.
    inv32 = np.zeros_like(scale32)
    np.divide(np.float32(1.0), scale32, out=inv32, where=scale32 > 0)
    x = to_f32(words, "F32" if wide else "BF16").reshape(n, n_groups, g)
    q = np.multiply(x, inv32[:, :, None])
    # Section 7 clamps after rounding; since rint is monotone and qmin, qmax are integers,
    # clamp(rint(v)) == rint(clamp(v)), which lets rint write the int8 codes in the same pass.
    # The clamp must happen on the floats: with a subnormal binary16 scale (few significant
    # bits) x * inv can exceed qmax by far, and an int8 cast would wrap.
    np.clip(q, fmt.qmin, fmt.qmax, out=q)
    if k % g:
        codes_out[:, :] = np.rint(q).reshape(n, n_groups * g)[:, :k]
    else:
        np.rint(q.reshape(n, k), out=codes_out, casting="unsafe")
    scales_out[:, :] = bits


def _source_word(words: npt.NDArray[np.generic], r: int, c: int, source_dtype: str) -> int:
    word = int(words[r, c])
    if source_dtype == "F16":  # widened above; report the original binary16 word
        return int(
            np.array([word], np.uint32).view(np.float32).astype(np.float16).view(np.uint16)[0]
        )
    return word


RowBlockEncoder = Callable[
    [
        npt.NDArray[np.generic],
        str,
        NumericFormat,
        int,
        npt.NDArray[np.int8],
        npt.NDArray[np.uint16],
        str | None,
    ],
    None,
]
"""(words, source dtype, format, first row, codes out, scales out, tensor) -> None."""


def encode_chunked(
    encode_rows: RowBlockEncoder,
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    *,
    tensor: str | None,
    threads: int,
    chunk_elements: int,
) -> GroupedCodes:
    """Run ``encode_rows`` over row chunks of about ``chunk_elements`` values on ``threads``."""
    assert fmt.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, ceil_div(k, fmt.group_size)), dtype=np.uint16)
    rows = max(1, chunk_elements // k)
    starts = range(0, n, rows)

    def run(r0: int) -> None:
        r1 = min(n, r0 + rows)
        encode_rows(words[r0:r1], source_dtype, fmt, r0, codes[r0:r1], scales[r0:r1], tensor)

    if threads <= 1 or len(starts) == 1:
        for r0 in starts:
            run(r0)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            # list() re-raises the first worker exception in chunk order (deterministic).
            list(pool.map(run, starts))
    return GroupedCodes(codes=codes, scales=scales)


def encode_numpy(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    *,
    tensor: str | None = None,
    threads: int = 2,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> GroupedCodes:
    return encode_chunked(
        _encode_rows, words, source_dtype, fmt,
        tensor=tensor, threads=threads, chunk_elements=chunk_elements,
    )  # fmt: skip
