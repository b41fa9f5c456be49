"""How a conversion's tensors reach the writer, whoever stores them: the progress tally the
local pipeline and a :class:`TensorRunner` both feed, and the runner seam itself.

Contract: :class:`Tally` counts the tensors stored, in plan order, and sends a
:class:`~.convert_report.ProgressEvent` after each (and once before the first).  A
:class:`TensorRunner` (``convert --ray``: :mod:`ninfer_convert.cluster`) stores every plan entry
in the writer instead of the local pipeline, byte for byte the same, calls
``on_tensor(entry, stored_bytes)`` for each in plan order and returns a :class:`RunnerResult`;
everything else (the plan, the destination checks, side files, metadata, the signature, the
publish) stays :func:`~ninfer_convert.convert.convert_checkpoint`'s.

:func:`write_tensors` is the local pipeline (see the contract of :mod:`ninfer_convert.convert`):
the calling thread reserves every entry in plan order (a batch of small entries as runs of one
shard, :meth:`~.container.ArtifactWriter.reserve_run`, but an entry whose planes exceed 256 KiB
alone), worker threads derive them into their
reserved planes (one task per batch) and the calling thread completes them in plan order.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .container import ArtifactWriter
from .container.schema import Provenance
from .container.shardfile import RunReservation
from .container.shardwriter import _INLINE_BYTES
from .container.writer import Reservation
from .convert_report import ProgressEvent
from .derive import derive_packed
from .derive.entry import _plane_sizes, derive_into
from .derive.fused import PlaneSink
from .errors import EncodeError
from .readahead import CHUNK, read_ahead
from .recipe import Plan, PlanEntry
from .scheduler import Batch, batches, bounded, inflight_budget, worker_pool
from .source import SourceCheckpoint

__all__ = ["RunnerResult", "Tally", "TensorRunner", "write_tensors"]


@dataclass(frozen=True)
class RunnerResult:
    """What a :class:`TensorRunner` did: the source digests of the tensors it read, the rows it
    spot-checked and free-form details for the report (``--json`` ``"runner"``)."""

    source_digests: dict[str, str]
    spot_checked_rows: int
    details: dict[str, Any]


class TensorRunner(Protocol):
    """Stores the plan's tensors in ``writer`` some other way than the local pipeline (see the
    module contract)."""

    def __call__(
        self,
        writer: ArtifactWriter,
        plan: Plan,
        source: SourceCheckpoint,
        device: str,
        on_tensor: Callable[[PlanEntry, int], None],
    ) -> RunnerResult: ...


class Tally:
    """What the calling thread has completed so far, and the :class:`ProgressEvent` it sends
    after each tensor (and once before the first)."""

    def __init__(
        self, plan: Plan, started: float, progress: Callable[[ProgressEvent], None] | None
    ) -> None:
        self.total = len(plan.entries)
        self.total_bytes = sum(e.source_bytes for e in plan.entries)
        self.started = started
        self.progress = progress
        self.done = 0
        self.done_bytes = 0
        self.written = 0
        self.spot_rows = 0

    def stored_run(self, entries: Sequence[PlanEntry], written: Sequence[int]) -> None:
        """Consecutive tensors stored (``written[i]`` plane bytes each), in plan order: the
        same counts and events as :meth:`stored` of each."""
        if self.progress is not None:
            for entry, nbytes in zip(entries, written, strict=True):
                self.stored(entry, nbytes)
            return
        self.written += sum(written)
        self.done += len(entries)
        self.done_bytes += sum(e.source_bytes for e in entries)

    def stored(self, entry: PlanEntry, written: int) -> None:
        """One more tensor stored (``written`` plane bytes), in plan order."""
        self.written += written
        self.done += 1
        self.done_bytes += entry.source_bytes
        if self.progress is not None:  # no call per tensor without a listener
            self.emit(entry.output)

    def emit(self, name: str | None) -> None:
        if self.progress is not None:
            self.progress(
                ProgressEvent(
                    name, self.done, self.total, self.done_bytes, self.total_bytes,
                    self.written, time.perf_counter() - self.started,
                )
            )  # fmt: skip


def write_tensors(
    writer: ArtifactWriter,
    plan: Plan,
    src: SourceCheckpoint,
    provs: Mapping[str, Provenance],
    device: str,
    jobs: int,
    tally: Tally,
) -> dict[str, str]:
    """Derive every entry into its reserved planes and complete them in plan order; returns
    the digests of the source tensors read.

    A batch of small entries is reserved, derived and completed as runs
    (:meth:`~.container.ArtifactWriter.reserve_run`: one reservation, buffer and write per
    run of one shard, one task per batch), but for an entry whose planes exceed 256 KiB (its
    source is small, see :func:`_reserve_batch`); every other entry alone, by ``reserve`` and
    ``complete`` (its planes in the file, filled through the reservation's sink)."""
    budget = inflight_budget(max((e.source_bytes for e in plan.entries), default=0))
    digests: dict[str, str] = {}
    cancel = threading.Event()
    planned = list(batches(plan.entries, _source_bytes))
    # Cold source reads of the batches ahead overlap the encoding (page cache only).
    with worker_pool(
        planned,
        jobs=jobs,
        thread_name="ninfer-encode",
        key=_batch_key,
        nbytes=_batch_bytes,
        prefetch=partial(_prefetch, src, {}),
    ) as workers:
        reserved: deque[list[Reservation | RunReservation]] = deque()  # per batch submitted

        def submit(index: int) -> Future[_Done]:
            batch = planned[index]
            # One read-ahead top-up per batch: it requests every batch up to this one.
            started = partial(workers.ahead.started, index)
            if len(batch.items) > 1:  # small entries only (see batches)
                units = _reserve_batch(writer, batch.items, provs)
                reserved.append(units)
                return workers.pool.submit(
                    _guarded_runs, cancel, started, batch.items, units, src, device, jobs
                )
            (entry,) = batch.items
            # The tensor's bytes get their final place now, in plan order; the worker writes
            # its planes there a block at a time (file pages, not process memory).
            res = writer.reserve(entry.output, entry.format, entry.shape, role=entry.role,
                                 provenance=provs[entry.output])  # fmt: skip
            reserved.append([res])
            return workers.pool.submit(
                _guarded, cancel, started, entry, res.planes, res.sink, src, device, jobs
            )

        window = bounded(range(len(planned)), submit, budget, partial(_planned_bytes, planned))
        try:
            for index, fut in window:
                batch_digests, spot_rows = fut.result()
                digests.update(batch_digests)
                items = planned[index].items
                at = 0
                for unit in reserved.popleft():
                    if isinstance(unit, RunReservation):
                        writer.complete_run(unit)
                        tally.stored_run(items[at : at + len(unit.sizes)], unit.sizes)
                        at += len(unit.sizes)
                    else:
                        tally.stored(items[at], writer.complete(unit).nbytes)
                        at += 1
                tally.spot_rows += spot_rows
        except BaseException:
            cancel.set()
            raise
    return digests


def _reserve_batch(
    writer: ArtifactWriter, items: Sequence[PlanEntry], provs: Mapping[str, Provenance]
) -> list[Reservation | RunReservation]:
    """Reserve a batch's entries in plan order: consecutive ones whose planes fit in process
    memory (:data:`~.container.shardwriter._INLINE_BYTES`, as ``reserve`` decides) as runs,
    more than one where a new shard starts inside; any other alone, in the file's mapped
    pages.  A batch is small by its source bytes, not its planes: a U8 source is four times
    larger as I32, NVFP4's padded scales up to fifteen (64 batches in flight of such runs held
    about 0.5 GB of process memory)."""
    units: list[Reservation | RunReservation] = []
    at = 0
    while at < len(items):
        end = at
        while end < len(items) and sum(_plane_sizes(items[end].format, items[end].shape)) <= (
            _INLINE_BYTES
        ):
            end += 1
        if end == at:
            e = items[at]
            units.append(writer.reserve(e.output, e.format, e.shape, role=e.role,
                                        provenance=provs[e.output]))  # fmt: skip
            at += 1
            continue
        todo = [(e.output, e.format, e.shape, e.role, provs[e.output]) for e in items[at:end]]
        done = 0
        while done < len(todo):
            run = writer.reserve_run(todo[done:] if done else todo)
            units.append(run)
            done += len(run.names)
        at = end
    return units


def _output_name(entry: PlanEntry) -> str:
    return entry.output


def _source_bytes(entry: PlanEntry) -> int:
    return entry.source_bytes


def _batch_bytes(batch: Batch[PlanEntry]) -> int:
    return batch.nbytes


def _batch_key(batch: Batch[PlanEntry]) -> str:
    return batch.items[0].output


def _planned_bytes(planned: list[Batch[PlanEntry]], index: int) -> int:
    return planned[index].nbytes


def _prefetch(src: SourceCheckpoint, paths: dict[str, str], batch: Batch[PlanEntry]) -> None:
    """Request read-ahead of a batch's source bytes: a batch of small tensors as the few
    spans of each file its tensors lie in (gaps of at most one read-ahead piece read too), so
    its cost follows the spans, not the tensors (``src.prefetch`` of 100,000 one-element
    tensors scattered over a file, as sorted names place them, cost about 5 us each)."""
    if len(batch.items) == 1:
        src.prefetch([s.name for s in batch.items[0].sources])
        return
    infos = src.tensors
    by_file: dict[str, list[tuple[int, int]]] = {}
    for entry in batch.items:
        for s in entry.sources:
            info = infos.get(s.name)
            if info is not None and info.nbytes:
                by_file.setdefault(info.file, []).append((info.offset, info.offset + info.nbytes))
    for file, spans in by_file.items():
        path = paths.get(file)
        if path is None:
            path = paths[file] = str(src.file_path(file))
        spans.sort()
        start, end = spans[0]
        for a, b in spans:
            if a > end + CHUNK:
                read_ahead(path, start, end - start)
                start = a
            end = max(end, b)
        read_ahead(path, start, end - start)


def _seed(entry: PlanEntry, device: str) -> int:
    """Which rows of a GPU-encoded tensor get spot-checked: deterministic per tensor, whatever
    the scheduling (the host paths check no rows, so they need no seed)."""
    return 0 if device == "cpu" else zlib.crc32(entry.output.encode())


_Done = tuple[dict[str, str], int]
"""What a task did: the source digests it read and the rows it spot-checked."""


def _guarded(
    cancel: threading.Event,
    started: Callable[[], None],
    entry: PlanEntry,
    planes: list[npt.NDArray[np.uint8]],
    sink: PlaneSink,
    source: SourceCheckpoint,
    device: str,
    threads: int,
) -> _Done:
    """Derive one entry into its reserved planes (through their sink)."""
    started()
    if cancel.is_set():
        raise EncodeError("conversion cancelled", tensor=entry.output)
    packed = derive_packed(entry, source, device=device, threads=threads,
                           seed=_seed(entry, device), out=planes, sink=sink)  # fmt: skip
    return packed.source_digests, packed.spot_rows


def _guarded_runs(
    cancel: threading.Event,
    started: Callable[[], None],
    entries: tuple[PlanEntry, ...],
    units: list[Reservation | RunReservation],
    source: SourceCheckpoint,
    device: str,
    threads: int,
) -> _Done:
    """Derive a batch's entries, in order, into the planes of their runs (a reservation
    alone: through its sink)."""
    started()
    digests: dict[str, str] = {}
    spot = 0
    todo = iter(entries)
    # A batch of small tensors is read with a few preads instead of two syscalls each (each
    # releasing and re-taking the GIL from the busy main thread).
    with source.preread(s.name for entry in entries for s in entry.sources):
        for unit in units:
            if not isinstance(unit, RunReservation):
                entry = next(todo)
                if cancel.is_set():
                    raise EncodeError("conversion cancelled", tensor=entry.output)
                packed = derive_packed(entry, source, device=device, threads=threads,
                                       seed=_seed(entry, device), out=unit.planes,
                                       sink=unit.sink)  # fmt: skip
                digests.update(packed.source_digests)
                spot += packed.spot_rows
                continue
            for planes in unit.planes:
                entry = next(todo)
                if cancel.is_set():
                    raise EncodeError("conversion cancelled", tensor=entry.output)
                read, rows = derive_into(entry, source, planes, device=device,
                                         threads=threads, seed=_seed(entry, device))  # fmt: skip
                digests.update(read)
                spot += rows
    return digests, spot
