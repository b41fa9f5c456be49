"""Background read-ahead: bring byte ranges of files into the page cache, in request order.

Contract: :func:`read_ahead` returns at once.  One daemon thread per process opens the file and
issues ``posix_fadvise(POSIX_FADV_WILLNEED)`` over the range in :data:`CHUNK`-byte pieces, in
the order the ranges were requested.  Nothing is allocated in the process (the pages land in
the page cache, which is file-backed memory, not RssAnon), nothing waits for the data, and
errors are ignored: the real read reports any problem with its context.  Where
``posix_fadvise`` does not exist it does nothing.

Why in pieces: Linux caps a single WILLNEED request at the larger of the device's
``read_ahead_kb`` and ``max_sectors_kb`` (``force_page_cache_ra``), 128 KiB by default, so one
request for a whole 256 MiB tensor reads only its first few MiB; requests in pieces read it
all (measurements: docs/performance.md, "read-ahead that reads ahead").

Why a thread: submitting blocks while the device queue is full, and that must not stall an
encoding worker.

Inside :func:`batched` (every :meth:`ReadAheadWindow.started` top-up runs in one) a thread's
requests are collected and submitted when the block ends, grouped per file in the order each
file was first named, back-to-back ranges of one file (gaps up to one piece) merged into one
request: thousands of tiny tensors cost one queue hand-over and one open per range, not per
tensor.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

__all__ = ["CHUNK", "READ_AHEAD_BYTES", "ReadAheadWindow", "batched", "read_ahead"]

T = TypeVar("T")

CHUNK = 128 << 10
"""Bytes per WILLNEED request: Linux's default read-ahead window, so no piece is truncated."""

READ_AHEAD_BYTES = 512 << 20
"""Default bytes of a :class:`ReadAheadWindow` beyond its started items.  Page cache, not
process memory.  On the benchmark VM convert and verify at 2.2 GB keep the disk busy with it
(256 MiB counted from the started item left each new item requested just before it was used)."""

_requests: queue.SimpleQueue[tuple[str, int, int]] = queue.SimpleQueue()
_worker: threading.Thread | None = None
_lock = threading.Lock()


_batch = threading.local()  # .ranges: the calling thread's open :func:`batched` collection


def read_ahead(path: str | os.PathLike[str], offset: int, length: int) -> None:
    """Ask for ``length`` bytes of ``path`` from ``offset`` to be read into the page cache."""
    if length <= 0 or not hasattr(os, "posix_fadvise"):
        return
    key = os.fspath(path)
    ranges: dict[str, list[list[int]]] | None = getattr(_batch, "ranges", None)
    if ranges is None:
        _submit(key, offset, length)
        return
    # Inside batched(): merge with the previous range of the same file when this one starts
    # within one piece after its end (back-to-back tiny tensors, alignment gaps included).
    mine = ranges.setdefault(key, [])
    if mine and mine[-1][1] <= offset <= mine[-1][1] + CHUNK:
        mine[-1][1] = max(mine[-1][1], offset + length)
    else:
        mine.append([offset, offset + length])


def _submit(path: str, offset: int, length: int) -> None:
    global _worker
    with _lock:
        if _worker is None:
            _worker = threading.Thread(target=_run, name="ninfer-readahead", daemon=True)
            _worker.start()
    _requests.put((path, offset, length))


@contextlib.contextmanager
def batched() -> Iterator[None]:
    """Collect this thread's :func:`read_ahead` requests and submit them on exit, back-to-back
    ranges of one file merged into one request (one queue hand-over and one open per range
    instead of per tensor: thousands of tiny tensors are requested in one window top-up)."""
    if getattr(_batch, "ranges", None) is not None:  # nested: the outer one submits
        yield
        return
    _batch.ranges = {}
    try:
        yield
    finally:
        ranges, _batch.ranges = _batch.ranges, None
        for path, spans in ranges.items():
            for start, end in spans:
                _submit(path, start, end - start)


def _run() -> None:
    pending: tuple[str, int, int] | None = None
    while True:
        path, offset, length = pending if pending is not None else _requests.get()
        pending = None
        # Requests queued meanwhile for the next bytes of the same file (thousands of tiny
        # tensors stored back to back) are merged into one range: one open and one advice per
        # range instead of per tensor.  Gaps up to one piece are read too (alignment padding).
        end = offset + length
        while pending is None:
            try:
                nxt = _requests.get_nowait()
            except queue.Empty:
                break
            if nxt[0] == path and end <= nxt[1] <= end + CHUNK:
                end = max(end, nxt[1] + nxt[2])
            else:
                pending = nxt
        with contextlib.suppress(Exception):  # a hint must never stop the read-ahead thread
            _advise(path, offset, end - offset)


def _advise(path: str, offset: int, length: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # the real read reports it, with its context
    try:
        end = offset + length
        for start in range(offset, end, CHUNK):
            os.posix_fadvise(fd, start, min(CHUNK, end - start), os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


class ReadAheadWindow(Generic[T]):
    """Keep read-ahead requested for the items after the furthest one started, in order: as
    many as fit in ``limit`` bytes of items not started yet, and at least ``min_items`` of
    them whatever their size (so with huge items the page cache may hold ``min_items`` of
    them ahead: page cache, not process memory, but it can evict pages not yet read on a
    machine with little free memory).

    Workers call :meth:`started` with an item's index as they begin it (from any thread); the
    first call requests the first window, later calls top it up, and no item is requested
    twice.  The window is counted past the items already started, not from the one being
    started: with ``jobs`` workers each holding an item, a window that includes the started
    items leaves the next worker's item requested only moments before it is needed.
    """

    def __init__(
        self,
        items: Sequence[T],
        nbytes: Callable[[T], int],
        request: Callable[[T], None],
        limit: int = READ_AHEAD_BYTES,
        min_items: int = 1,
    ) -> None:
        self._items, self._nbytes, self._request = items, nbytes, request
        self._limit, self._min_items = limit, min_items
        self._next = 0  # first item not requested yet
        self._front = 0  # first item after the furthest one started
        self._ahead = 0  # bytes of items [_front, _next): requested, not started
        self._lock = threading.Lock()

    def started(self, index: int) -> None:
        """Amortised O(1) per call: every item enters and leaves the running byte count of the
        window once (re-summing the window on every call made convert and verify quadratic in
        the tensor count when the window holds thousands of tiny tensors)."""
        with self._lock, batched():
            front = min(max(self._front, index + 1), len(self._items))
            if front > self._next:
                # Items up to the furthest started one that are not requested yet are being
                # worked on right now: they are requested first, in order, outside the budget.
                while self._next < front:
                    self._request(self._items[self._next])
                    self._next += 1
                self._ahead = 0
            else:
                for item in self._items[self._front : front]:
                    self._ahead -= self._nbytes(item)
            self._front = front
            while self._next < len(self._items):
                item = self._items[self._next]
                cost = self._nbytes(item)
                if self._next - front >= self._min_items and self._ahead + cost > self._limit:
                    break
                self._request(item)
                self._ahead += cost
                self._next += 1
