"""MAXABS_F16_RECIP_RNE_V1 in torch: one device-agnostic code path for CPU (CI) and CUDA.

Contract: bit-identical to :mod:`.oracle`.  Each Section 7 step is one IEEE-754 operation with
round-to-nearest-even and no flush-to-zero on both CPU and CUDA builds of torch:

* binary32 ``torch.div(tensor, tensor)``: CPU uses IEEE division; CUDA compiles ``a / b`` to
  ``div.rn.f32`` (torch is not built with fast-math).  Both operands are *device tensors* on
  purpose: ATen's CUDA true-divide rewrites a division by a CPU scalar as a multiplication by
  the scalar's reciprocal, which is exactly the substitution Section 7 forbids.
* binary32 ``mul``: ``mul.rn.f32``; there is no add to contract into an FMA.
* float32 -> float16 ``.to``: ``__float2half_rn`` on CUDA, F16C/``fp16_ieee_from_fp32_value`` on
  CPU; both round to nearest-even, produce subnormals and overflow to inf.
* float16 -> float32: exact widening.
* ``torch.round``: round half to even (``nearbyint`` under the default rounding mode).
Parity with the oracle on the Section 12 boundary corpus is checked by the tests and, on CUDA,
by the converter's parity gate before the first GPU-encoded tensor.

Chunk pipeline (:func:`encode_torch`): rows are encoded in chunks, alternating between two
slots of a :class:`~.staging.ChunkStager`; the loop issues chunk ``i``'s encode and download,
then chunk ``i + 1``'s upload, then collects chunk ``i - 1``.  The loop is the same on every
device, so CPU runs (CI) exercise its ordering, slot reuse and row offsets; only the stager
differs.  On CUDA (:class:`~.staging.CudaStager`) the host copies chunk ``i + 1`` into a
pinned buffer and a copy stream uploads it while the caller's stream encodes chunk ``i`` and a
download stream brings chunk ``i - 1``'s codes and scale words into pinned output buffers.
Why this is safe, in short (the stager's docstring has every event): the encode waits for its
upload's event; a pinned input is refilled only after the host synchronized the event recorded
after the copy that read it; a device input is overwritten only after the copy stream waited
for the event recorded after the encode that read it; a download waits for its encode's event;
the host reads a pinned output only after synchronizing its download's event, and result
tensors are referenced until then; when the last chunk is collected no copy or kernel of the
call is pending, and on an error every stream is drained before the exception propagates.
On the CPU (:class:`~.staging.HostStager`) nothing is pinned and no stream or event exists.

Errors stay exact and deterministic without a host sync per chunk: each chunk downloads a
one-byte flag (a non-finite group maximum or a binary16 overflow) with its codes; chunks are
collected strictly in order, and a flagged chunk is re-encoded unstaged and checked with the
original checks, so the error (row, column, group, word or raw scale) is the one the chunk
itself produces: the first non-finite value in row-major order, else the first overflowing
group.  Results are identical for any chunk size; which of two failures in different rows is
reported depends on the chunking only when a chunk holds both kinds (non-finite wins within a
chunk, as in the numpy backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError
from ..formats import NumericFormat
from ..ieee import BINARY16
from ..layouts.base import ceil_div
from ..logical import GroupedCodes
from .common import nonfinite_error, overflow_error

if TYPE_CHECKING:
    from .staging import ChunkStager

__all__ = ["encode_mse_torch", "encode_torch"]

CHUNK_ELEMENTS_CPU = 1 << 18
CHUNK_ELEMENTS_CUDA = 1 << 26


def _encode_chunk(x: Any, fmt: NumericFormat) -> tuple[Any, Any, Any, Any]:
    """Encode float32 rows [n, K] on their device; returns (codes, scale bits, amax, raw)."""
    import torch

    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = x.shape
    n_groups = ceil_div(k, g)
    if k % g:
        x = torch.nn.functional.pad(x, (0, n_groups * g - k))  # zero fill: see numpy backend
    xg = x.view(n, n_groups, g)
    amax = xg.abs().amax(dim=2)
    qmax = torch.full_like(amax, float(fmt.qmax))
    raw_scale32 = torch.div(amax, qmax)
    scale16 = raw_scale32.to(torch.float16)
    bits = scale16.view(torch.int16)
    rescue = (bits == 0) & (amax > 0)
    bits = torch.where(rescue, torch.ones_like(bits), bits)
    scale32 = bits.view(torch.float16).to(torch.float32)
    positive = scale32 > 0
    inv32 = torch.where(
        positive, torch.div(torch.ones_like(scale32), scale32), torch.zeros_like(scale32)
    )
    q = torch.round(torch.mul(xg, inv32.unsqueeze(2)))
    q = torch.clamp(q, fmt.qmin, fmt.qmax).to(torch.int8)
    return q.view(n, n_groups * g)[:, :k], bits, amax, raw_scale32


def _failure_flag(amax: Any, bits: Any) -> Any:
    """0-dim device bool: the chunk holds a non-finite value or a scale that overflows binary16.

    A NaN or inf amax is exactly the condition of the non-finite check below, and 0x7C00 is
    +inf in binary16, the overflow check; one flag for both keeps the download to one byte.
    """
    import torch

    return (~torch.isfinite(amax) | (bits == BINARY16.exp_mask)).any()


def _make_stager(
    values: Any, source_dtype: str, dev: Any, rows: int, k: int, group_size: int
) -> ChunkStager:
    """Pinned CUDA staging only where torch has CUDA; everything else stages nothing."""
    import torch

    from .staging import CudaStager, HostStager

    if dev.type == "cuda" and torch.cuda.is_available():
        return CudaStager(values, source_dtype, dev, rows, k, group_size)
    return HostStager(values, source_dtype, dev)


def encode_torch(
    values: Any,
    source_dtype: str,
    fmt: NumericFormat,
    *,
    device: Any = None,
    tensor: str | None = None,
    chunk_elements: int | None = None,
    row0: int = 0,
) -> GroupedCodes:
    """Encode a numpy word array (or a torch tensor) on ``device`` (default: CPU); ``row0``
    (the tensor row of ``values``' first row, for a row block) is added to reported rows.

    Rows are encoded in chunks of about ``chunk_elements`` values (default
    ``CHUNK_ELEMENTS_CUDA`` on CUDA, ``CHUNK_ELEMENTS_CPU`` elsewhere), pipelined through a
    :class:`~.staging.ChunkStager` as described in the module docstring.
    """
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    assert fmt.group_size is not None
    n, k = values.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, ceil_div(k, fmt.group_size)), dtype=np.uint16)
    if chunk_elements is None:
        chunk_elements = CHUNK_ELEMENTS_CUDA if dev.type == "cuda" else CHUNK_ELEMENTS_CPU
    rows = max(1, chunk_elements // k)
    bounds = [(r0, min(n, r0 + rows)) for r0 in range(0, n, rows)]
    if not bounds:
        return GroupedCodes(codes=codes, scales=scales)
    # Buffers for at most one chunk, or the whole tensor when it is smaller.
    stager = _make_stager(values, source_dtype, dev, min(rows, n), k, fmt.group_size)

    def collect(slot: int, r0: int, r1: int) -> None:
        if stager.collect(slot, codes[r0:r1], scales[r0:r1]):
            stager.drain()  # the recomputation below runs unstaged on the compute stream
            _raise_chunk_error(values, r0, r1, source_dtype, fmt, dev, tensor, row0)

    try:
        stager.upload(0, *bounds[0])
        for i in range(len(bounds)):
            slot = i % 2
            q, bits, amax, _ = _encode_chunk(stager.take(slot), fmt)
            stager.download(slot, q, bits, _failure_flag(amax, bits))
            if i + 1 < len(bounds):
                stager.upload(1 - slot, *bounds[i + 1])
            # Chunks are collected strictly in order, so the first failing chunk is the one
            # reported even though the next one has already been encoded.
            if i > 0:
                collect(1 - slot, *bounds[i - 1])
        collect((len(bounds) - 1) % 2, *bounds[-1])
    except BaseException:
        # Chunks may still be in flight; nothing may be freed while a stream could use it.
        # (After the last collect nothing is: see CudaStager.)  No drain on success, so a
        # compute stream shared with other threads is not waited for.
        stager.drain()
        raise
    return GroupedCodes(codes=codes, scales=scales)


def _raise_chunk_error(
    values: Any,
    r0: int,
    r1: int,
    source_dtype: str,
    fmt: NumericFormat,
    dev: Any,
    tensor: str | None,
    row0: int = 0,
) -> None:
    """Re-encode a flagged chunk unstaged and raise the error the unpipelined encoder raised.

    The pipeline only keeps a one-byte flag per chunk; recomputing the chunk (deterministic, the
    same operations on the same device) gives back the values the checks need, and the checks
    are the original ones: the first non-finite value of the chunk in row-major order takes
    precedence, then the first overflowing group.
    """
    import torch

    from .staging import rows_f32

    assert fmt.group_size is not None
    k = values.shape[1]
    x = rows_f32(values, r0, r1, source_dtype, dev)
    _, bits, amax, raw = _encode_chunk(x, fmt)
    if not bool(torch.isfinite(amax).all()):
        bad = ~torch.isfinite(x)
        flat = int(torch.argmax(bad.reshape(-1).to(torch.uint8)))
        r, c = divmod(flat, k)
        word = _source_word(values, r0 + r, c, source_dtype)
        raise nonfinite_error(tensor, row0 + r0 + r, c // fmt.group_size, c, word, source_dtype)
    overflow = bits == BINARY16.exp_mask
    if bool(overflow.any()):
        r, grp = (int(i) for i in torch.nonzero(overflow)[0])
        raise overflow_error(tensor, row0 + r0 + r, grp, float(raw[r, grp]))
    raise EncodeError(
        f"rows {row0 + r0}..{row0 + r1 - 1} were flagged as non-finite or overflowing on "
        f"{dev}, but re-encoding them found neither",
        tensor=tensor,
        kind="encoder_disagreement",
        rule="spec Section 7",
        hint="the device gave different results for the same chunk; convert with --device cpu "
        "and report the GPU, driver and torch version",
    )


def _source_word(values: Any, r: int, c: int, source_dtype: str) -> int:
    import torch

    if isinstance(values, torch.Tensor):
        v = values[r, c].reshape(1).cpu()
        width = {torch.bfloat16: torch.int16, torch.float16: torch.int16}.get(v.dtype, torch.int32)
        return int(v.view(width).item()) & (0xFFFF if width is torch.int16 else 0xFFFFFFFF)
    return int(np.asarray(values)[r, c])


# --- MSE_F16_SEARCH_V1 (docs/encoder-profiles.md) -------------------------------------------
#
# The profile in float64 torch, one torch operation per document step, on CPU or CUDA:
#
# * candidate scales: float64(amax) * 32 is exact and the division by qmax * c (a *device
#   tensor*, never a Python scalar: ATen's CUDA division by a scalar multiplies by its
#   reciprocal) is one IEEE binary64 division (CUDA ``div.rn.f64``); the document proves that
#   this rounding cannot change the binary16 rounding that follows.  That rounding is done on
#   the binary64 bits with integer operations (:func:`_f64_to_f16_words`), because torch's
#   float64 -> float16 cast goes through binary32 on both devices, and a binary32 intermediate
#   can land exactly on a binary16 tie (double rounding);
# * codes: ``torch.div`` in float64 (IEEE division on CPU, ``div.rn.f64`` on CUDA), clamp, then
#   ``torch.round`` (half to even): exact by the document's argument;
# * error: ``s * code`` (exact), ``x - r``, ``d * d`` and the sum are separate float64 torch
#   operations (torch's elementwise kernels are not contracted into FMAs: CPU ATen is built
#   without -ffast-math and CUDA's ``a * b`` then ``a - b`` in separate kernels cannot fuse),
#   and the sum is one ``torch.add`` per value index i = 0, 1, ... (never ``torch.sum``, whose
#   order is unspecified).  A partial group is padded with +0, which adds exactly +0.
# Refusals (non-finite values, canonical scale overflow) come from the canonical chunk encoder
# as a flag; a flagged chunk is handed to the numpy encoder of the profile, which raises the
# same error as the host path (chunks are whole multiples of its pieces, so its first failing
# piece is the same).

MSE_CHUNK_ELEMENTS_CPU = 1 << 16
MSE_CHUNK_ELEMENTS_CUDA = 1 << 22


def _f64_to_f16_words(v: Any) -> Any:
    """Binary16 words (int64) of finite non-negative float64 ``v``, one RNE rounding each."""
    import torch

    bits = v.view(torch.int64)
    r = bits - (1008 << 52)  # rebias 1023 -> 15; the low 42 fraction bits are rounded away
    normal = (r + ((1 << 41) - 1) + ((r >> 42) & 1)) >> 42
    sub = torch.round(v * 16777216.0).to(torch.int64)  # v * 2^24 is exact; below 1024 here
    words = torch.where(v >= 6.103515625e-05, normal, sub)
    return torch.where(v >= 65520.0, torch.full_like(words, BINARY16.exp_mask), words)


def _mse_codes_errors(xg: Any, s: Any, fmt: NumericFormat) -> tuple[Any, Any]:
    """Nearest codes (float64) of values ``xg`` [..., 1, G] for scales ``s`` [..., J, 1] and the
    document's binary64 error of each scale [..., J]: one float64 op per step, summed in index
    order."""
    import torch

    q = torch.div(xg, s)
    q = torch.round(torch.clamp(q, fmt.qmin, fmt.qmax))
    d = torch.sub(xg, torch.mul(q, s))
    t = torch.mul(d, d)
    acc = torch.zeros(t.shape[:-1], dtype=torch.float64, device=xg.device)  # +0
    for i in range(t.shape[-1]):
        acc = torch.add(acc, t[..., i])
    return q, acc


def _mse_chunk(x: Any, fmt: NumericFormat) -> tuple[Any, Any, Any]:
    """MSE_F16_SEARCH_V1 of float32 rows [n, K] on their device: (codes int8 [n, K], scale words
    int16 [n, groups], failure flag)."""
    import torch

    from .mse_reference import CANDIDATE_RATIOS

    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = x.shape
    n_groups = ceil_div(k, g)
    _, bits0, amax, _ = _encode_chunk(x, fmt)  # candidate 0 and the refusal flag
    flag = _failure_flag(amax, bits0)
    if k % g:
        x = torch.nn.functional.pad(x, (0, n_groups * g - k))
    xg = x.view(n, n_groups, 1, g).double()
    amax64 = amax.double().unsqueeze(2)  # [n, groups, 1]
    dens = [float(-fmt.qmin)] + [float(fmt.qmax * c) for c in CANDIDATE_RATIOS]
    nums = [1.0] + [32.0] * len(CANDIDATE_RATIOS)
    den = torch.tensor(dens, dtype=torch.float64, device=x.device)
    num = torch.tensor(nums, dtype=torch.float64, device=x.device)
    raw = torch.div(amax64 * num, den.expand_as(amax64 * num))  # [n, groups, 13]
    words = torch.cat([bits0.to(torch.int64).unsqueeze(2) & 0xFFFF, _f64_to_f16_words(raw)], 2)
    words = torch.where(words == 0, torch.ones_like(words), words)  # the 2^-24 rescue
    usable = words != BINARY16.exp_mask
    words = torch.where(usable, words, words[..., :1].expand_as(words))  # placeholder: j = 0
    s = words.to(torch.int16).view(torch.float16).double().unsqueeze(3)  # [n, groups, 14, 1]
    q, acc = _mse_codes_errors(xg, s, fmt)
    acc = torch.where(usable, acc, torch.full_like(acc, float("inf")))
    best = torch.argmin(acc, dim=2, keepdim=True)  # the first minimum: lowest index wins ties
    live = (amax > 0).unsqueeze(2)
    scale = torch.where(live, torch.gather(words, 2, best), torch.zeros_like(best)).squeeze(2)
    codes = torch.gather(q, 2, best.unsqueeze(3).expand(n, n_groups, 1, g)).squeeze(2)
    codes = torch.where(live, codes, torch.zeros_like(codes)).to(torch.int8)
    return codes.reshape(n, n_groups * g)[:, :k], scale.to(torch.int16), flag


def encode_mse_torch(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    *,
    device: Any = None,
    tensor: str | None = None,
    chunk_elements: int | None = None,
) -> GroupedCodes:
    """MSE_F16_SEARCH_V1 of a numpy word array on ``device`` (default CPU), bit-identical to
    :mod:`.mse_reference`; refusals are those of :func:`.mse_search.encode_mse_numpy`."""
    import torch

    from .mse_search import CHUNK_ELEMENTS as NUMPY_PIECE
    from .mse_search import encode_rows_mse
    from .staging import words_to_torch_f32

    dev = torch.device(device) if device is not None else torch.device("cpu")
    assert fmt.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, ceil_div(k, fmt.group_size)), dtype=np.uint16)
    if chunk_elements is None:
        chunk_elements = MSE_CHUNK_ELEMENTS_CUDA if dev.type == "cuda" else MSE_CHUNK_ELEMENTS_CPU
    piece = max(1, NUMPY_PIECE // k)  # rows of one numpy piece: chunks are whole pieces
    rows = piece * max(1, chunk_elements // (piece * k))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        x = words_to_torch_f32(words[r0:r1], source_dtype, dev)
        q, s, flag = _mse_chunk(x, fmt)
        if bool(flag):
            encode_rows_mse(
                words[r0:r1], source_dtype, fmt, r0, codes[r0:r1], scales[r0:r1], tensor
            )
            raise EncodeError(  # pragma: no cover - the numpy encoder raised above
                f"rows {r0}..{r1 - 1} were flagged on {dev}, but the host encoder accepts them",
                tensor=tensor,
                rule="docs/encoder-profiles.md MSE_F16_SEARCH_V1",
                hint="convert with --device cpu and report the GPU, driver and torch version",
            )
        codes[r0:r1] = q.cpu().numpy()
        scales[r0:r1] = s.cpu().numpy().view(np.uint16)
    return GroupedCodes(codes=codes, scales=scales)
