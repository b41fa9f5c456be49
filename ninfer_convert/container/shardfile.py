"""One staging shard file while it is written (docs/container.md, "Writing"): its cursor and
the tensors recorded in it (:class:`_Shard`), the extents reserved in it for tensors whose bytes
are stored later from worker threads (:class:`Reservation`, filled through its sink), and the
hint that starts the writeback of its finished pages (:func:`_start_writeback`).

Contract: a reserved extent lies at the planes' final offsets; the sink stores bytes there
with ``pwrite`` (bounds-checked, thread-safe for disjoint ranges) or, for small tensors, into
process memory that the writer writes at completion.  Releasing a reservation unmaps its
planes and closes its sink; a write after that is refused and never reaches another file.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..layouts import PlaneSpec
from .schema import Provenance, TensorEntry
from .wire import PRELUDE_SIZE

__all__ = ["Reservation", "RunReservation", "WrittenTensor"]

_WRITEBACK_BATCH = 8 << 20
"""New bytes a shard gathers before their writeback is started: a flush and a
``posix_fadvise`` per tiny tensor cost about 0.8 ms each (20,000 one-page tensors: 16.5 s of a
30 s convert), while 8 MiB still starts a large tensor's writeback at once."""


@dataclass(frozen=True)
class WrittenTensor:
    """What ``add`` wrote: the header entry and the 1-based shard that holds it."""

    entry: TensorEntry
    shard: int

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.entry.planes)


@dataclass
class _Shard:
    number: int
    path: Path
    handle: BinaryIO | None
    cursor: int = PRELUDE_SIZE
    tensors: list[TensorEntry] = field(default_factory=list)
    entry_json: dict[int, bytes] = field(default_factory=dict)
    """Index in ``tensors`` -> that entry's canonical JSON, for the entries the writer has it
    of already (filled from its planned entry); commit encodes the others."""
    written_back: int = 0  # bytes [0, written_back) were handed to the kernel's writeback


class _PlaneSink:
    """:attr:`Reservation.sink`: stores bytes at an offset of one of a tensor's planes, with a
    bounds check; thread-safe for disjoint ranges.  ``fd`` given: a ``pwrite`` into the
    reserved (``posix_fallocate``'d) bytes of the shard file; else a copy into ``planes``
    (process memory).

    :meth:`close` may run while workers still write (an abort of the writer, or a failed
    reservation, on the calling thread): the descriptor is closed by the last write in
    flight, never under one, because a closed number is given to the next file opened and a
    ``pwrite`` already on its way would land there.  A write after ``close`` is refused."""

    def __init__(
        self,
        planes: Sequence[np.ndarray[Any, np.dtype[np.uint8]]],
        offsets: Sequence[int],
        fd: int | None,
        on_error: Callable[[OSError], Exception] | None = None,
    ) -> None:
        self._sizes = [int(p.size) for p in planes]
        self._planes = planes if fd is None else ()  # the file's mapping is not written
        self._offsets = offsets
        self._to_file = fd is not None
        self.fd = fd
        self._on_error = on_error  # the typed error (naming the tensor) for a failed pwrite
        self._lock = threading.Lock()
        self._writing = 0  # pwrite loops in flight on self.fd
        self._closed = False

    def write(self, plane: int, offset: int, data: np.ndarray[Any, np.dtype[np.uint8]], /) -> None:
        n = int(data.size)
        if offset < 0 or offset + n > self._sizes[plane]:
            raise ValueError(f"bytes [{offset}, {offset + n}) lie outside plane {plane}")
        if not self._to_file:
            if self._closed:
                raise ValueError("the reservation was released")
            self._planes[plane][offset : offset + n] = data.reshape(-1)
            return
        view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
        at = self._offsets[plane] + offset
        with self._lock:
            fd = self.fd
            if fd is None:
                raise self._failure(OSError(errno.EBADF, "the reservation was released"))
            self._writing += 1
        done = 0
        try:
            while done < n:
                stored = os.pwrite(fd, view[done:], at + done)
                if stored <= 0:  # no progress: retrying would spin forever
                    raise OSError(errno.EIO, f"pwrite stored no bytes at offset {at + done}")
                done += stored
        except OSError as exc:
            raise self._failure(exc) from None
        finally:
            with self._lock:
                self._writing -= 1
                last = self._closed and self._writing == 0
            if last:
                os.close(fd)

    def _failure(self, exc: OSError) -> Exception:
        return exc if self._on_error is None else self._on_error(exc)

    def close(self) -> None:
        self._planes = ()
        with self._lock:
            self._closed = True
            fd, self.fd = self.fd, None
            now = fd is not None and self._writing == 0
        if now:
            assert fd is not None
            os.close(fd)


@dataclass(eq=False)
class Reservation:
    """A tensor's place in the current shard, fixed before any of its bytes exist: ``planes``
    are byte arrays over the staging file at the planes' final offsets (file pages, not
    process memory).  Fill them through :attr:`sink` (``sink.write(plane, offset, data)``,
    from any thread) or by writing into ``planes``, then hand the reservation to
    :meth:`ArtifactWriter.complete`, in the order the reservations were made.

    Why a sink: storing into mapped pages of freshly allocated file blocks costs a fault and
    a zeroed page per page before the bytes are copied in; ``pwrite`` copies once, and was
    several times faster (docs/performance.md, "Convert regression")."""

    name: str
    fmt_name: str
    shape: tuple[int, ...]
    role: str
    provenance: Provenance
    shard: _Shard
    offsets: list[int]
    planes: list[np.ndarray[Any, np.dtype[np.uint8]]]
    end: int
    _map: mmap.mmap | None = None
    inline: bool = False
    """Planes in process memory (small tensors), written to the file by ``complete``."""
    specs: Sequence[PlaneSpec] = ()
    physical: tuple[int, ...] = ()
    sink: _PlaneSink = field(default_factory=lambda: _PlaneSink((), (), None))

    def release(self) -> None:
        """Unmap the planes and close the sink (the caller must not use them afterwards)."""
        self.planes = []
        self.sink.close()
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still held: unmapped when dropped
                self._map.close()
            self._map = None


class RunReservation:
    """Consecutive small tensors of one shard reserved as one unit
    (:meth:`~.shardwriter.ShardWriter.reserve_run`): ``planes[i]`` are tensor ``i``'s planes,
    views of one buffer in process memory (the planes' bytes back to back, without the
    alignment gaps), filled by writing into them from any thread, then recorded and written
    to the file at their offsets by one :meth:`~.shardwriter.ShardWriter.complete_run`.

    Why one unit: one reservation object, buffer, task and write per run instead of per tensor
    (their Python objects cost more than a one-element tensor's bytes)."""

    __slots__ = ("buffer", "end", "formats", "geometry", "names", "offsets", "plane_offsets",
                 "plane_sizes", "planes", "provenances", "roles", "shard", "sizes")  # fmt: skip

    def __init__(
        self,
        shard: _Shard,
        names: list[str],
        formats: list[str],
        roles: list[str],
        provenances: list[Provenance],
        geometry: list[tuple[Any, tuple[int, ...], Sequence[PlaneSpec], tuple[int, ...]]],
        offsets: list[list[int]],
        end: int,
    ) -> None:
        self.shard, self.names, self.formats = shard, names, formats
        self.roles, self.provenances = roles, provenances
        self.geometry = geometry  # per tensor: (layout, dims, plane specs, physical extents)
        self.offsets = offsets
        self.end = end
        self.sizes: list[int] = []  # plane bytes per tensor
        self.plane_offsets: list[int] = []  # every plane's offset in the shard, in order
        self.plane_sizes: list[int] = []
        for g, offs in zip(geometry, offsets, strict=True):
            tensor = [spec.nbytes for spec in g[2]]
            self.sizes.append(sum(tensor))
            self.plane_sizes += tensor
            self.plane_offsets += offs
        buffer = np.zeros(sum(self.sizes), dtype=np.uint8)
        self.buffer: np.ndarray[Any, np.dtype[np.uint8]] | None = buffer
        planes: list[list[np.ndarray[Any, np.dtype[np.uint8]]]] = []
        at = 0
        for g in geometry:
            views = []
            for spec in g[2]:
                views.append(buffer[at : at + spec.nbytes])
                at += spec.nbytes
            planes.append(views)
        self.planes = planes

    @property
    def name(self) -> str:
        """The first tensor's name (what an error about the run as a whole names)."""
        return self.names[0]

    def release(self) -> None:
        """Drop the buffer (a late write into a plane view lands in process memory only)."""
        self.planes = []
        self.buffer = None


def _start_writeback(shard: _Shard, upto: int | None = None) -> None:
    """Start writing the shard's new whole pages to disk now, without waiting for them.

    Why: otherwise every byte sits dirty in the page cache until the final fsync, which then
    writes the whole output while the CPU idles (about 0.6 s per GB here).  On Linux
    ``POSIX_FADV_DONTNEED`` starts asynchronous writeback of a range's dirty pages (pages
    just written are dirty or under writeback, so none is dropped).  The range ends at a page
    boundary: the partly written last page gets more bytes (the next tensor's gap) and is
    handed over with the next range, so no page is written twice.  A hint only: the commit's
    fsync is still what makes the bytes durable."""
    handle = shard.handle
    if handle is None or not hasattr(os, "posix_fadvise"):
        return
    done = shard.cursor if upto is None else upto
    end = done - done % mmap.PAGESIZE
    if end - shard.written_back < _WRITEBACK_BATCH:  # also never a zero length ("to the end")
        return
    handle.flush()
    start, shard.written_back = shard.written_back, end
    with contextlib.suppress(OSError):
        os.posix_fadvise(handle.fileno(), start, end - start, os.POSIX_FADV_DONTNEED)


def _map_region(shard: _Shard, start: int, end: int) -> tuple[int, mmap.mmap]:
    """Extend the shard to ``end`` and map [start, end) writable; returns the descriptor
    the sink writes through (the caller closes it) and the mapping.  The blocks of the new
    bytes are allocated first (``posix_fallocate``), so a full disk is an ``OSError`` here,
    not a SIGBUS when a mapped page is written or a short ``pwrite`` later; the bytes read
    as zeros either way."""
    assert shard.handle is not None
    fd = os.open(shard.path, os.O_RDWR)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, shard.cursor, end - shard.cursor)
        else:  # pragma: no cover - platforms without it: a sparse extension
            os.ftruncate(fd, end)
        return fd, mmap.mmap(fd, end - start, offset=start)
    except BaseException:
        os.close(fd)
        raise
