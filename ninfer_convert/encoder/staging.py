"""Chunk staging for the torch encoder: where a chunk's source rows come from and its results go.

The chunk pipeline in :mod:`.torch_backend` drives a :class:`ChunkStager` through two slots
(chunk ``i`` uses slot ``i % 2``) in a fixed order, the same on every device::

    upload(0)
    for each chunk i:  take(i) -> encode -> download(i);  upload(i + 1);  collect(i - 1)
    collect(last)

* :class:`HostStager` (CPU, or any device without CUDA streams) needs no buffers: ``upload``
  widens a view of the source rows, ``download`` keeps the result tensors and ``collect`` copies
  them into the output arrays.  This is the path CI runs, so the ordering, slot reuse, row
  offsets and deferred error reporting of the pipeline are tested without a GPU.
* :class:`CudaStager` holds two pinned input buffers of source words, two pinned output buffers
  (codes, scale words, failure flag) and two device input buffers, and orders them with a copy
  stream, a download stream and events; its docstring states why no buffer is overwritten or
  freed while a copy or kernel may still use it.  It is only constructed when torch sees a CUDA
  device, so ``pin_memory`` is never requested on a CPU-only build.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from ..layouts.base import ceil_div

__all__ = [
    "ChunkStager",
    "CudaStager",
    "HostStager",
    "Source",
    "host_words",
    "rows_f32",
    "words_to_torch_f32",
]

Source = torch.Tensor | npt.NDArray[np.generic]
"""What ``encode_torch`` accepts: a numpy array of source words or a torch tensor of values."""

_TORCH_WORD = {"BF16": torch.int16, "F16": torch.int16, "F32": torch.int32}
_WIDE_FROM = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def words_to_torch_f32(
    words: npt.NDArray[np.generic], source_dtype: str, device: torch.device
) -> torch.Tensor:
    """Upload source words and widen them exactly to float32 on ``device``."""
    arr = np.ascontiguousarray(words)
    if not arr.flags.writeable:  # a read-only mapping: torch wants writable memory (a block)
        arr = arr.copy()
    if source_dtype == "BF16":
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    elif source_dtype == "F16":
        t = torch.from_numpy(arr.view(np.float16))
    else:
        t = torch.from_numpy(arr.view(np.float32))
    return t.to(device=device, non_blocking=True).float()


def rows_f32(
    values: Source, r0: int, r1: int, source_dtype: str, dev: torch.device
) -> torch.Tensor:
    """Rows [r0, r1) of the source widened exactly to float32 on ``dev``, without staging.

    Used by :class:`HostStager` and to recompute a failing chunk; the widening is the exact one
    (bf16/f16 -> f32, f32 unchanged), so a recomputed chunk gives the same bits as the staged one.
    """
    if isinstance(values, torch.Tensor):
        return values[r0:r1].to(dev).float()
    return words_to_torch_f32(values[r0:r1], source_dtype, dev)


def host_words(values: Source, source_dtype: str) -> npt.NDArray[np.generic] | None:
    """The source as a host numpy array of words, or ``None`` when it lives on a device.

    A CPU torch tensor is reinterpreted in place (same bits, possibly strided), so the CUDA
    path copies every host source into pinned memory the same way.
    """
    if isinstance(values, np.ndarray):
        # float32 sources as integer words: copies then move bits, never float values.
        return values.view(np.uint32) if values.dtype == np.float32 else values
    if values.device.type != "cpu":
        return None
    t = values.detach().view(_TORCH_WORD[source_dtype])
    return t.numpy().view(np.uint32 if source_dtype == "F32" else np.uint16)


def _new_stream(dev: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=dev)  # type: ignore[no-untyped-call]


def _new_event() -> torch.cuda.Event:
    # Blocking: the host waits on these events once per chunk; a spinning wait would take a
    # core from the threads that read the source and write the artifact meanwhile.
    return torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]


class ChunkStager(Protocol):
    """Moves chunk ``i`` (slot ``i % 2``) in and its results out; see the module docstring."""

    def upload(self, slot: int, r0: int, r1: int) -> None:
        """Start bringing rows [r0, r1) to the device; may return before they arrive."""

    def take(self, slot: int) -> torch.Tensor:
        """The uploaded rows as float32 [rows, K], safe to read on the current stream."""

    def download(
        self, slot: int, codes: torch.Tensor, bits: torch.Tensor, flag: torch.Tensor
    ) -> None:
        """Start bringing a chunk's codes, scale bits and 0-dim failure flag to the host."""

    def collect(
        self, slot: int, codes_out: npt.NDArray[np.int8], scales_out: npt.NDArray[np.uint16]
    ) -> bool:
        """Wait for the slot's download; True if the chunk failed, else fill the outputs."""

    def drain(self) -> None:
        """Wait for all work in flight (before raising, so nothing is freed while in use)."""


class HostStager:
    """No staging: rows are viewed and widened where they are; results are copied on collect."""

    def __init__(self, values: Source, source_dtype: str, dev: torch.device) -> None:
        self._values = values
        self._dtype = source_dtype
        self._dev = dev
        self._x: list[torch.Tensor | None] = [None, None]
        self._out: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = [None, None]

    def upload(self, slot: int, r0: int, r1: int) -> None:
        self._x[slot] = rows_f32(self._values, r0, r1, self._dtype, self._dev)

    def take(self, slot: int) -> torch.Tensor:
        x = self._x[slot]
        assert x is not None, "take() before upload()"
        self._x[slot] = None  # the slot is free for the chunk after next
        return x

    def download(
        self, slot: int, codes: torch.Tensor, bits: torch.Tensor, flag: torch.Tensor
    ) -> None:
        self._out[slot] = (codes, bits, flag)

    def collect(
        self, slot: int, codes_out: npt.NDArray[np.int8], scales_out: npt.NDArray[np.uint16]
    ) -> bool:
        out = self._out[slot]
        assert out is not None, "collect() before download()"
        self._out[slot] = None
        codes, bits, flag = out
        if bool(flag):
            return True
        codes_out[...] = codes.cpu().numpy()
        scales_out[...] = bits.cpu().numpy().view(np.uint16)
        return False

    def drain(self) -> None:
        pass  # every operation above completed before it returned


class CudaStager:
    """Pinned, double-buffered host<->device staging on three streams.

    Streams: ``copy`` (host-to-device uploads), the caller's current stream ``compute`` (widen
    and encode) and ``d2h`` (device-to-host downloads), so chunk ``i + 1``'s upload, chunk
    ``i``'s encode and chunk ``i - 1``'s download can run at the same time.  Per slot ``s``:

    * ``uploaded[s]`` is recorded on ``copy`` after the copy of pinned input ``s`` into device
      input ``s``.  ``compute`` waits for it before widening (the data has arrived), and the
      host synchronizes it before refilling pinned input ``s`` (the DMA has finished reading).
    * ``computed[s]`` is recorded on ``compute`` after the chunk's encode.  ``copy`` waits for
      it before uploading chunk ``i + 2`` into device input ``s`` (the kernels have finished
      reading it), and ``d2h`` waits for it before downloading the results.
    * ``downloaded[s]`` is recorded on ``d2h`` after the copies into pinned output ``s``.  The
      host synchronizes it in :meth:`collect` before reading the flag or copying into the
      output arrays; chunk ``i + 2``'s download into the same pinned output is only enqueued
      after that ``collect`` returned, in program order.

    Every wait is enqueued after the event's record in program order (``upload(i + 2)`` and
    ``download(i)`` run after ``take``/``download`` of chunk ``i``), so no wait is a no-op on an
    unrecorded event.  The result tensors of a chunk are allocated on ``compute`` and read on
    ``d2h``; they are referenced until :meth:`collect` has synchronized ``downloaded[s]``, so
    the caching allocator cannot hand their memory to a later chunk while ``d2h`` still reads
    it.  The device input buffers live for the whole call and are freed only when nothing of
    the call is pending: after the last :meth:`collect` (the last upload was followed on
    ``compute`` by the last encode, which ``d2h`` waited for before the download that
    ``collect`` synchronized; nothing is enqueued after those) or after :meth:`drain` on an
    error.  The caller's stream may be shared with other threads, so the success path does not
    synchronize it.  Pinned buffers come from torch's caching host allocator, which records
    the streams whose copies used a block before handing it out again.  Peak host memory per
    call: two chunk-sized word buffers in, two chunk-sized code buffers (and scale words) out.
    """

    def __init__(
        self, values: Source, source_dtype: str, dev: torch.device, rows: int, k: int, g: int
    ) -> None:
        self._values = values
        self._dtype = source_dtype
        self._dev = dev
        self._host = host_words(values, source_dtype)
        n_groups = ceil_div(k, g)
        word = _TORCH_WORD[source_dtype]
        self.compute = torch.cuda.current_stream(dev)
        self.copy = _new_stream(dev)
        self.d2h = _new_stream(dev)
        self._uploaded = [_new_event(), _new_event()]
        self._computed = [_new_event(), _new_event()]
        self._downloaded = [_new_event(), _new_event()]
        # Rows of the chunk uploaded into / downloaded from each slot.  Separate, because chunk
        # i + 1 is uploaded into slot s before chunk i - 1 (same slot) is collected.
        self._rows_in: list[int] = [0, 0]
        self._rows_out: list[int] = [0, 0]
        self._in_host: list[torch.Tensor] = []
        self._in_dev: list[torch.Tensor] = []
        if self._host is not None:
            for _ in range(2):
                self._in_host.append(torch.empty((rows, k), dtype=word, pin_memory=True))
                self._in_dev.append(torch.empty((rows, k), dtype=word, device=dev))
        self._codes = [torch.empty((rows, k), dtype=torch.int8, pin_memory=True) for _ in range(2)]
        self._bits = [
            torch.empty((rows, n_groups), dtype=torch.int16, pin_memory=True) for _ in range(2)
        ]
        self._flags = torch.zeros(2, dtype=torch.bool, pin_memory=True)
        self._used = [False, False]
        self._held: list[tuple[torch.Tensor, ...] | None] = [None, None]
        self._direct: list[torch.Tensor | None] = [None, None]
        # The device buffers were allocated on the compute stream, so the allocator may have
        # handed out memory that kernels already queued there still use; the copy stream
        # must not write into it before those finish.
        self.copy.wait_stream(self.compute)

    def upload(self, slot: int, r0: int, r1: int) -> None:
        m = r1 - r0
        self._rows_in[slot] = m
        if self._host is None:  # already on a device: slice (and move) on the compute stream
            assert isinstance(self._values, torch.Tensor)
            self._direct[slot] = self._values[r0:r1].to(self._dev)
            return
        pinned = self._in_host[slot][:m]
        if self._used[slot]:
            self._uploaded[slot].synchronize()  # the previous DMA out of this buffer is done
            self.copy.wait_event(self._computed[slot])  # device buffer no longer read
        self._used[slot] = True
        np.copyto(pinned.numpy().view(self._host.dtype), self._host[r0:r1])
        with torch.cuda.stream(self.copy):
            self._in_dev[slot][:m].copy_(pinned, non_blocking=True)
            self._uploaded[slot].record(self.copy)

    def take(self, slot: int) -> torch.Tensor:
        if self._host is None:
            x = self._direct[slot]
            assert x is not None
            self._direct[slot] = None
            return x.float()
        self.compute.wait_event(self._uploaded[slot])
        words = self._in_dev[slot][: self._rows_in[slot]]
        return words.view(_WIDE_FROM[self._dtype]).float()

    def download(
        self, slot: int, codes: torch.Tensor, bits: torch.Tensor, flag: torch.Tensor
    ) -> None:
        m = self._rows_in[slot]
        self._rows_out[slot] = m
        codes = codes.contiguous()  # the partial-group slice; made dense on the compute stream
        self._computed[slot].record(self.compute)
        self.d2h.wait_event(self._computed[slot])
        with torch.cuda.stream(self.d2h):
            self._codes[slot][:m].copy_(codes, non_blocking=True)
            self._bits[slot][:m].copy_(bits, non_blocking=True)
            self._flags[slot : slot + 1].copy_(flag.reshape(1), non_blocking=True)
            self._downloaded[slot].record(self.d2h)
        self._held[slot] = (codes, bits, flag)

    def collect(
        self, slot: int, codes_out: npt.NDArray[np.int8], scales_out: npt.NDArray[np.uint16]
    ) -> bool:
        m = self._rows_out[slot]
        self._downloaded[slot].synchronize()
        self._held[slot] = None  # the download finished; the allocator may reuse the memory
        if bool(self._flags[slot]):
            return True
        np.copyto(codes_out, self._codes[slot][:m].numpy())
        np.copyto(scales_out, self._bits[slot][:m].numpy().view(np.uint16))
        return False

    def drain(self) -> None:
        for stream in (self.copy, self.compute, self.d2h):
            stream.synchronize()
