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

from ..errors import EncodeError
from ..formats import NumericFormat
from ..logical import GroupedCodes
from .common import nonfinite_error, overflow_error

if TYPE_CHECKING:
    from .staging import ChunkStager

__all__ = ["encode_torch"]

CHUNK_ELEMENTS_CPU = 1 << 18
CHUNK_ELEMENTS_CUDA = 1 << 26


def _encode_chunk(x: Any, fmt: NumericFormat) -> tuple[Any, Any, Any, Any]:
    """Encode float32 rows [n, K] on their device; returns (codes, scale bits, amax, raw)."""
    import torch

    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = x.shape
    n_groups = -(-k // g)
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

    return (~torch.isfinite(amax) | (bits == 0x7C00)).any()


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
    scales = np.empty((n, -(-k // fmt.group_size)), dtype=np.uint16)
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
    overflow = bits == 0x7C00
    if bool(overflow.any()):
        r, grp = (int(i) for i in torch.nonzero(overflow)[0])
        raise overflow_error(tensor, row0 + r0 + r, grp, float(raw[r, grp]))
    raise EncodeError(
        f"rows {row0 + r0}..{row0 + r1 - 1} were flagged as non-finite or overflowing on "
        f"{dev}, but re-encoding them found neither",
        tensor=tensor,
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
