"""The tensor runner of ``verify``: :func:`~.tensor_checks.check_tensor` over every stored
tensor on the scheduler convert uses (:mod:`ninfer_convert.scheduler`).

Contract of :func:`run_tensors`: one :class:`~.tensor_checks.TensorOutcome` per name, in the
order of ``names`` whatever order the workers finish in.  ``jobs`` threads each hold one tensor
at a time; a tensor is admitted against convert's in-flight byte budget with what its check
allocates (nothing for a tensor compared block by block from the mapped source or a direct /
copy-path tensor, its source bytes for another re-derived tensor, its stored bytes for one
only decoded), and a block-compared tensor that differs reserves its source bytes before it
is derived whole.  Consecutive small tensors run as one task
(:func:`ninfer_convert.scheduler.batches`); the stored planes and source bytes of the
tensors ahead are read into the page cache in the background.  A tensor whose planes were not
digested on the way has them digested here (``integrity``).  ``emit('tensors', done, total,
name)`` is called once before any tensor and once after each, from the worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from ..container import Artifact
from ..scheduler import Batch, ByteBudget, batches, bounded, inflight_budget, worker_pool
from .report import Finding
from .tensor_checks import (
    SourceContext,
    TensorOutcome,
    blockwise,
    check_tensor,
    input_streams,
    streamed,
)

if TYPE_CHECKING:
    from ..recipe import PlanEntry

__all__ = ["run_tensors"]

Emit = Callable[[str, int, int, str | None], None]


def _entry_of(ctx: SourceContext | None, name: str) -> PlanEntry | None:
    return ctx.entries.get(name) if ctx is not None else None


def _cost(art: Artifact, ctx: SourceContext | None, name: str) -> int:
    # What the check allocates.  Nothing tensor-sized for a grouped tensor compared block
    # by block straight from the mapped source (source and stored planes are mapped, not
    # copied), so such tensors never wait for each other; one that differs reserves its
    # source bytes before it is derived whole (``reserve`` in _TensorWork).  Convert's measure
    # (source bytes) for any other re-derived tensor; the stored bytes for a tensor that
    # is only decoded.
    entry = _entry_of(ctx, name)
    if entry is None:
        return art.tensors[name].nbytes
    assert ctx is not None
    if streamed(entry) or (blockwise(ctx, entry) and input_streams(entry)):
        return 0
    return entry.source_bytes


def _source_bytes(ctx: SourceContext | None, name: str) -> int:
    entry = _entry_of(ctx, name)
    return entry.source_bytes if entry is not None else 0


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
        self.done = 0
        self.lock = threading.Lock()

    def __call__(self, name: str) -> TensorOutcome:
        art, budget = self.art, self.budget
        held = self.costs[name]
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
            budget.release(held)
        with self.lock:
            self.done += 1
            count = self.done
        self.emit("tensors", count, self.total, name)
        return result


def run_tensors(
    art: Artifact,
    names: list[str],
    ctx: SourceContext | None,
    jobs: int,
    emit: Emit,
) -> list[TensorOutcome]:
    total = len(names)
    emit("tensors", 0, total, None)
    costs = {n: _cost(art, ctx, n) for n in names}
    # Sized for the largest tensor whatever its admission cost: a block-compared tensor that
    # differs reserves its source bytes later.
    largest = max((max(costs[n], _source_bytes(ctx, n)) for n in names), default=0)
    budget = ByteBudget(inflight_budget(largest))
    sizes = {n: art.tensors[n].nbytes + _source_bytes(ctx, n) for n in names}
    stored_and_source_bytes = sizes.__getitem__
    work = _TensorWork(art, ctx, costs, budget, total, emit)

    def prefetch(name: str) -> None:
        art.prefetch(name)
        entry = _entry_of(ctx, name)
        if ctx is not None and entry is not None:
            ctx.source.prefetch(s.name for s in entry.sources)

    # Cold reads (stored planes and source) of the tensors ahead overlap the re-encoding, as
    # convert does for its source; page cache only, so the window costs no process memory.
    with worker_pool(
        names,
        jobs=jobs,
        thread_name="ninfer-verify",
        key=str,
        nbytes=stored_and_source_bytes,
        prefetch=prefetch,
    ) as workers:

        def work_batch(batch: Batch[str]) -> list[TensorOutcome]:
            # One read-ahead top-up per batch: started() requests every tensor up to the last.
            workers.started(batch)
            return [work(n) for n in batch.items]

        tasks = batches(names, lambda n: max(costs[n], stored_and_source_bytes(n)))
        if jobs == 1 or total <= 1:
            return [o for b in tasks for o in work_batch(b)]

        # Bytes are admitted by the workers (``budget``: a tensor that differs reserves more
        # while it runs), so the submission window bounds the task count only.
        def submit(batch: Batch[str]) -> Future[list[TensorOutcome]]:
            return workers.pool.submit(work_batch, batch)

        window = bounded(tasks, submit, 0, _no_cost)
        # In stored order, whatever order the workers finish in.
        return [o for _, fut in window for o in fut.result()]


def _no_cost(batch: Batch[str]) -> int:
    return 0
