"""Tensors into the shard files of a staging directory (docs/container.md, "Writing"): the
part of :class:`~.writer.ArtifactWriter` that places, checks and stores tensors.

Contract:

* ``add`` packs one tensor with its registered layout and streams its planes to the current
  shard at once; only one tensor's planes are ever in memory.  ``add_packed`` takes planes
  packed elsewhere (a worker thread).  Tensors are stored in the order they are added; the
  caller adds them in a deterministic order, and the same calls give byte-identical files.
* ``reserve`` places the next tensor before its bytes exist (same checks, offsets and shard
  choice as ``add_packed``) and returns planes over its final bytes (mapped file pages, or
  process memory for tensors of at most 256 KiB) and a ``sink`` that stores bytes there from
  any thread (a ``pwrite`` into the reserved, ``posix_fallocate``'d blocks); ``complete``
  records reservations in the order they were made, checking the padding and digesting the
  stored bytes.  ``reserve_run`` reserves consecutive tensors of one shard as one unit (the
  same checks and offsets per tensor; planes are views of one buffer in process memory) and
  ``complete_run`` records them all (padding, digests and header checks per tensor) and
  writes the run, gaps included, in one write.  The file bytes equal those of ``add_packed``
  with the same planes (tests compare them).  ``add`` and ``add_packed`` are refused while a
  reservation is pending, and so is ``commit``.
* Usage errors (bad names, wrong shapes) raise :class:`UsageError` / :class:`FormatError`
  before any byte of that tensor is written, and leave the writer usable; an ``OSError`` of
  the file system becomes a :class:`ResourceError` once the writer is aborted (the module
  contract of :mod:`.writer`).

:class:`ShardWriter` is a base class: the artifact writer gives it the staging directory
(``staging``), the open check, the typed resource error and ``abort``.
"""

from __future__ import annotations

import abc
import contextlib
import mmap
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from .._startup import pause_point
from ..errors import NinferError, ResourceError, UsageError
from ..formats import lookup_format
from ..layouts import Buffer, Layout, PlaneSpec, check_combination, logical_shape
from ..layouts.base import plane_u8
from ..logical import LogicalTensor
from .checks import (
    GeometryCache,
    check_entries_geometry,
    check_provenance,
    check_tensor_geometry,
    check_tensor_name,
    require_canonical_padding,
)
from .placement import (
    PlannedEntry,
    _Geometry,
    _geometry_key,
    _placement,
    _starts_new_shard,
    check_writer_alignment,
)
from .schema import (
    PlaneEntry,
    Provenance,
    SchemaError,
    TensorEntry,
    make_plane_entry,
    make_tensor_entry,
)
from .shardfile import (
    Reservation,
    RunReservation,
    WrittenTensor,
    _map_region,
    _PlaneSink,
    _Shard,
    _start_writeback,
)
from .wire import PRELUDE_SIZE, align_up, canonical_json, digest_hex

__all__ = ["ShardWriter"]

_ZEROS = bytes(64 << 10)
_INLINE_BYTES = 256 << 10
"""A reserved tensor with at most this many plane bytes is filled in process memory and
written by ``complete``: mapping the file for it (ftruncate, open, mmap, munmap) cost more than
the tensor (20,000 one-element tensors: about 2 s of a 14 s convert)."""
_GATHER_BYTES = 64 << 10
"""Plane bytes of a run up to which ``complete_run`` places them with one index array (8
bytes of index per byte); a larger run is copied plane by plane."""
_RUN_SPAN_BYTES = 16 << 20
"""File bytes (planes and gaps) of a run up to which ``complete_run`` writes it in one piece;
a run spread wider by a large alignment is written plane by plane."""
_INLINE_FLUSH = 1 << 20
"""Bytes of consecutive small tensors gathered before they are written (see _stage_inline)."""


def _where(entry: TensorEntry) -> str:
    return f"tensor {entry.name!r}"


@contextlib.contextmanager
def _naming(tensor: str) -> Iterator[None]:
    """Attach the tensor name to an error raised by a layout, which does not know it."""
    try:
        yield
    except NinferError as exc:
        if exc.tensor is not None:
            raise
        raise exc.with_context(tensor=tensor) from exc


class ShardWriter(abc.ABC):
    """Places tensors into staging shard files; see the module docstring for the contract."""

    staging: Path
    """The directory the shard files are written in (set by the subclass before any shard)."""

    def __init__(self, alignment: int, max_shard_size: int | None) -> None:
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
        self._names: set[str] = set()
        self._shards: list[_Shard] = []
        self._reserved: deque[Reservation | RunReservation] = (
            deque()
        )  # reserved, not yet completed, in order
        self._reserved_names: set[str] = set()
        # (format, shape) -> (layout, dims, plane specs, physical extents) of shapes already
        # accepted, and the header-entry check's own cache: a MoE checkpoint repeats a few
        # shapes tens of thousands of times, and the layout's answer is the same each time.
        self._geometry: dict[tuple[str, tuple[int, ...]], _Geometry] = {}
        self._checked: GeometryCache = {}
        self._layouts: dict[str, Layout] = {}
        self._inline: tuple[_Shard, int, bytearray] | None = None  # see _stage_inline
        # planned_size's entries and JSON, set by the subclass (see ArtifactWriter's planned).
        self._planned: Mapping[str, PlannedEntry] = {}

    @abc.abstractmethod
    def abort(self) -> None:
        """Discard everything written so far."""

    @abc.abstractmethod
    def _require_open(self) -> None:
        """Raise a UsageError unless tensors may be added now."""

    @abc.abstractmethod
    def _resource(self, exc: OSError, doing: str) -> ResourceError:
        """The typed error for a failed file-system call while ``doing`` something."""

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
        (_, dims, specs, physical), prov = self._reserve_checks(
            name, fmt_name, shape, role, provenance
        )
        shard, offsets, end = self._place(specs)
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
                fd, mapped = _map_region(shard, start, end)
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

    def _reserve_checks(
        self,
        name: str,
        fmt_name: str,
        shape: Sequence[int],
        role: str,
        provenance: Provenance | Mapping[str, Any],
    ) -> tuple[_Geometry, Provenance]:
        """Every check :meth:`reserve` makes of one tensor, in its order; returns its geometry
        (layout, dims, plane specs, physical extents) and parsed provenance."""
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
            known = (layout, dims, specs, physical)
            if key is not None:
                self._geometry[key] = known
        return known, prov

    def reserve_run(
        self, tensors: Sequence[tuple[str, str, Sequence[int], str, Provenance | Mapping[str, Any]]]
    ) -> RunReservation:
        """Reserve consecutive ``(name, format, shape, role, provenance)`` tensors as one unit
        (:class:`RunReservation`): the longest prefix of ``tensors`` (at least the first) that
        lies in one shard, each tensor checked and placed as :meth:`reserve` places it
        (``len(run.names)`` says how many were taken; reserve the rest with another call).
        Their planes are views of one buffer in process memory, so a run is meant for small
        tensors; :meth:`complete_run` records and writes them all.  A tensor refused leaves
        the writer as it was before the call."""
        self._require_open()
        if not tensors:
            raise UsageError("a run of reserved tensors needs at least one tensor")
        names: list[str] = []
        formats: list[str] = []
        roles: list[str] = []
        provs: list[Provenance] = []
        geometry: list[_Geometry] = []
        offsets: list[list[int]] = []
        taken: set[str] = set()
        shard: _Shard | None = None
        cursor = 0
        alignment, max_shard = self.alignment, self.max_shard_size
        for name, fmt_name, shape, role, provenance in tensors:
            known, prov = self._reserve_checks(name, fmt_name, shape, role, provenance)
            if name in taken:
                raise UsageError("tensor added twice", tensor=name)
            sizes = [spec.nbytes for spec in known[2]]
            if shard is None:
                shard, offs, cursor = self._place(known[2])  # may start a new shard
            else:
                offs, end = _placement(cursor, sizes, alignment)
                if _starts_new_shard(True, end, max_shard):
                    break  # the rest starts the next shard: another run
                cursor = end
            taken.add(name)
            names.append(name)
            formats.append(fmt_name)
            roles.append(role)
            provs.append(prov)
            geometry.append(known)
            offsets.append(offs)
        assert shard is not None
        run = RunReservation(shard, names, formats, roles, provs, geometry, offsets, cursor)
        shard.cursor = cursor
        self._reserved.append(run)
        self._reserved_names.update(names)
        return run

    def complete_run(self, run: RunReservation) -> list[TensorEntry]:
        """Record a filled run (the oldest reservation not completed) and write its bytes:
        every tensor's padding is checked, its plane digests taken from the stored bytes and
        its header entry checked as :meth:`complete` does, then the run reaches the file in
        one write (with the zero gaps between its planes); returns the header entries."""
        self._require_open()
        if not self._reserved or self._reserved[0] is not run:
            raise UsageError("reservations must be completed in the order they were made",
                             tensor=run.name)  # fmt: skip
        entries: list[TensorEntry] = []
        plane, tensor = make_plane_entry, make_tensor_entry
        for name, fmt_name, role, prov, (layout, dims, specs, physical), offs, planes in zip(
            run.names, run.formats, run.roles, run.provenances, run.geometry, run.offsets,
            run.planes, strict=True,
        ):  # fmt: skip
            if layout.has_padding():  # else require_canonical_padding has nothing to check
                require_canonical_padding(layout, fmt_name, dims, planes, name)
            if len(specs) == 1:  # direct formats: no generator for one plane
                spec = specs[0]
                stored: tuple[PlaneEntry, ...] = (
                    plane(spec.name, offs[0], spec.nbytes, digest_hex(planes[0].data)),
                )
            else:
                stored = tuple(
                    plane(spec.name, offset, spec.nbytes, digest_hex(view.data))
                    for spec, offset, view in zip(specs, offs, planes, strict=True)
                )
            entries.append(tensor(name, fmt_name, layout.name, dims, physical, stored, role, prov))
        check_entries_geometry(entries, _where, self._checked)
        try:
            self._flush_inline()  # queued single tensors first: their range ends before ours
            self._write_run(run)
        except OSError as exc:
            self.abort()
            raise self._resource(exc, f"writing tensor {run.name!r} to the staging area") from None
        self._reserved.popleft()
        self._reserved_names.difference_update(run.names)
        run.release()
        shard = run.shard
        base = len(shard.tensors)
        planned_of = self._planned.get
        for i, entry in enumerate(entries):
            if (planned := planned_of(entry.name)) is not None and planned.placed_as(entry):
                shard.entry_json[base + i] = planned.filled(entry)
        shard.tensors.extend(entries)
        self._names.update(run.names)
        _start_writeback(shard, run.end)
        pause_point("staging")
        return entries

    def _write_run(self, run: RunReservation) -> None:
        """The run's planes at their offsets, the gaps between them as zeros, in one write
        from the first plane's offset through the shard's handle."""
        buffer = run.buffer
        if buffer is None or not run.plane_offsets:
            return
        offsets = np.array(run.plane_offsets, dtype=np.int64)
        sizes = np.array(run.plane_sizes, dtype=np.int64)
        start = int(offsets[0])
        span = int(offsets[-1] + sizes[-1]) - start  # offsets ascend
        if span <= 0:
            return
        shard = run.shard
        if span > _RUN_SPAN_BYTES:  # wide alignment gaps: each plane alone, the gaps holes
            self._write_planes(run)
            return
        out = np.zeros(span, dtype=np.uint8)
        if buffer.size <= _GATHER_BYTES:
            # Byte k of the buffer goes to k + (its plane's offset - start - where the plane
            # starts in the buffer): one scatter for the run, not a slice per plane.
            shift = offsets - start - (np.cumsum(sizes) - sizes)
            out[np.arange(buffer.size) + np.repeat(shift, sizes)] = buffer
        else:
            at = 0
            for offset, n in zip(run.plane_offsets, run.plane_sizes, strict=True):
                out[offset - start : offset - start + n] = buffer[at : at + n]
                at += n
        handle = shard.handle
        if handle is not None:  # through the shard's own handle, as every other write
            handle.seek(start)
            handle.write(out.data)
            handle.flush()
            handle.seek(shard.cursor)
        else:  # the shard was finished while these tensors were in flight
            fd = os.open(shard.path, os.O_WRONLY)
            try:
                rest = out.data
                done = 0
                while done < span:
                    done += os.pwrite(fd, rest[done:], start + done)
            finally:
                os.close(fd)

    def _write_planes(self, run: RunReservation) -> None:
        """The run's planes one by one at their offsets (the gaps between them are not
        written: a hole reads as the zeros a written gap holds)."""
        assert run.buffer is not None
        shard = run.shard
        handle = shard.handle
        fd = os.open(shard.path, os.O_WRONLY) if handle is None else None
        try:
            if handle is not None:
                handle.flush()
            at = 0
            for offset, n in zip(run.plane_offsets, run.plane_sizes, strict=True):
                view = run.buffer[at : at + n].data
                at += n
                if handle is not None:
                    handle.seek(offset)
                    handle.write(view)
                    continue
                assert fd is not None
                done = 0
                while done < n:
                    done += os.pwrite(fd, view[done:], offset + done)
            if handle is not None:
                handle.flush()
                handle.seek(shard.cursor)
        finally:
            if fd is not None:
                os.close(fd)

    def _sink_error(self, name: str, exc: OSError) -> ResourceError:
        # Raised in a worker; the conversion's unwinding aborts the writer (its __exit__).
        return self._resource(exc, f"writing tensor {name!r} to the staging area")

    def complete(self, res: Reservation) -> WrittenTensor:
        """Record a filled reservation (the oldest one not completed): its padding is checked
        and its plane digests are taken from the stored bytes, as ``add_packed`` does."""
        self._require_open()
        if not self._reserved or self._reserved[0] is not res:
            raise UsageError("reservations must be completed in the order they were made",
                             tensor=res.name)  # fmt: skip
        layout = self._layout(res.fmt_name)
        specs, physical = res.specs, res.physical
        require_canonical_padding(layout, res.fmt_name, res.shape, res.planes, res.name)
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
        if (planned := self._planned.get(res.name)) is not None and planned.placed_as(entry):
            res.shard.entry_json[len(res.shard.tensors)] = planned.filled(entry)
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
            gap = offset - start - len(buf)  # alignment gap: zeros, not a new bytes per tensor
            buf.extend(memoryview(_ZEROS)[:gap] if gap <= len(_ZEROS) else bytes(gap))
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

    def _place(self, specs: Sequence[PlaneSpec]) -> tuple[_Shard, list[int], int]:
        """The next tensor's shard (new when ``max_shard_size`` says so), offsets and end."""
        shard = self._shards[-1]
        offsets, end = _placement(shard.cursor, (s.nbytes for s in specs), self.alignment)
        # Reservations are in order, shards follow each other: is the newest one here? (O(1))
        used = bool(shard.tensors) or bool(self._reserved and self._reserved[-1].shard is shard)
        if _starts_new_shard(used, end, self.max_shard_size):
            # Pending reservations keep their own mappings of the finished shard; the commit's
            # fsync of each shard makes their bytes durable too.
            self._finish_payload(shard)
            shard = self._new_shard()
            offsets, end = _placement(shard.cursor, (s.nbytes for s in specs), self.alignment)
        return shard, offsets, end

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
        planned = self._planned.get(name)  # its JSON shows that the same strings encode
        try:
            if planned is None or (planned.entry.role, planned.entry.provenance) != (role, prov):
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
                require_canonical_padding(layout, fmt_name, shape, views, name)
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
