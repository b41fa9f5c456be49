"""Crash-safe, streaming writer of a .ninfer model directory (docs/container.md, "Writing").

Contract:

* ``ArtifactWriter(out_dir, metadata=..., alignment=4096, max_shard_size=None, overwrite=False)``
  stages everything in a hidden sibling directory ``.<name>.ninfer-staging-<random>`` of
  ``out_dir`` (same parent, so the final rename stays on one file system).
* ``add`` packs one tensor with its registered layout and streams its planes to the current
  shard at once; only one tensor's planes are ever in memory.  ``add_packed`` takes planes
  packed elsewhere (a worker thread).  Tensors are stored in the order they are added; the
  caller adds them in a deterministic order, and the same calls give byte-identical files.
* ``reserve`` places the next tensor before its bytes exist (same checks, offsets and shard
  choice as ``add_packed``) and returns planes over its final bytes (mapped file pages, or
  process memory for tensors of at most 256 KiB) and a ``sink`` that stores bytes there from
  any thread (a ``pwrite`` into the reserved, ``posix_fallocate``'d blocks); ``complete``
  records reservations in the order they were made, checking the padding and digesting the
  stored bytes.  The file bytes
  equal those of ``add_packed`` with the same planes (tests compare them).  ``add`` and
  ``add_packed`` are refused while a reservation is pending, and so is ``commit``.
* ``add_file`` copies a side file (config.json, tokenizer files) into the model directory.
* ``commit`` appends each shard's header, names the shards (``model.ninfer``, or
  ``model-0000i-of-0000N.ninfer`` plus ``model.ninfer.index.json``), fsyncs files and the
  staging directory and publishes it at ``out_dir`` with :mod:`.publish` (an atomic exchange
  where the OS has one; the previous state is restored on any failure before the commit point).
  Nothing exists under ``out_dir`` before that.  ``commit(before_publish=f)`` calls
  ``f(staging)`` once the staging directory is complete and just before the publish
  (``convert --sign-key`` signs there); an exception from it aborts like any other.
* The writer holds the output's lock (:class:`~.publish.OutputLock`) from construction to
  commit or abort, and on construction restores or removes what dead writers of the same output
  left (:func:`~.publish.recover_stale`; each line goes to ``on_notice`` at once and to
  :attr:`ArtifactWriter.notes`).
* Any exception or KeyboardInterrupt inside the ``with`` block (or a call to ``abort``) removes
  the staging area and leaves ``out_dir`` as it was.  A clean exit from the ``with`` block
  commits if ``commit`` was not called.
* An existing ``out_dir`` is refused with :class:`UsageError` unless it is an empty directory,
  or ``overwrite=True`` and it is a complete ``.ninfer`` model directory holding only the files
  its artifact names and ``companions`` (:func:`~.publish.check_destination`); an ``out_dir``
  that is, holds or lies inside one of ``sources`` is always refused.  Only the old artifact's
  named files are deleted, after the new one is in place.
* ``expected_bytes`` (see :func:`planned_size`) is checked against the free space before any
  byte is written.  Every ``OSError`` of the file system (disk full, quota, permission,
  read-only) becomes a :class:`ResourceError` after the staging area is removed.

Usage errors (bad names, wrong shapes, bad metadata) raise :class:`UsageError` /
:class:`FormatError` before any byte of that tensor is written, and leave the writer usable.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import NinferError, ResourceError, SourceError, UsageError
from ..formats import lookup_format
from ..layouts import Buffer, Layout, PlaneSpec, check_combination, logical_shape
from ..layouts.base import plane_u8
from ..logical import LogicalTensor
from ..regular import open_regular
from .checks import (
    GeometryCache,
    check_alignment,
    check_provenance,
    check_side_file_name,
    check_tensor_geometry,
    check_tensor_name,
    side_file_key,
)
from .publish import (
    Destination,
    Interrupted,
    OutputLock,
    StagingArea,
    check_destination,
    check_free_space,
    check_writable,
    deferred_signals,
    fsync_dir,
    pause_point,
    recover_stale,
    resource_error,
)
from .schema import (
    ArtifactMeta,
    Header,
    IndexFile,
    IndexShard,
    PlaneEntry,
    Provenance,
    SchemaError,
    ShardInfo,
    SideFile,
    TensorEntry,
)
from .wire import (
    DEFAULT_ALIGNMENT,
    INDEX_NAME,
    MAGIC,
    MAJOR_VERSION,
    MAX_HEADER_BYTES,
    MINOR_VERSION,
    PRELUDE,
    PRELUDE_SIZE,
    align_up,
    canonical_json,
    digest_hex,
    header_digest,
    new_digest,
    shard_name,
)

__all__ = [
    "ArtifactWriter",
    "Reservation",
    "WrittenTensor",
    "check_writer_alignment",
    "fsync_dir",
    "planned_size",
]

_COPY_CHUNK = 8 << 20
_ZEROS = bytes(64 << 10)
_INLINE_BYTES = 256 << 10
"""A reserved tensor with at most this many plane bytes is filled in process memory and
written by ``complete``: mapping the file for it (ftruncate, open, mmap, munmap) cost more than
the tensor (20,000 one-element tensors: about 2 s of a 14 s convert)."""
_INLINE_FLUSH = 1 << 20
"""Bytes of consecutive small tensors gathered before they are written (see _stage_inline)."""
_WRITEBACK_BATCH = 8 << 20
"""New bytes a shard gathers before their writeback is started: a flush and a
``posix_fadvise`` per tiny tensor cost about 0.8 ms each (20,000 one-page tensors: 16.5 s of a
30 s convert), while 8 MiB still starts a large tensor's writeback at once."""
INDEX_VERSION = 1


def _usage(exc: SchemaError, what: str) -> NinferError:
    return exc.as_error(UsageError, what)


def check_writer_alignment(alignment: object) -> None:
    """A usable plane alignment (an int, a power of two in [64, 2^30]), else a UsageError."""
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise UsageError(f"alignment must be an int, not {alignment!r}")
    try:
        check_alignment(alignment, "alignment")
    except SchemaError as exc:
        raise _usage(exc, "ArtifactWriter") from None


def _placement(cursor: int, nbytes: Iterable[int], alignment: int) -> tuple[list[int], int]:
    """Offsets of consecutive planes appended at ``cursor`` and the end of the last one."""
    offsets = []
    for n in nbytes:
        cursor = align_up(cursor, alignment)
        offsets.append(cursor)
        cursor += n
    return offsets, cursor


_Geometry = tuple[Layout, tuple[int, ...], Sequence[PlaneSpec], tuple[int, ...]]


def _geometry_key(fmt_name: object, shape: object) -> tuple[str, tuple[int, ...]] | None:
    """The cache key of a (format, shape) whose layout answer may be reused: exact types only
    (a list, a numpy integer or a bool dimension takes the checked path every time)."""
    if type(fmt_name) is str and type(shape) is tuple and all(type(d) is int for d in shape):
        return fmt_name, shape
    return None


def _starts_new_shard(has_tensors: bool, end: int, max_shard: int | None) -> bool:
    """docs/container.md section 8, "Sharding"."""
    return max_shard is not None and has_tensors and end > max_shard


_DIGEST_PLACEHOLDER = "0" * 32  # every digest in a header or index is 32 hex digits


def planned_size(
    tensors: Iterable[tuple[str, str, Sequence[int], str, Provenance | Mapping[str, Any]]],
    *,
    metadata: ArtifactMeta | Mapping[str, Any],
    side_files: Iterable[tuple[str, int]],
    alignment: int = DEFAULT_ALIGNMENT,
    max_shard_size: int | None = None,
) -> int:
    """The exact bytes an artifact of these ``(name, format, shape, role, provenance)`` tensors
    and ``(name, size)`` side files takes (shards with preludes, gaps, planes and headers, the
    index, the side files), laid out by the writer's own rules.  ``metadata`` must have the
    final shape (digests are fixed-length, so placeholders give the same size)."""
    check_writer_alignment(alignment)
    if isinstance(metadata, Mapping):
        metadata = ArtifactMeta.from_json({**metadata, "alignment": alignment}, "metadata")
    sides = tuple(SideFile(n, s, _DIGEST_PLACEHOLDER) for n, s in sorted(side_files))
    cursors = [PRELUDE_SIZE]
    shards: list[list[TensorEntry]] = [[]]
    geometry: dict[tuple[str, tuple[int, ...]], _Geometry] = {}
    for name, fmt_name, shape, role, provenance in tensors:
        key = _geometry_key(fmt_name, shape)
        known = None if key is None else geometry.get(key)
        if known is None:
            layout = check_combination(fmt_name, lookup_format(fmt_name).layout)
            dims = layout.check_shape(fmt_name, shape)
            known = (layout, dims, layout.planes(fmt_name, dims),
                     layout.physical_extents(fmt_name, dims))  # fmt: skip
            if key is not None:
                geometry[key] = known
        layout, dims, specs, physical = known
        offsets, end = _placement(cursors[-1], (s.nbytes for s in specs), alignment)
        if _starts_new_shard(bool(shards[-1]), end, max_shard_size):
            cursors.append(PRELUDE_SIZE)
            shards.append([])
            offsets, end = _placement(PRELUDE_SIZE, (s.nbytes for s in specs), alignment)
        planes = tuple(
            PlaneEntry(s.name, o, s.nbytes, _DIGEST_PLACEHOLDER)
            for s, o in zip(specs, offsets, strict=True)
        )
        entry = TensorEntry(
            name=name,
            format=fmt_name,
            layout=layout.name,
            shape=dims,
            physical=physical,
            planes=planes,
            role=role,
            provenance=Provenance.from_json(provenance, "provenance"),
        )
        shards[-1].append(entry)
        cursors[-1] = end
    count = len(shards)
    total = sum(f.size for f in sides)
    index_shards = []
    plane_total = 0
    for number, (cursor, entries) in enumerate(zip(cursors, shards, strict=True), start=1):
        header = Header(
            artifact=metadata, files=sides, shard=ShardInfo(number, count), tensors=tuple(entries)
        )
        size = cursor + len(canonical_json(header.to_json()))
        total += size
        index_shards.append(IndexShard(shard_name(number, count), size, _DIGEST_PLACEHOLDER))
        plane_total += sum(p.nbytes for t in entries for p in t.planes)
    if count > 1:
        weight_map = {t.name: shard_name(n, count) for n, es in enumerate(shards, 1) for t in es}
        index = IndexFile(INDEX_VERSION, plane_total, tuple(index_shards), weight_map)
        total += len(canonical_json(index.to_json()))
    return total


@contextlib.contextmanager
def _naming(tensor: str) -> Iterator[None]:
    """Attach the tensor name to an error raised by a layout, which does not know it."""
    try:
        yield
    except NinferError as exc:
        if exc.tensor is not None:
            raise
        raise exc.with_context(tensor=tensor) from exc


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


class ArtifactWriter:
    """Write one artifact tensor by tensor; see the module docstring for the contract."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        metadata: ArtifactMeta | Mapping[str, Any],
        alignment: int = DEFAULT_ALIGNMENT,
        max_shard_size: int | None = None,
        overwrite: bool = False,
        sources: Sequence[str | os.PathLike[str]] = (),
        companions: Sequence[str] = (),
        expected_bytes: int | None = None,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir).absolute()
        self._state = "new"
        check_writer_alignment(alignment)
        if max_shard_size is not None and (
            isinstance(max_shard_size, bool)
            or not isinstance(max_shard_size, int)
            or max_shard_size < 1
        ):
            raise UsageError(
                f"max_shard_size must be a positive int of bytes, not {max_shard_size!r}"
            )
        self.alignment = alignment
        self.max_shard_size = max_shard_size
        self.overwrite = overwrite
        self.expected_bytes = expected_bytes
        self._sources = tuple(Path(s) for s in sources)
        self._companions = tuple(companions)
        self._metadata = self._check_metadata(metadata)
        self.notes: list[str] = []
        """One line per stale staging folder restored or removed, or remains kept."""
        self._on_notice = on_notice
        self._names: set[str] = set()
        self._side: dict[str, SideFile] = {}
        self._side_keys: dict[str, str] = {}  # side_file_key -> name or "folder/" (add_file)
        self._shards: list[_Shard] = []
        self._reserved: deque[Reservation] = deque()  # reserved, not yet completed, in order
        self._reserved_names: set[str] = set()
        # (format, shape) -> (layout, dims, plane specs, physical extents) of shapes already
        # accepted, and the header-entry check's own cache: a MoE checkpoint repeats a few
        # shapes tens of thousands of times, and the layout's answer is the same each time.
        self._geometry: dict[tuple[str, tuple[int, ...]], _Geometry] = {}
        self._checked: GeometryCache = {}
        self._layouts: dict[str, Layout] = {}
        self._inline: tuple[_Shard, int, bytearray] | None = None  # see _stage_inline
        self._lock = OutputLock(self.out_dir)
        self._area: StagingArea | None = None
        # A usage problem is reported before anything is created.
        self._destination = self._check_destination()
        check_writable(self.out_dir)
        try:
            self.out_dir.parent.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()
            self._notify(recover_stale(self.out_dir))
            self._destination = self._check_destination()
            if expected_bytes is not None:
                check_free_space(self.out_dir.parent, expected_bytes)
            self._area = StagingArea(self.out_dir)
            self.staging = self._area.new
            self._state = "open"
            self._new_shard()
        except OSError as exc:
            self.abort()
            raise self._resource(exc, "creating the staging area") from None
        except BaseException:
            self.abort()
            raise

    def _notify(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.notes.append(line)
            if self._on_notice is not None:
                self._on_notice(line)

    def _resource(self, exc: OSError, doing: str) -> ResourceError:
        return resource_error(exc, self.out_dir, needed=self.expected_bytes, doing=doing)

    # -- context manager -----------------------------------------------------------------------

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
            if isinstance(exc, OSError):  # e.g. a side-file copy that hit a full disk
                raise self._resource(exc, "writing the artifact") from None
        elif self._state == "open":
            self.commit()

    # -- metadata ------------------------------------------------------------------------------

    def _check_metadata(self, metadata: ArtifactMeta | Mapping[str, Any]) -> ArtifactMeta:
        if isinstance(metadata, Mapping) and "alignment" not in metadata:
            metadata = {**metadata, "alignment": self.alignment}
        try:
            meta = ArtifactMeta.from_json(metadata, "metadata")
            # Round-trip through JSON so free-form parts (config) are checked for JSON-ness too;
            # the JSON form is built once and serves both the re-check and the encoding test.
            as_json = meta.to_json()
            meta = ArtifactMeta.from_json(as_json, "metadata")
            canonical_json(as_json)
        except SchemaError as exc:
            raise _usage(exc, "artifact metadata") from None
        except (TypeError, ValueError) as exc:
            raise UsageError(f"artifact metadata is not JSON-serialisable: {exc}") from None
        if meta.alignment != self.alignment:
            raise UsageError(
                f"metadata alignment {meta.alignment} differs from the writer's {self.alignment}"
            )
        return meta

    def set_metadata(self, metadata: ArtifactMeta | Mapping[str, Any]) -> None:
        """Replace the artifact metadata before commit (e.g. once every source digest is known)."""
        self._require_open()
        self._metadata = self._check_metadata(metadata)

    @property
    def metadata(self) -> ArtifactMeta:
        return self._metadata

    # -- destination ---------------------------------------------------------------------------

    def _check_destination(self) -> Destination:
        return check_destination(
            self.out_dir, force=self.overwrite, sources=self._sources, companions=self._companions
        )

    @property
    def destination(self) -> Destination:
        """What is at the output and what publishing over it deletes (checked at creation)."""
        return self._destination

    # -- shards --------------------------------------------------------------------------------

    def _new_shard(self) -> _Shard:
        number = len(self._shards) + 1
        path = self.staging / f"shard-{number:05d}.partial"
        handle = open(path, "wb")  # noqa: SIM115 - closed in _finish_payload or abort
        shard = _Shard(number, path, handle)
        self._shards.append(shard)
        # Placeholder prelude; commit rewrites it once the header is known.
        handle.write(bytes(PRELUDE_SIZE))
        return shard

    def _finish_payload(self, shard: _Shard) -> None:
        if shard.handle is not None:
            shard.handle.flush()
            os.fsync(shard.handle.fileno())
            shard.handle.close()
            shard.handle = None

    def _require_open(self) -> None:
        if self._state != "open":
            raise UsageError(f"the artifact writer is already {self._state}")

    # -- tensors -------------------------------------------------------------------------------

    def add(
        self,
        name: str,
        fmt_name: str,
        logical: LogicalTensor,
        *,
        role: str,
        provenance: Provenance | Mapping[str, Any],
    ) -> WrittenTensor:
        """Pack ``logical`` with the format's registered layout and stream it to disk."""
        self._require_open()
        layout = self._layout(fmt_name)
        self._entry_checks(name, fmt_name, role, provenance)
        shape = logical_shape(logical)
        with _naming(name):
            planes = layout.pack(fmt_name, logical)
        return self._write_mapped(name, fmt_name, shape, planes, role, provenance, False)

    def add_packed(
        self,
        name: str,
        fmt_name: str,
        shape: Sequence[int],
        planes: Sequence[Buffer],
        *,
        role: str,
        provenance: Provenance | Mapping[str, Any],
    ) -> WrittenTensor:
        """Stream planes packed elsewhere with ``lookup_layout(...).pack``; sizes and padding
        are checked against the layout before anything is written."""
        self._require_open()
        layout = self._layout(fmt_name)
        self._entry_checks(name, fmt_name, role, provenance)
        try:
            dims = layout.check_shape(fmt_name, shape)
        except NinferError as exc:
            raise UsageError(exc.message, tensor=name, hint=exc.hint) from None
        return self._write_mapped(name, fmt_name, dims, planes, role, provenance, True)

    def _write_mapped(
        self,
        name: str,
        fmt_name: str,
        shape: tuple[int, ...],
        planes: Sequence[Buffer],
        role: str,
        provenance: Provenance | Mapping[str, Any],
        check_padding: bool,
    ) -> WrittenTensor:
        try:
            written = self._write(
                name, fmt_name, shape, planes, role, provenance, check_padding=check_padding
            )
        except OSError as exc:
            self.abort()  # a full disk gets its space back at once
            raise self._resource(exc, f"writing tensor {name!r} to the staging area") from None
        pause_point("staging")
        return written

    def reserve(
        self,
        name: str,
        fmt_name: str,
        shape: Sequence[int],
        *,
        role: str,
        provenance: Provenance | Mapping[str, Any],
    ) -> Reservation:
        """Place the next tensor now (same checks, offsets and shard choice as
        :meth:`add_packed`) and return writable planes over its final bytes; nothing is
        recorded until :meth:`complete`.  The file gets the same bytes as ``add_packed`` of
        the same planes: the gaps are zero (a hole or written zeros read the same)."""
        self._require_open()
        key = _geometry_key(fmt_name, shape)
        known = None if key is None else self._geometry.get(key)
        layout = self._layout(fmt_name) if known is None else known[0]
        prov = self._entry_checks(name, fmt_name, role, provenance)
        if name in self._reserved_names:
            raise UsageError("tensor added twice", tensor=name)
        if known is None:
            try:
                dims = layout.check_shape(fmt_name, shape)
            except NinferError as exc:
                raise UsageError(exc.message, tensor=name, hint=exc.hint) from None
            with _naming(name):
                specs: Sequence[PlaneSpec] = tuple(layout.planes(fmt_name, dims))
                physical = layout.physical_extents(fmt_name, dims)
            if key is not None:
                self._geometry[key] = (layout, dims, specs, physical)
        else:
            _, dims, specs, physical = known
        shard = self._place(specs)
        offsets, end = _placement(shard.cursor, (s.nbytes for s in specs), self.alignment)
        handle = shard.handle
        assert handle is not None  # the last shard is always open
        start = shard.cursor - shard.cursor % mmap.ALLOCATIONGRANULARITY
        planes: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        mapped: mmap.mmap | None = None
        fd: int | None = None
        inline = sum(spec.nbytes for spec in specs) <= _INLINE_BYTES
        if inline:  # small: process memory, written at its offsets by complete()
            # No flush or seek of the handle: every write through it seeks first (a seek per
            # tiny tensor, with the GIL released and re-taken from busy workers, cost about
            # 140 us).
            planes = [np.zeros(spec.nbytes, dtype=np.uint8) for spec in specs]
        elif end > shard.cursor:
            handle.flush()
            try:
                fd, mapped = self._map_region(shard, start, end)
            except OSError as exc:
                self.abort()  # a full disk gets its space back at once
                raise self._resource(
                    exc, f"reserving tensor {name!r} in the staging area"
                ) from None
            whole = np.frombuffer(mapped, dtype=np.uint8)
            planes = [
                whole[o - start : o - start + s.nbytes] for o, s in zip(offsets, specs, strict=True)
            ]
        else:
            planes = [np.zeros(0, dtype=np.uint8) for _ in specs]
        shard.cursor = end
        sink = _PlaneSink(planes, offsets, fd, partial(self._sink_error, name))
        res = Reservation(name, fmt_name, dims, role, prov, shard, offsets, planes, end, mapped,
                          inline, specs, physical, sink)  # fmt: skip
        self._reserved.append(res)
        self._reserved_names.add(name)
        return res

    def _sink_error(self, name: str, exc: OSError) -> ResourceError:
        # Raised in a worker; the conversion's unwinding aborts the writer (its __exit__).
        return self._resource(exc, f"writing tensor {name!r} to the staging area")

    @staticmethod
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

    def complete(self, res: Reservation) -> WrittenTensor:
        """Record a filled reservation (the oldest one not completed): its padding is checked
        and its plane digests are taken from the stored bytes, as ``add_packed`` does."""
        self._require_open()
        if not self._reserved or self._reserved[0] is not res:
            raise UsageError("reservations must be completed in the order they were made",
                             tensor=res.name)  # fmt: skip
        layout = self._layout(res.fmt_name)
        specs, physical = res.specs, res.physical
        with _naming(res.name):
            views = [plane_u8(p, spec) for p, spec in zip(res.planes, specs, strict=True)]
            problems = layout.padding_problems(res.fmt_name, res.shape, views)
            if problems:
                raise UsageError(
                    "packed planes have non-canonical padding: " + "; ".join(problems[:4])
                )
        entries = [
            PlaneEntry(spec.name, offset, spec.nbytes, digest_hex(memoryview(plane.data)))
            for spec, offset, plane in zip(specs, res.offsets, res.planes, strict=True)
        ]
        entry = TensorEntry(
            name=res.name,
            format=res.fmt_name,
            layout=layout.name,
            shape=res.shape,
            physical=physical,
            planes=tuple(entries),
            role=res.role,
            provenance=res.provenance,
        )
        check_tensor_geometry(entry, f"tensor {res.name!r}", self._checked)
        try:
            if res.inline:
                self._stage_inline(res)
            else:
                self._flush_inline()
        except OSError as exc:
            self.abort()
            raise self._resource(exc, f"writing tensor {res.name!r} to the staging area") from None
        self._reserved.popleft()
        self._reserved_names.discard(res.name)
        res.release()
        res.shard.tensors.append(entry)
        self._names.add(res.name)
        if not res.inline:
            _start_writeback(res.shard, res.end)
        pause_point("staging")
        return WrittenTensor(entry, res.shard.number)

    def _stage_inline(self, res: Reservation) -> None:
        """Queue a small completed tensor's planes (and the zero gaps before them) behind the
        previous small one: consecutive small tensors reach the file in one ``pwrite`` per
        :data:`_INLINE_FLUSH` bytes (one ``pwrite`` per one-page tensor, each extending the
        file, cost about 230 us: 4.6 s of a 20,000-tensor convert)."""
        pend = self._inline
        if pend is None or pend[0] is not res.shard:
            self._flush_inline()
            first = res.offsets[0] if res.offsets else res.end
            pend = self._inline = (res.shard, first, bytearray())
        _shard, start, buf = pend
        for offset, plane in zip(res.offsets, res.planes, strict=True):
            buf.extend(bytes(offset - start - len(buf)))  # alignment gap: zeros
            buf.extend(memoryview(plane.data))
        if len(buf) >= _INLINE_FLUSH:
            self._flush_inline()

    def _flush_inline(self) -> None:
        """Write the queued small tensors (completed ones: only ever before any pending
        reservation of the shard, so nothing else lies inside the range)."""
        pend, self._inline = self._inline, None
        if pend is None or not pend[2]:
            return
        shard, start, buf = pend
        handle = shard.handle
        if handle is not None:  # through the shard's own handle, as every other write
            handle.seek(start)
            handle.write(buf)
            handle.flush()
            handle.seek(shard.cursor)
        else:  # the shard was finished while these tensors were in flight
            fd = os.open(shard.path, os.O_WRONLY)
            try:
                view = memoryview(buf)
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], start + done)
            finally:
                os.close(fd)
        _start_writeback(shard, start + len(buf))

    def _place(self, specs: Sequence[PlaneSpec]) -> _Shard:
        """The shard the next tensor goes to (a new one when ``max_shard_size`` says so)."""
        shard = self._shards[-1]
        _, end = _placement(shard.cursor, (s.nbytes for s in specs), self.alignment)
        # Reservations are made in order and shards only ever follow each other: when any
        # pending reservation is in this shard, the newest one is (O(1), not O(pending)).
        used = bool(shard.tensors) or bool(self._reserved and self._reserved[-1].shard is shard)
        if _starts_new_shard(used, end, self.max_shard_size):
            # Pending reservations keep their own mappings of the finished shard; the commit's
            # fsync of each shard makes their bytes durable too.
            self._finish_payload(shard)
            shard = self._new_shard()
        return shard

    def _layout(self, fmt_name: str) -> Layout:
        layout = self._layouts.get(fmt_name) if type(fmt_name) is str else None
        if layout is None:
            layout = check_combination(fmt_name, lookup_format(fmt_name).layout)
            if type(fmt_name) is str:
                self._layouts[fmt_name] = layout
        return layout

    def _entry_checks(
        self,
        name: str,
        fmt_name: str,
        role: str,
        provenance: Provenance | Mapping[str, Any],
    ) -> Provenance:
        """Check one tensor's name, role and provenance; returns the parsed provenance."""
        if not isinstance(name, str):
            raise UsageError(f"tensor name must be a string, not {name!r}")
        try:
            check_tensor_name(name, "name")
        except SchemaError as exc:
            raise UsageError(exc.message, tensor=name) from None
        if name in self._names:
            raise UsageError("tensor added twice", tensor=name)
        if not isinstance(role, str):
            raise UsageError(f"role must be a string, not {role!r}", tensor=name)
        try:
            prov = Provenance.from_json(provenance, "provenance")
            check_provenance(prov, fmt_name, "provenance")
        except SchemaError as exc:
            raise UsageError(exc.message, tensor=name, where=exc.where) from None
        try:
            canonical_json([name, role, prov.to_json()])
        except UnicodeEncodeError as exc:
            raise UsageError(f"not encodable as UTF-8: {exc.reason}", tensor=repr(name)) from None
        return prov

    def _write(
        self,
        name: str,
        fmt_name: str,
        shape: tuple[int, ...],
        planes: Sequence[Buffer],
        role: str,
        provenance: Provenance | Mapping[str, Any],
        *,
        check_padding: bool,
    ) -> WrittenTensor:
        if self._reserved:
            raise UsageError("complete the pending reservations before adding a tensor",
                             tensor=name)  # fmt: skip
        layout = self._layout(fmt_name)
        with _naming(name):
            specs = layout.planes(fmt_name, shape)
            physical = layout.physical_extents(fmt_name, shape)
            if isinstance(planes, (bytes, bytearray, memoryview, np.ndarray)) or len(planes) != len(
                specs
            ):
                raise UsageError(
                    f"{fmt_name} needs {len(specs)} planes ({', '.join(s.name for s in specs)})"
                )
            views = [plane_u8(p, s) for p, s in zip(planes, specs, strict=True)]
            if check_padding:
                problems = layout.padding_problems(fmt_name, shape, views)
                if problems:
                    raise UsageError(
                        "packed planes have non-canonical padding: " + "; ".join(problems[:4])
                    )
        prov = Provenance.from_json(provenance, "provenance")

        shard = self._shards[-1]
        _, end = _placement(shard.cursor, (s.nbytes for s in specs), self.alignment)
        if _starts_new_shard(bool(shard.tensors), end, self.max_shard_size):
            self._finish_payload(shard)
            shard = self._new_shard()

        handle = shard.handle
        if handle is None:  # pragma: no cover - the last shard is always open
            raise RuntimeError("current shard is closed")
        # Queued small tensors first: a later one would otherwise pad its gap over this
        # tensor's bytes.  Small reservations move the cursor, not the handle: seek to it.
        self._flush_inline()
        handle.seek(shard.cursor)
        entries = []
        for spec, view in zip(specs, views, strict=True):
            offset = align_up(shard.cursor, self.alignment)
            gap = offset - shard.cursor
            while gap:
                step = min(gap, len(_ZEROS))
                handle.write(_ZEROS[:step])
                gap -= step
            data = memoryview(view.data)
            handle.write(data)
            entries.append(PlaneEntry(spec.name, offset, spec.nbytes, digest_hex(data)))
            shard.cursor = offset + spec.nbytes
        _start_writeback(shard)
        entry = TensorEntry(
            name=name,
            format=fmt_name,
            layout=layout.name,
            shape=shape,
            physical=physical,
            planes=tuple(entries),
            role=role,
            provenance=prov,
        )
        # The writer and the reader share one validator; this cannot fail unless they diverge.
        check_tensor_geometry(entry, f"tensor {name!r}")
        shard.tensors.append(entry)
        self._names.add(name)
        return WrittenTensor(entry, shard.number)

    # -- side files ----------------------------------------------------------------------------

    def add_file(self, src_path: str | os.PathLike[str], dest_name: str) -> SideFile:
        """Copy a non-weight file into the model directory under ``dest_name``.

        ``dest_name`` is a relative path with ``/`` separators (``1_Pooling/config.json``;
        docs/container.md section 4.6); folders are created in the staging directory.  Names
        equal after case folding and NFC normalisation, or a file and a folder of the same
        name, are refused (they would collide on a case-insensitive file system).  The source
        is opened without blocking and must be a regular file (``fstat`` of the opened
        descriptor, so a FIFO or device never reaches a read); exactly the size ``fstat``
        reported is copied, and a file that shrinks or grows meanwhile is a SourceError."""
        self._require_open()
        if not isinstance(dest_name, str):
            raise UsageError(f"side file name must be a string, not {dest_name!r}")
        try:
            check_side_file_name(dest_name, "dest_name")
            dest_name.encode("utf-8")
        except SchemaError as exc:
            raise UsageError(exc.message) from None
        except UnicodeEncodeError:
            raise UsageError(f"side file name {dest_name!r} is not encodable as UTF-8") from None
        if dest_name in self._side:
            raise UsageError(f"side file {dest_name!r} added twice")
        parts = dest_name.split("/")
        keys = [side_file_key("/".join(parts[: i + 1])) for i in range(len(parts))]
        for i, key in enumerate(keys):
            mine = "/".join(parts[: i + 1]) + ("" if i == len(parts) - 1 else "/")
            other = self._side_keys.get(key)
            if other is not None and other != mine:
                raise UsageError(
                    f"side file {dest_name!r}: {mine!r} and {other!r} would be the same name "
                    "on a case-insensitive file system"
                )
        src = Path(src_path)
        try:
            opened = open_regular(src)
        except OSError as exc:
            raise UsageError(f"side file {src} cannot be opened: {exc.strerror or exc}") from None
        if opened is None:
            raise UsageError(f"side file {src} is not a regular file (a FIFO, device or socket)")
        fd, st = opened
        with open(fd, "rb", buffering=0) as fin:
            if len(parts) > 1:
                (self.staging / dest_name).parent.mkdir(parents=True, exist_ok=True)
            h = new_digest()
            size = 0
            with open(self.staging / dest_name, "xb") as fout:
                while size < st.st_size:
                    chunk = fin.read(min(_COPY_CHUNK, st.st_size - size))
                    if not chunk:
                        break
                    h.update(chunk)
                    fout.write(chunk)
                    size += len(chunk)
                if size != st.st_size or fin.read(1):
                    raise SourceError(
                        f"side file changed while it was copied ({st.st_size} bytes when opened)",
                        path=str(src),
                        hint="do not modify the source during conversion",
                    )
                fout.flush()
                os.fsync(fout.fileno())
        info = SideFile(dest_name, size, h.hexdigest())
        self._side[dest_name] = info
        for i, key in enumerate(keys):
            self._side_keys[key] = "/".join(parts[: i + 1]) + ("" if i == len(parts) - 1 else "/")
        return info

    # -- commit / abort ------------------------------------------------------------------------

    def commit(self, *, before_publish: Callable[[Path], object] | None = None) -> Path:
        """Finish every shard, write the index, and publish the staging directory at ``out_dir``
        (after ``before_publish(staging)``, when given)."""
        self._require_open()
        try:
            return self._commit(before_publish)
        except Interrupted as exc:
            if self._state == "committed":  # the signal came during the publish: it finished
                exc.published = self.out_dir
            else:
                self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise self._resource(exc, "finishing the artifact") from None
        except BaseException:
            if self._state != "committed":
                self.abort()
            raise

    def _commit(self, before_publish: Callable[[Path], object] | None = None) -> Path:
        if self._reserved:
            raise UsageError(f"{len(self._reserved)} reserved tensor(s) were never completed",
                             tensor=self._reserved[0].name)  # fmt: skip
        self._flush_inline()
        self._state = "committing"
        pause_point("commit")
        count = len(self._shards)
        files = tuple(self._side[k] for k in sorted(self._side))
        index_shards = []
        weight_map: dict[str, str] = {}
        total = 0
        for shard in self._shards:
            self._finish_payload(shard)
            header = Header(
                artifact=self._metadata,
                files=files,
                shard=ShardInfo(shard.number, count),
                tensors=tuple(shard.tensors),
            )
            raw = canonical_json(header.to_json())
            if len(raw) > MAX_HEADER_BYTES:
                raise UsageError(
                    f"shard {shard.number} header is {len(raw)} bytes, over the "
                    f"{MAX_HEADER_BYTES}-byte cap",
                    hint="use a smaller max_shard_size so each shard lists fewer tensors",
                )
            head = PRELUDE.pack(
                MAGIC, MAJOR_VERSION, MINOR_VERSION, 0, shard.cursor, len(raw), bytes(16)
            )
            digest = header_digest(head, raw)
            prelude = head[:32] + digest
            with open(shard.path, "r+b") as fh:
                fh.seek(shard.cursor)
                fh.write(raw)
                fh.truncate()
                fh.seek(0)
                fh.write(prelude)
                fh.flush()
                os.fsync(fh.fileno())
            final = shard_name(shard.number, count)
            os.replace(shard.path, self.staging / final)
            size = shard.cursor + len(raw)
            index_shards.append(IndexShard(final, size, digest.hex()))
            for t in shard.tensors:
                weight_map[t.name] = final
                total += sum(p.nbytes for p in t.planes)
        if count > 1:
            index = IndexFile(INDEX_VERSION, total, tuple(index_shards), weight_map)
            with open(self.staging / INDEX_NAME, "wb") as fh:
                fh.write(canonical_json(index.to_json()))
                fh.flush()
                os.fsync(fh.fileno())
        if before_publish is not None:
            before_publish(self.staging)
        fsync_dir(self.staging)
        self._publish()
        return self.out_dir

    def _publish(self) -> None:
        area = self._area
        assert area is not None  # open implies a staging area
        # Signals wait until the renames are done and the state is recorded: the output name
        # then holds the old or the new artifact and we know which.
        with deferred_signals():
            # Re-checked here: the output may have changed while we were writing.
            self._destination = self._check_destination()
            area.publish(self._destination)
            self._state = "committed"
            try:
                area.finish(self._destination)
            finally:
                self._notify(area.notes)
                self._lock.release()

    def abort(self) -> None:
        """Discard everything written so far; ``out_dir`` is left untouched."""
        if self._state == "committed":
            return
        with deferred_signals():  # a second Ctrl-C must not leave half a staging area
            for res in self._reserved:
                res.release()
            for shard in self._shards:
                if shard.handle is not None:
                    with contextlib.suppress(OSError):  # best effort while unwinding
                        shard.handle.close()
                    shard.handle = None
            if self._area is not None:
                self._area.discard()
            self._lock.release()
            self._state = "aborted"
