"""Runs of small tensors reserved and completed as one unit by the shard writer
(:meth:`~.shardwriter.ShardWriter.reserve_run`, :meth:`~.shardwriter.ShardWriter.complete_run`;
docs/container.md, "Writing").

Contract: a run is the longest prefix of the tensors given that lies in one shard, every
tensor checked and placed exactly as ``reserve`` checks and places it alone; its planes are
views of one buffer in process memory (:class:`~.shardfile.RunReservation`).  Completing it
checks every tensor's padding, takes its plane digests from the buffer, checks its header
entry (in bulk: :func:`~.checks.check_entries_geometry`) and writes the run with its zero gaps
in one write through the shard's handle (plane by plane, the gaps left as holes, when a wide
alignment spreads it over more than :data:`_RUN_SPAN_BYTES`).  The file bytes are those of
``add_packed`` of the same planes (tests compare them).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .._startup import pause_point
from ..errors import NinferError, ResourceError, UsageError
from ..layouts import Layout, PlaneSpec
from .checks import GeometryCache, check_entries_geometry, require_canonical_padding
from .placement import PlannedEntry, _Geometry, _geometry_key, _placement, _starts_new_shard
from .schema import PlaneEntry, Provenance, TensorEntry, make_plane_entry, make_tensor_entry
from .shardfile import RunReservation, _Shard, _start_writeback
from .wire import digest_hex


class ShardWriter(Protocol):
    """What the run functions use of :class:`~.shardwriter.ShardWriter` (a protocol, so that
    this module, which the writer imports, does not import it back)."""

    alignment: int
    max_shard_size: int | None
    _checked: GeometryCache
    _geometry: dict[tuple[str, tuple[int, ...]], _Geometry]
    _names: set[str]
    _planned: Mapping[str, PlannedEntry]
    _reserved: deque[Any]
    _reserved_names: set[str]

    def abort(self) -> None: ...
    def _require_open(self) -> None: ...
    def _resource(self, exc: OSError, doing: str) -> ResourceError: ...
    def _layout(self, fmt_name: str) -> Layout: ...
    def _flush_inline(self) -> None: ...
    def _place(self, specs: Sequence[PlaneSpec]) -> tuple[_Shard, list[int], int]: ...
    def _entry_checks(
        self, name: str, fmt_name: str, role: str, provenance: Provenance | Mapping[str, Any]
    ) -> Provenance: ...


__all__ = ["complete_run", "reserve_checks", "reserve_run"]

_GATHER_BYTES = 64 << 10
"""Plane bytes of a run up to which ``complete_run`` places them with one index array (8
bytes of index per byte); a larger run is copied plane by plane."""
_RUN_SPAN_BYTES = 16 << 20
"""File bytes (planes and gaps) of a run up to which ``complete_run`` writes it in one piece;
a run spread wider by a large alignment is written plane by plane."""


@contextlib.contextmanager
def _naming(tensor: str) -> Iterator[None]:
    """Attach the tensor name to an error raised by a layout, which does not know it."""
    try:
        yield
    except NinferError as exc:
        if exc.tensor is not None:
            raise
        raise exc.with_context(tensor=tensor) from exc


def _where(entry: TensorEntry) -> str:
    return f"tensor {entry.name!r}"


def reserve_checks(
    writer: ShardWriter,
    name: str,
    fmt_name: str,
    shape: Sequence[int],
    role: str,
    provenance: Provenance | Mapping[str, Any],
) -> tuple[_Geometry, Provenance]:
    """Every check :meth:`reserve` makes of one tensor, in its order; returns its geometry
    (layout, dims, plane specs, physical extents) and parsed provenance."""
    key = _geometry_key(fmt_name, shape)
    known = None if key is None else writer._geometry.get(key)
    layout = writer._layout(fmt_name) if known is None else known[0]
    prov = writer._entry_checks(name, fmt_name, role, provenance)
    if name in writer._reserved_names:
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
            writer._geometry[key] = known
    return known, prov


def reserve_run(
    writer: ShardWriter,
    tensors: Sequence[tuple[str, str, Sequence[int], str, Provenance | Mapping[str, Any]]],
) -> RunReservation:
    """Reserve consecutive ``(name, format, shape, role, provenance)`` tensors as one unit
    (:class:`RunReservation`): the longest prefix of ``tensors`` (at least the first) that
    lies in one shard, each tensor checked and placed as :meth:`reserve` places it
    (``len(run.names)`` says how many were taken; reserve the rest with another call).
    Their planes are views of one buffer in process memory, so a run is meant for small
    tensors; :meth:`complete_run` records and writes them all.  A tensor refused leaves
    the writer as it was before the call."""
    writer._require_open()
    if not tensors:
        raise UsageError("a run of reserved tensors needs at least one tensor")
    # Every tensor is checked before anything is placed: placing the first may start a new
    # shard, which a refused tensor after it must not leave behind (empty).
    checked: list[tuple[str, str, str, Provenance, _Geometry]] = []
    taken: set[str] = set()
    for name, fmt_name, shape, role, provenance in tensors:
        known, prov = reserve_checks(writer, name, fmt_name, shape, role, provenance)
        if name in taken:
            raise UsageError("tensor added twice", tensor=name)
        taken.add(name)
        checked.append((name, fmt_name, role, prov, known))
    shard: _Shard | None = None
    cursor = 0
    offsets: list[list[int]] = []
    alignment, max_shard = writer.alignment, writer.max_shard_size
    for _, _, _, _, known in checked:
        if shard is None:
            shard, offs, cursor = writer._place(known[2])  # may start a new shard
        else:
            offs, end = _placement(cursor, [spec.nbytes for spec in known[2]], alignment)
            if _starts_new_shard(True, end, max_shard):
                break  # the rest starts the next shard: another run (checked again then)
            cursor = end
        offsets.append(offs)
    assert shard is not None
    taken_now = checked[: len(offsets)]
    names = [c[0] for c in taken_now]
    run = RunReservation(shard, names, [c[1] for c in taken_now], [c[2] for c in taken_now],
                         [c[3] for c in taken_now], [c[4] for c in taken_now], offsets,
                         cursor)  # fmt: skip
    shard.cursor = cursor
    writer._reserved.append(run)
    writer._reserved_names.update(names)
    return run


def complete_run(writer: ShardWriter, run: RunReservation) -> list[TensorEntry]:
    """Record a filled run (the oldest reservation not completed) and write its bytes:
    every tensor's padding is checked, its plane digests taken from the stored bytes and
    its header entry checked as :meth:`complete` does, then the run reaches the file in
    one write (with the zero gaps between its planes); returns the header entries."""
    writer._require_open()
    if not writer._reserved or writer._reserved[0] is not run:
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
    check_entries_geometry(entries, _where, writer._checked)
    try:
        writer._flush_inline()  # queued single tensors first: their range ends before ours
        _write_run(run)
    except OSError as exc:
        writer.abort()
        raise writer._resource(exc, f"writing tensor {run.name!r} to the staging area") from None
    writer._reserved.popleft()
    writer._reserved_names.difference_update(run.names)
    run.release()
    shard = run.shard
    base = len(shard.tensors)
    planned_of = writer._planned.get
    for i, entry in enumerate(entries):
        if (planned := planned_of(entry.name)) is not None and planned.placed_as(entry):
            shard.entry_json[base + i] = planned.filled(entry)
    shard.tensors.extend(entries)
    writer._names.update(run.names)
    _start_writeback(shard, run.end)
    pause_point("staging")
    return entries


def _write_run(run: RunReservation) -> None:
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
        _write_planes(run)
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


def _write_planes(run: RunReservation) -> None:
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
