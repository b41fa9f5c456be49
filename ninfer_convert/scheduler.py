"""The one scheduler of ``convert`` and ``verify``: worker pool, read-ahead, bytes in flight.

Contract (both commands, docs/performance.md):

* Bytes in flight are bounded by :func:`inflight_budget`: at most the largest item's bytes, or
  :data:`MIN_INFLIGHT_BYTES` when that is larger, so peak memory follows the largest tensor,
  not the number of jobs times the largest tensor; a single item larger than the budget runs
  alone.  ``convert`` bounds what it submits (:func:`bounded`); ``verify``, whose tasks learn
  only while running whether they need a tensor's bytes, acquires them in the worker
  (:class:`ByteBudget`).
* At most :data:`MAX_INFLIGHT_ITEMS` tasks are submitted and not yet collected
  (:func:`bounded`): each task holds mappings of its sources, so without a count bound 100,000
  tiny tensors were all in flight at once (one open file each, and 'Too many open files').
* Consecutive small items (at most :data:`SMALL_ITEM_BYTES` each) travel as one task of at
  most :data:`BATCH_ITEMS` items and :data:`BATCH_BYTES` bytes (:func:`batches`), handled one
  after the other by one worker; every larger item is a task of its own.  Why: with one task
  per one-element tensor the futures, queue hand-overs and GIL switches between the calling
  thread and the workers cost more than the tensors themselves (about 370 us per tensor for
  convert and 290 us for verify at 100,000 tensors).
* Results are collected in submission order whatever order the workers finish in.
* :func:`worker_pool` starts the ``jobs`` worker threads and the read-ahead window of
  :mod:`.readahead` over the items (page cache only); a task calls
  :meth:`Workers.started` once, which tops the window up to the batch's last item.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from .readahead import ReadAheadWindow

__all__ = [
    "BATCH_BYTES",
    "BATCH_ITEMS",
    "MAX_INFLIGHT_ITEMS",
    "MIN_INFLIGHT_BYTES",
    "SMALL_ITEM_BYTES",
    "Batch",
    "ByteBudget",
    "Workers",
    "batches",
    "bounded",
    "inflight_budget",
    "worker_pool",
]

MIN_INFLIGHT_BYTES = 256 << 20
"""Bytes in flight below which jobs never wait for each other."""
MAX_INFLIGHT_ITEMS = 64
"""Tasks submitted and not yet collected at most (a task: one item, or a batch of small ones;
a batch holds at most 1 MiB of small tensors, read with ``pread`` up to 64 KiB)."""
SMALL_ITEM_BYTES = 256 << 10
BATCH_ITEMS = 256
BATCH_BYTES = 1 << 20

_T = TypeVar("_T")
_R = TypeVar("_R")


def inflight_budget(largest: int) -> int:
    """The in-flight byte budget of a run whose largest item has ``largest`` bytes."""
    return max(largest, MIN_INFLIGHT_BYTES)


@dataclass(frozen=True)
class Batch(Generic[_T]):
    """Consecutive items handled by one worker task, in order."""

    items: tuple[_T, ...]
    nbytes: int


def batches(items: Iterable[_T], nbytes: Callable[[_T], int]) -> Iterator[Batch[_T]]:
    """Group consecutive items of at most :data:`SMALL_ITEM_BYTES` (by ``nbytes``) into batches
    of at most :data:`BATCH_ITEMS` items and :data:`BATCH_BYTES` bytes; any larger item is a
    batch of its own (it keeps its own task, and convert's row-block path)."""
    run: list[_T] = []
    run_bytes = 0
    for item in items:
        size = nbytes(item)
        small = size <= SMALL_ITEM_BYTES
        if run and (not small or len(run) >= BATCH_ITEMS or run_bytes + size > BATCH_BYTES):
            yield Batch(tuple(run), run_bytes)
            run, run_bytes = [], 0
        if small:
            run.append(item)
            run_bytes += size
        else:
            yield Batch((item,), size)
    if run:
        yield Batch(tuple(run), run_bytes)


def bounded(
    items: Iterable[_T],
    submit: Callable[[_T], Future[_R]],
    budget: int,
    cost: Callable[[_T], int],
    max_items: int = MAX_INFLIGHT_ITEMS,
) -> Iterator[tuple[_T, Future[_R]]]:
    """Yield (item, future) in order, keeping the ``cost`` of the items submitted and not yet
    yielded back within ``budget`` (a single item larger than the budget runs alone) and at
    most ``max_items`` of them in flight."""
    window: deque[tuple[_T, Future[_R], int]] = deque()
    inflight = 0
    it = iter(items)
    pending: _T | None = next(it, None)
    while window or pending is not None:
        while pending is not None:
            size = cost(pending)
            if window and (inflight + size > budget or len(window) >= max_items):
                break
            window.append((pending, submit(pending), size))
            inflight += size
            pending = next(it, None)
        item, fut, size = window.popleft()
        yield item, fut
        inflight -= size


class ByteBudget:
    """Admit work while the bytes in flight stay within ``budget``; one item larger than the
    budget runs alone (acquired and released by the workers themselves)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.inflight = 0
        self.cond = threading.Condition()

    def acquire(self, cost: int) -> None:
        with self.cond:
            while self.inflight and self.inflight + cost > self.budget:
                self.cond.wait()
            self.inflight += cost

    def release(self, cost: int) -> None:
        with self.cond:
            self.inflight -= cost
            self.cond.notify_all()


@dataclass(frozen=True)
class Workers(Generic[_T]):
    """The worker threads of a run and its read-ahead window over the items."""

    pool: ThreadPoolExecutor
    ahead: ReadAheadWindow[_T]
    position: dict[str, int]
    key: Callable[[_T], str]

    def started(self, batch: Batch[_T]) -> None:
        """A task is starting ``batch``: request read-ahead of every item up to its last."""
        self.ahead.started(self.position[self.key(batch.items[-1])])


@contextmanager
def worker_pool(
    items: Sequence[_T],
    *,
    jobs: int,
    thread_name: str,
    key: Callable[[_T], str],
    nbytes: Callable[[_T], int],
    prefetch: Callable[[_T], None],
) -> Iterator[Workers[_T]]:
    """``jobs`` worker threads named ``thread_name``, and a read-ahead window over ``items``
    (``nbytes`` of each to read, ``prefetch`` to request it) that keeps cold reads of the
    items ahead overlapping the work; ``key`` names an item uniquely.  On exit the pool waits
    for the tasks already started."""
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix=thread_name) as pool:
        ahead = ReadAheadWindow(items, nbytes, prefetch, min_items=jobs)
        position = {key(item): i for i, item in enumerate(items)}
        yield Workers(pool, ahead, position, key)
