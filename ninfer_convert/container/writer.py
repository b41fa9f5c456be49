"""Crash-safe, streaming writer of a .ninfer model directory (docs/container.md, "Writing").

Contract:

* ``ArtifactWriter(out_dir, metadata=..., alignment=4096, max_shard_size=None, overwrite=False)``
  stages everything in a hidden sibling directory ``.<name>.ninfer-staging-<random>`` of
  ``out_dir`` (same parent, so the final rename stays on one file system).
* ``add``, ``add_packed``, ``reserve`` and ``complete`` store tensors in the staging shard
  files: one tensor's planes in memory at a time, in the order they are added, the same calls
  giving byte-identical files (:mod:`.shardwriter` has their contract; :mod:`.placement` the
  placement and sharding rules, which :func:`planned_size` shares).
* ``adopt_shard`` takes over the next shard whose payload another process wrote (a cluster
  task of ``convert --ray``, :mod:`ninfer_convert.cluster`), after checking its header entries
  and its size; the writer then takes no other tensor.
* ``add_file`` copies a side file (config.json, tokenizer files) into the model directory
  (:mod:`.sidefiles`); ``add_stream`` writes a generated one of a declared size from chunks.
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
* ``planned`` (filled by ``planned_size(planned=...)``): the header entries planned for the
  tensors; a tensor stored exactly as planned (name, format, shape, role, provenance, plane
  offsets) gets its header JSON by filling its digests into the planned entry's JSON instead
  of being encoded again at commit.  The header bytes are the same either way.

Usage errors (bad names, wrong shapes, bad metadata) raise :class:`UsageError` /
:class:`FormatError` before any byte of that tensor is written, and leave the writer usable.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._startup import pause_point
from ..errors import ResourceError, UsageError
from .checks import check_tensor_geometry
from .metadata_json import metadata_json
from .placement import (
    INDEX_VERSION,
    PlannedEntry,
    _placement,
    _starts_new_shard,
    _usage,
    check_writer_alignment,
    entry_json,
    header_json,
    planned_size,
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
    recover_stale,
    resource_error,
)
from .schema import (
    ArtifactMeta,
    IndexFile,
    IndexShard,
    Provenance,
    SchemaError,
    ShardInfo,
    SideFile,
    TensorEntry,
)
from .shardfile import Reservation, WrittenTensor, _Shard
from .shardwriter import ShardWriter
from .sidefiles import SideFiles
from .wire import (
    DEFAULT_ALIGNMENT,
    INDEX_NAME,
    MAGIC,
    MAJOR_VERSION,
    MAX_HEADER_BYTES,
    MINOR_VERSION,
    PRELUDE,
    PRELUDE_SIZE,
    canonical_json,
    header_digest,
    shard_name,
)

__all__ = [
    "ArtifactWriter",
    "PlannedEntry",
    "Reservation",
    "WrittenTensor",
    "check_writer_alignment",
    "fsync_dir",
    "planned_size",
]


class ArtifactWriter(ShardWriter):
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
        planned: Mapping[str, PlannedEntry] | None = None,
    ) -> None:
        self.out_dir = Path(out_dir).absolute()
        self._state = "new"
        super().__init__(alignment, max_shard_size)
        if planned is not None:
            self._planned = planned
        self.overwrite = overwrite
        self.expected_bytes = expected_bytes
        self._sources = tuple(Path(s) for s in sources)
        self._companions = tuple(companions)
        self._metadata = self._check_metadata(metadata)
        self.notes: list[str] = []
        """One line per stale staging folder restored or removed, or remains kept."""
        self._on_notice = on_notice
        self._side_files = SideFiles()
        self._adopted = False  # shards written elsewhere were adopted: no tensor is added
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
            # The encoding test's bytes are what every shard header holds (commit).
            encoded = metadata_json(as_json)
        except SchemaError as exc:
            raise _usage(exc, "artifact metadata") from None
        except (TypeError, ValueError) as exc:
            raise UsageError(f"artifact metadata is not JSON-serialisable: {exc}") from None
        if meta.alignment != self.alignment:
            raise UsageError(
                f"metadata alignment {meta.alignment} differs from the writer's {self.alignment}"
            )
        self._metadata_json = encoded
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

    def _require_open(self) -> None:
        if self._state != "open":
            raise UsageError(f"the artifact writer is already {self._state}")

    # -- shards written elsewhere -----------------------------------------------------------

    def adopt_shard(
        self, path: str | os.PathLike[str], *, payload_end: int, tensors: Sequence[TensorEntry]
    ) -> None:
        """Take over the next shard, whose payload another process wrote (a cluster task,
        :mod:`ninfer_convert.cluster`): ``path``, a file directly in the staging directory,
        holds :data:`PRELUDE_SIZE` placeholder bytes and then the ``tensors``' planes (header
        entries whose digests were taken from the stored bytes), ending at ``payload_end``.
        The entries are checked as :meth:`complete` checks its own (geometry, names, planes
        inside the payload, in order); ``commit`` then finishes the shard like any other.  The
        first adoption discards the empty shard the writer opened; after one, the writer takes
        no other tensor."""
        self._require_open()
        if self._reserved:
            raise UsageError("complete the pending reservations before adopting a shard")
        shard_path = Path(path)
        if shard_path.parent != self.staging:
            raise UsageError(f"an adopted shard must lie in the staging directory {self.staging}",
                             path=str(shard_path))  # fmt: skip
        if not self._adopted:
            last = self._shards[-1]
            if last.tensors or last.cursor != PRELUDE_SIZE or self._inline is not None:
                raise UsageError("shards are adopted into a writer that holds no tensor yet")
        cursor = PRELUDE_SIZE
        names: set[str] = set()
        for entry in tensors:
            where = f"adopted shard {shard_path.name}: tensor {entry.name!r}"
            try:
                check_tensor_geometry(entry, where, self._checked)
            except SchemaError as exc:
                raise exc.as_error(UsageError, where) from None
            if entry.name in self._names or entry.name in names:
                raise UsageError("tensor added twice", tensor=entry.name)
            # The writer's own placement, exactly: any other offset leaves gaps no digest
            # covers and bytes that differ from a local run's.
            offsets, end = _placement(cursor, (p.nbytes for p in entry.planes), self.alignment)
            for plane, want in zip(entry.planes, offsets, strict=True):
                if plane.offset != want:
                    raise UsageError(f"plane {plane.name!r} at offset {plane.offset}, not at the "
                                     f"writer's own offset {want} (alignment {self.alignment})",
                                     path=str(shard_path), tensor=entry.name)  # fmt: skip
            if _starts_new_shard(bool(names), end, self.max_shard_size):
                raise UsageError(f"the tensor ends at {end}, past max_shard_size "
                                 f"{self.max_shard_size}: the writer starts a new shard there",
                                 path=str(shard_path), tensor=entry.name)  # fmt: skip
            cursor = end
            names.add(entry.name)
        if cursor != payload_end:
            raise UsageError(f"the planes end at {cursor}, the payload at {payload_end}: bytes "
                             "after the last plane, or planes past the payload's end",
                             path=str(shard_path))  # fmt: skip
        try:
            size = shard_path.stat().st_size
        except OSError as exc:
            raise self._resource(exc, "adopting a shard") from None
        if size != payload_end:
            raise UsageError(f"the shard payload has {size} bytes, not {payload_end}",
                             path=str(shard_path))  # fmt: skip
        if not self._adopted:  # the empty shard opened for the next tensor goes
            last = self._shards.pop()
            self._finish_payload(last)
            last.path.unlink()
            self._adopted = True
        number = len(self._shards) + 1
        self._shards.append(_Shard(number, shard_path, None, payload_end, list(tensors)))
        self._names.update(names)

    def _entry_checks(
        self, name: str, fmt_name: str, role: str, provenance: Provenance | Mapping[str, Any]
    ) -> Provenance:
        if self._adopted:  # every tensor added goes through this check first
            raise UsageError("the writer holds adopted shards and takes no other tensor",
                             tensor=name)  # fmt: skip
        return super()._entry_checks(name, fmt_name, role, provenance)

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
        return self._side_files.add(self.staging, src_path, dest_name)

    def add_stream(
        self, dest_name: str, size: int, chunks: Iterable[bytes | bytearray | memoryview]
    ) -> SideFile:
        """Write a generated side file (the importance vectors, the compensation factors) of
        exactly ``size`` bytes into the model directory from ``chunks``, consumed one at a
        time, so the file never has to be held whole; the names are those of
        :meth:`add_file`, and chunks that add up to another size are a UsageError."""
        self._require_open()
        return self._side_files.add_stream(self.staging, dest_name, size, chunks)

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
        files = self._side_files.entries()
        index_shards = []
        weight_map: dict[str, str] = {}
        total = 0
        for shard in self._shards:
            self._finish_payload(shard)
            known = shard.entry_json
            if list(known) == list(range(len(shard.tensors))):  # every entry planned, in order
                entries = list(known.values())
            else:
                entries = [known.get(i) or entry_json(t) for i, t in enumerate(shard.tensors)]
            raw = header_json(
                self._metadata,
                files,
                ShardInfo(shard.number, count),
                entries,
                metadata_json=self._metadata_json,
            )
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
            if count > 1:  # the index's: a single file has none
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
