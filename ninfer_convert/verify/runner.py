"""The tensor runner of ``verify``: :func:`~.tensor_checks.check_tensor` over every stored
tensor on the scheduler convert uses (:mod:`ninfer_convert.scheduler`).

Contract of :func:`run_tensors`: one :class:`~.tensor_checks.TensorOutcome` per name, in the
order of ``names`` whatever order the workers finish in.  ``jobs`` threads each hold one tensor
at a time; a tensor is admitted against convert's in-flight byte budget with what its check
allocates (nothing for a tensor compared block by block from the mapped source or a direct /
copy-path tensor, its source bytes for another re-derived tensor, its stored bytes for one
only decoded), and a block-compared tensor that differs reserves its source bytes before it
is derived whole; a tensor admitted at no cost never waits for the budget.  Consecutive small
tensors run as one task (:func:`ninfer_convert.scheduler.batches`), whose direct copies are
proven equal together (:func:`~.copy_runs.checked_copies`: the outcome
:func:`~.tensor_checks.check_tensor` gives, or the tensor is checked on its own); the stored
planes and source bytes of the tasks ahead are read into the page cache in the background (the
window counts tasks; a task's ranges are requested per file, sorted and merged).  A tensor whose
planes were not digested on the way has them digested here (``integrity``).
``emit('tensors', done, total, name)`` is called once before any tensor and once after each,
from the worker threads.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from ..container import Artifact
from ..formats import lookup_format
from ..readahead import CHUNK, read_ahead
from ..scheduler import Batch, ByteBudget, batches, bounded, inflight_budget, worker_pool
from .copy_runs import checked_copies
from .report import Finding
from .tensor_checks import (
    SourceContext,
    TensorOutcome,
    check_tensor,
    input_streams,
)

__all__ = ["run_tensors"]

Emit = Callable[[str, int, int, str | None], None]


def _costs(
    art: Artifact, ctx: SourceContext | None, names: list[str]
) -> tuple[dict[str, int], dict[str, int], int]:
    """Each tensor's admission cost, its stored plus source bytes, and the largest tensor's
    bytes the budget is sized for; one pass, with each format looked up once (this runs for
    every tensor before the first is checked).

    The cost is what the check allocates.  Nothing tensor-sized for a direct format or a copy
    path (streamed), or for a grouped tensor compared block by block on the host straight
    from the mapped source (source and stored planes are mapped, not copied), so such tensors
    never wait for each other; one that differs reserves its source bytes before it is
    derived whole (``reserve`` in _TensorWork).  Convert's measure (source bytes) for any
    other re-derived tensor; the stored bytes for a tensor that is only decoded."""
    costs: dict[str, int] = {}
    sizes: dict[str, int] = {}
    largest = 0
    tensors = art.tensors
    entries = ctx.entries if ctx is not None else {}
    on_host = ctx is not None and ctx.device == "cpu"
    grouped: dict[str, bool] = {}
    for n in names:
        planes = tensors[n].planes
        stored = planes[0].nbytes if len(planes) == 1 else sum(p.nbytes for p in planes)
        entry = entries.get(n)
        if entry is None:
            cost, source_bytes = stored, 0
        else:
            source_bytes = entry.source_bytes
            fmt = entry.format
            is_grouped = grouped.get(fmt)
            if is_grouped is None:
                is_grouped = grouped[fmt] = lookup_format(fmt).is_grouped
            free = entry.copy is not None or not is_grouped or (on_host and input_streams(entry))
            cost = 0 if free else source_bytes
        costs[n] = cost
        sizes[n] = stored + source_bytes
        # Sized for the largest tensor whatever its admission cost: a block-compared tensor
        # that differs reserves its source bytes later.
        if cost > largest or source_bytes > largest:
            largest = max(cost, source_bytes)
    return costs, sizes, largest


class _TensorWork:
    """Checks one tensor under the byte budget and reports its progress (thread-safe)."""

    def __init__(
        self,
        art: Artifact,
        ctx: SourceContext | None,
        costs: dict[str, int],
        budget: ByteBudget,
        total: int,
        emit: Emit,
    ) -> None:
        self.art, self.ctx, self.costs, self.budget = art, ctx, costs, budget
        self.total, self.emit = total, emit
        # next() of a count is atomic under the GIL: the progress count needs no lock.
        self.done = itertools.count(1)

    def __call__(self, name: str) -> TensorOutcome:
        art, budget = self.art, self.budget
        held = self.costs[name]
        if held:  # a tensor admitted at no cost never waits, and has nothing to release
            budget.acquire(held)

        def reserve(nbytes: int) -> None:
            nonlocal held
            if held == 0:  # a tensor admitted with a cost already holds its source bytes
                budget.acquire(nbytes)
                held = nbytes

        try:
            result = check_tensor(art, name, self.ctx, reserve)
            if result.integrity is None:  # not digested on the way: read the planes for it
                result.integrity = [Finding.of("integrity", e) for e in art.verify_tensor(name)]
        finally:
            if held:
                budget.release(held)
        self.emit("tensors", next(self.done), self.total, name)
        return result

    def checked(self, outcome: TensorOutcome) -> TensorOutcome:
        """Report the progress of a tensor checked with its batch (:mod:`.copy_runs`)."""
        self.emit("tensors", next(self.done), self.total, outcome.name)
        return outcome


def run_tensors(
    art: Artifact,
    names: list[str],
    ctx: SourceContext | None,
    jobs: int,
    emit: Emit,
) -> list[TensorOutcome]:
    total = len(names)
    emit("tensors", 0, total, None)
    costs, sizes, largest = _costs(art, ctx, names)
    budget = ByteBudget(inflight_budget(largest))
    work = _TensorWork(art, ctx, costs, budget, total, emit)
    # A cost is 0, the source bytes or (not planned) the stored bytes, never above the size:
    # the batches are cut by size.  A task's bytes are asked for by the read-ahead window more
    # than once: summed once here.
    tasks = list(enumerate(batches(names, sizes.__getitem__)))
    task_sizes = [sum(map(sizes.__getitem__, batch.items)) for _, batch in tasks]

    def task_bytes(task: tuple[int, Batch[str]]) -> int:
        return task_sizes[task[0]]

    def prefetch(task: tuple[int, Batch[str]]) -> None:
        _prefetch(art, ctx, task[1].items)

    # Cold reads (stored planes and source) of the tasks ahead overlap the re-encoding, as
    # convert does for its source; page cache only, so the window costs no process memory.
    # The window counts tasks, not tensors: its bookkeeping is paid per batch.
    with worker_pool(
        tasks,
        jobs=jobs,
        thread_name="ninfer-verify",
        key=lambda task: str(task[0]),
        nbytes=task_bytes,
        prefetch=prefetch,
    ) as workers:

        def work_batch(task: tuple[int, Batch[str]]) -> list[TensorOutcome]:
            # One read-ahead top-up per batch: it requests every task up to this one.
            workers.ahead.started(task[0])
            items = task[1].items
            # The direct copies of the batch as one unit; every other tensor, and any copy
            # that differs, on its own (so its findings are the per-tensor path's).
            done = checked_copies(art, ctx, items) if ctx is not None and len(items) > 1 else {}
            if not done:
                return [work(n) for n in items]
            return [work.checked(done[n]) if n in done else work(n) for n in items]

        if jobs == 1 or total <= 1:
            return [o for t in tasks for o in work_batch(t)]

        # Bytes are admitted by the workers (``budget``: a tensor that differs reserves more
        # while it runs), so the submission window bounds the task count only.
        def submit(task: tuple[int, Batch[str]]) -> Future[list[TensorOutcome]]:
            return workers.pool.submit(work_batch, task)

        window = bounded(tasks, submit, 0, _no_cost)
        # In stored order, whatever order the workers finish in.
        return [o for _, fut in window for o in fut.result()]


def _prefetch(art: Artifact, ctx: SourceContext | None, names: tuple[str, ...]) -> None:
    """Request read-ahead of the stored planes and source bytes of a batch of tensors: what
    :meth:`Artifact.prefetch` and :meth:`SourceCheckpoint.prefetch` request for each, with the
    ranges of each file sorted and merged here (overlapping, or within one read-ahead piece of
    each other) so a batch of tiny tensors costs a few requests, not two per tensor.  Sorted,
    because the stored order need not be the source's: a batch of names in stored order reads
    scattered source bytes, and merging only back-to-back ranges left one request per tensor."""
    spans: dict[Path, list[tuple[int, int]]] = {}
    tensors = art.tensors
    # Consecutive tensors are mostly in one file: its list is looked up when the file changes.
    file: Path | None = None
    ranges: list[tuple[int, int]] = []
    for name in names:
        info = tensors[name]
        planes = info.planes
        if not planes:
            continue
        if info.file is not file:  # identity: equal paths only cost a second lookup
            file = info.file
            ranges = spans.setdefault(file, [])
        if len(planes) == 1:
            p = planes[0]
            ranges.append((p.offset, p.offset + p.nbytes))
        else:
            ranges.append((min(p.offset for p in planes), max(p.offset + p.nbytes for p in planes)))
    if ctx is not None:
        entries, source = ctx.entries, ctx.source
        stored = source.tensors
        paths: dict[str, Path] = {}
        current: str | None = None
        for name in names:
            entry = entries.get(name)
            if entry is None:
                continue
            for s in entry.sources:
                t = stored.get(s.name)
                if t is not None and t.nbytes:
                    if t.file is not current:
                        current = t.file
                        path = paths.get(current)
                        if path is None:
                            path = paths[current] = source.file_path(current)
                        ranges = spans.setdefault(path, [])
                    ranges.append((t.offset, t.offset + t.nbytes))
    for path, ranges in spans.items():
        ranges.sort()
        first, last = ranges[0]
        for start, end in ranges[1:]:
            if start <= last + CHUNK:
                last = max(last, end)
            else:
                read_ahead(path, first, last - first)
                first, last = start, end
        read_ahead(path, first, last - first)


def _no_cost(task: tuple[int, Batch[str]]) -> int:
    return 0
