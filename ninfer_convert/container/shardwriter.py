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
import mmap
import os
from collections import deque
from collections.abc import Mapping, Sequence
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
    check_provenance,
    check_tensor_geometry,
    check_tensor_name,
    require_canonical_padding,
)
from .placement import (
    PlannedEntry,
    _Geometry,
    _placement,
    _starts_new_shard,
    check_writer_alignment,
)
from .runs import _naming, complete_run, reserve_checks, reserve_run
from .schema import (
    PlaneEntry,
    Provenance,
    SchemaError,
    TensorEntry,
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
_INLINE_FLUSH = 1 << 20
"""Bytes of consecutive small tensors gathered before they are written (see _stage_inline)."""


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
        (_, dims, specs, physical), prov = reserve_checks(
            self, name, fmt_name, shape, role, provenance
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

    def reserve_run(
        self, tensors: Sequence[tuple[str, str, Sequence[int], str, Provenance | Mapping[str, Any]]]
    ) -> RunReservation:
        """Reserve consecutive small tensors of one shard as one unit (see :mod:`.runs`)."""
        return reserve_run(self, tensors)

    def complete_run(self, run: RunReservation) -> list[TensorEntry]:
        """Record and write a filled run, the oldest reservation (see :mod:`.runs`)."""
        return complete_run(self, run)

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
            if planned is None or (planned.role, planned.provenance) != (role, prov):
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
