"""Reader of .ninfer artifacts: one file, one shard, a shard index, or a model directory.

Contract (docs/container.md, "Reading" and "Validation"):

* :func:`open_artifact` memory-maps every container file and validates the prelude and the
  whole header (schema, registries, geometry, plane placement, shard index consistency) before
  any payload byte is touched.  Every failure is an :class:`ArtifactError` naming the file (and
  the tensor when there is one) and giving the numbers; a digest mismatch is an
  :class:`IntegrityError`.  Nothing else escapes, whatever the bytes: sizes are checked against
  the file before anything is allocated, so a hostile file cannot cause a huge allocation.
* The header digest is checked at open (the header is small); pass
  ``check_header_digest=False`` to open a damaged artifact anyway and collect every problem with
  :meth:`Artifact.integrity_problems`.  Plane digests are checked only by that method and by
  :meth:`Artifact.verify_tensor` (one tensor's share of it).
* :meth:`Artifact.read` returns the logical tensor as fresh arrays (valid after ``close``);
  :meth:`Artifact.read_rows` decodes only the requested rows of a row-split tensor.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import stat
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from ..errors import ArtifactError, IntegrityError, NinferError, UsageError
from ..layouts import LAYOUTS, Rows, RowSplitK128
from ..logical import GroupedCodes, LogicalTensor
from ..readahead import read_ahead
from .checks import check_alignment, check_placement, check_side_file_name, check_tensor_geometry
from .schema import ArtifactMeta, Header, IndexFile, SchemaError, SideFile, TensorEntry
from .wire import (
    INDEX_NAME,
    MAGIC,
    MAJOR_VERSION,
    MAX_HEADER_BYTES,
    MAX_INDEX_BYTES,
    MINOR_VERSION,
    PRELUDE,
    PRELUDE_SIZE,
    SINGLE_NAME,
    canonical_json,
    header_digest,
    shard_name,
)

__all__ = ["Artifact", "PlaneInfo", "TensorInfo", "open_artifact"]

_HASH_CHUNK = 64 << 20


@dataclass(frozen=True)
class PlaneInfo:
    """One stored plane: name, absolute byte offset in its file, size, and xxh3-128 hex digest."""

    name: str
    offset: int
    nbytes: int
    digest: str


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """Header facts of one stored tensor (no payload access)."""

    name: str
    format: str
    """Canonical format name, a plain string (e.g. ``"Q4G64_F16S"``)."""
    layout: str
    shape: tuple[int, ...]
    """Logical shape."""
    physical: tuple[int, ...]
    """Padded extents as stored (layout-defined)."""
    planes: tuple[PlaneInfo, ...]
    role: str
    provenance: dict[str, Any]
    """The provenance object exactly as stored (JSON form)."""
    file: Path
    """The container file holding the tensor."""
    shard: int
    """1-based shard number (1 for a single file)."""
    entry: TensorEntry
    """The typed header entry."""

    @property
    def nbytes(self) -> int:
        """Stored bytes of all planes (alignment gaps excluded)."""
        return sum(p.nbytes for p in self.planes)


def _json_loads(raw: bytes, what: str, path: Path) -> Any:
    """Strict JSON: UTF-8 only, no duplicate keys, no NaN/Infinity, bounded integers/nesting."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ArtifactError(f"{what} repeats the JSON key {key!r}", path=str(path))
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ArtifactError(f"{what} contains {name}, which is not JSON", path=str(path))

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(
            f"{what} is not valid UTF-8 (byte {exc.start}: {exc.reason})", path=str(path)
        ) from None
    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
        # A \ud800 escape parses to a lone surrogate, which is not Unicode text: refuse it, so
        # every accepted string can be written back as UTF-8.
        canonical_json(value)
        return value
    except UnicodeEncodeError:
        raise ArtifactError(
            f"{what} contains an escaped lone surrogate, which is not Unicode text",
            path=str(path),
        ) from None
    except RecursionError:
        raise ArtifactError(f"{what} JSON is nested too deeply", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            path=str(path),
        ) from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ArtifactError(f"{what} is not acceptable JSON: {exc}", path=str(path)) from None


class _Container:
    """One memory-mapped container file whose prelude and header have been validated."""

    def __init__(self, path: Path, *, check_header_digest: bool) -> None:
        self.path = path
        self.mm: mmap.mmap | None = None
        where = str(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise ArtifactError(f"cannot open: {exc.strerror}", path=where) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ArtifactError("not a regular file", path=where)
            self.size = st.st_size
            if self.size < PRELUDE_SIZE:
                raise ArtifactError(
                    f"file is {self.size} bytes, shorter than the {PRELUDE_SIZE}-byte prelude "
                    "(truncated, or not a .ninfer file)",
                    path=where,
                )
            try:
                self.mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise ArtifactError(f"cannot memory-map: {exc}", path=where) from None
        finally:
            os.close(fd)
        try:
            self._read_header(check_header_digest)
        except BaseException:
            self.close()
            raise

    def _read_header(self, check_digest: bool) -> None:
        mm = self.mm
        assert mm is not None
        where = str(self.path)
        head = bytes(mm[:PRELUDE_SIZE])
        magic, major, minor, reserved, h_off, h_len, digest = PRELUDE.unpack(head)
        if magic != MAGIC:
            raise ArtifactError(
                f"not a .ninfer container: the first 8 bytes are {magic.hex(' ')}, expected "
                f"{MAGIC.hex(' ')}",
                path=where,
            )
        if major != MAJOR_VERSION:
            raise ArtifactError(
                f"unsupported container major version {major}; this reader supports only "
                f"version {MAJOR_VERSION}",
                path=where,
                hint="use a ninfer-convert release that reads it",
            )
        if minor > MINOR_VERSION:
            raise ArtifactError(
                f"container version {major}.{minor} is newer than this reader's "
                f"{MAJOR_VERSION}.{MINOR_VERSION}",
                path=where,
            )
        if reserved != 0:
            raise ArtifactError(f"reserved prelude field is {reserved:#x}, must be 0", path=where)
        if h_len > MAX_HEADER_BYTES:
            raise ArtifactError(
                f"header length {h_len} exceeds the {MAX_HEADER_BYTES}-byte cap", path=where
            )
        if h_off < PRELUDE_SIZE or h_off + h_len != self.size:
            raise ArtifactError(
                f"the prelude puts the header at [{h_off}, {h_off + h_len}) but the file is "
                f"{self.size} bytes; the header must start after the {PRELUDE_SIZE}-byte prelude "
                "and end exactly at the end of the file (truncated or extended file?)",
                path=where,
            )
        raw = bytes(mm[h_off : h_off + h_len])
        self.stored_digest: bytes = digest
        self.actual_digest: bytes = header_digest(head, raw)
        if check_digest and self.stored_digest != self.actual_digest:
            raise IntegrityError(
                f"header digest mismatch: stored {digest.hex()}, computed "
                f"{self.actual_digest.hex()} (the prelude or header bytes changed)",
                path=where,
                hint="run verify, or open with check_header_digest=False to inspect it",
            )
        self.header_offset = h_off
        value = _json_loads(raw, "header", self.path)
        try:
            header = Header.from_json(value)
            check_alignment(header.artifact.alignment)
            names: set[str] = set()
            for i, t in enumerate(header.tensors):
                if t.name in names:
                    raise SchemaError(f"tensors[{i}].name", f"duplicate tensor name {t.name!r}")
                names.add(t.name)
                check_tensor_geometry(t, f"tensors[{i}]")
            end = check_placement(header.tensors, header.artifact.alignment, PRELUDE_SIZE, h_off)
            if end != h_off:
                raise SchemaError(
                    "tensors",
                    f"the last plane ends at {end} but the header starts at {h_off}; the header "
                    "must follow the last plane directly",
                )
            seen: list[str] = []
            for i, f in enumerate(header.files):
                check_side_file_name(f.name, f"files[{i}].name")
                if seen and f.name <= seen[-1]:
                    raise SchemaError(
                        f"files[{i}].name", "side files must be sorted by name without repeats"
                    )
                seen.append(f.name)
        except SchemaError as exc:
            raise ArtifactError(f"invalid header: {exc.where}: {exc.message}", path=where) from None
        self.header = header

    def buffer(self, offset: int, nbytes: int) -> memoryview:
        if self.mm is None:
            raise UsageError("the artifact is closed", path=str(self.path))
        return memoryview(self.mm)[offset : offset + nbytes]

    def close(self) -> None:
        if self.mm is not None:
            # A caller may still hold a plane view; the map is then released when it is dropped.
            with contextlib.suppress(BufferError):
                self.mm.close()
            self.mm = None


def _find(path: Path) -> tuple[Path | None, Path | None]:
    """(index path, single container path) for what ``open_artifact`` was given."""
    if path.is_dir():
        index, single = path / INDEX_NAME, path / SINGLE_NAME
        if index.exists() and single.exists():
            raise ArtifactError(
                f"directory holds both {SINGLE_NAME} and {INDEX_NAME}; which one is the "
                "artifact is ambiguous",
                path=str(path),
            )
        if index.exists():
            return index, None
        if single.exists():
            return None, single
        raise ArtifactError(
            f"no artifact here: expected {SINGLE_NAME} or {INDEX_NAME}", path=str(path)
        )
    if not path.exists():
        raise ArtifactError("no such file or directory", path=str(path))
    if path.name.endswith(".index.json"):
        return path, None
    return None, path


def open_artifact(path: str | os.PathLike[str], *, check_header_digest: bool = True) -> Artifact:
    """Open a .ninfer file, one shard, a ``model.ninfer.index.json`` or a model directory."""
    index_path, single = _find(Path(path))
    if index_path is not None:
        return _open_index(Path(path), index_path, check_header_digest)
    assert single is not None  # _find returns exactly one of the two
    container = _Container(single, check_header_digest=check_header_digest)
    try:
        return Artifact(Path(path), None, [container], None)
    except BaseException:
        container.close()
        raise


def _open_index(opened: Path, index_path: Path, check_digest: bool) -> Artifact:
    where = str(index_path)
    try:
        size = index_path.stat().st_size
    except OSError as exc:
        raise ArtifactError(f"cannot read: {exc.strerror}", path=where) from None
    if size > MAX_INDEX_BYTES:
        raise ArtifactError(
            f"index is {size} bytes, over the {MAX_INDEX_BYTES}-byte cap", path=where
        )
    try:
        raw = index_path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read: {exc.strerror}", path=where) from None
    value = _json_loads(raw, "index", index_path)
    try:
        index = IndexFile.from_json(value)
    except SchemaError as exc:
        raise ArtifactError(f"invalid index: {exc.where}: {exc.message}", path=where) from None
    if canonical_json(index.to_json()) != raw:
        raise ArtifactError(
            "index is not in canonical JSON form (sorted keys, no whitespace, UTF-8)",
            path=where,
        )
    if index.version != 1:
        raise ArtifactError(f"unsupported index version {index.version}", path=where)
    count = len(index.shards)
    if count < 2:
        raise ArtifactError(
            f"index lists {count} shard(s); an index exists only for 2 or more", path=where
        )
    for i, s in enumerate(index.shards, start=1):
        if s.file != shard_name(i, count):
            raise ArtifactError(
                f"shard {i} is named {s.file!r}, expected {shard_name(i, count)!r}", path=where
            )
    containers: list[_Container] = []
    try:
        for i, s in enumerate(index.shards, start=1):
            shard_path = index_path.parent / s.file
            if not shard_path.exists():
                raise ArtifactError(f"shard {i} of {count} is missing", path=str(shard_path))
            actual = shard_path.stat().st_size
            if actual != s.size:
                raise ArtifactError(
                    f"shard is {actual} bytes but the index records {s.size} "
                    "(truncated or replaced shard)",
                    path=str(shard_path),
                )
            c = _Container(shard_path, check_header_digest=check_digest)
            containers.append(c)
            if check_digest and c.stored_digest.hex() != s.digest:
                raise IntegrityError(
                    f"shard header digest {c.stored_digest.hex()} differs from {s.digest} "
                    "recorded in the index",
                    path=str(shard_path),
                )
            if (c.header.shard.index, c.header.shard.count) != (i, count):
                raise ArtifactError(
                    f"header says shard {c.header.shard.index} of {c.header.shard.count}, the "
                    f"index says {i} of {count}",
                    path=str(shard_path),
                )
        artifact = Artifact(opened, index_path, containers, index)
    except BaseException:
        for c in containers:
            c.close()
        raise
    return artifact


class Artifact:
    """An open artifact.  Use as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        opened: Path,
        index_path: Path | None,
        containers: list[_Container],
        index: IndexFile | None,
    ) -> None:
        self.path = opened
        self.index_path = index_path
        self._containers = containers
        self._index = index
        first = containers[0].header
        self.meta: ArtifactMeta = first.artifact
        """Typed artifact metadata."""
        self.metadata: dict[str, Any] = first.artifact.to_json()
        """Artifact-level metadata as stored (producer, recipe, source, alignment)."""
        self.side_files: Mapping[str, SideFile] = {f.name: f for f in first.files}
        """Non-weight files of the model directory, recorded with size and digest."""
        self.shard_count = first.shard.count
        tensors: dict[str, TensorInfo] = {}
        self._owner: dict[str, _Container] = {}
        for number, c in enumerate(containers, start=1):
            h = c.header
            where = str(c.path)
            if h.artifact != first.artifact:
                raise ArtifactError("artifact metadata differs from the first shard's", path=where)
            if h.files != first.files:
                raise ArtifactError("side-file list differs from the first shard's", path=where)
            for t in h.tensors:
                if t.name in tensors:
                    raise ArtifactError(
                        f"tensor also stored in {tensors[t.name].file.name}",
                        path=where,
                        tensor=t.name,
                    )
                tensors[t.name] = TensorInfo(
                    name=t.name,
                    format=t.format,
                    layout=t.layout,
                    shape=t.shape,
                    physical=t.physical,
                    planes=tuple(PlaneInfo(p.name, p.offset, p.nbytes, p.digest) for p in t.planes),
                    role=t.role,
                    provenance=t.provenance.to_json(),
                    file=c.path,
                    shard=h.shard.index if index is None else number,
                    entry=t,
                )
                self._owner[t.name] = c
        if index is not None:
            where = str(index_path)
            expected = {name: info.file.name for name, info in tensors.items()}
            if dict(index.weight_map) != expected:
                missing = sorted(set(expected) - set(index.weight_map))
                extra = sorted(set(index.weight_map) - set(expected))
                moved = sorted(
                    k
                    for k in set(expected) & set(index.weight_map)
                    if expected[k] != index.weight_map[k]
                )
                raise ArtifactError(
                    "weight_map disagrees with the shard headers: "
                    f"not in the index {missing[:5]}, in no shard {extra[:5]}, "
                    f"in another shard {moved[:5]}",
                    path=where,
                )
            total = sum(info.nbytes for info in tensors.values())
            if index.total_size != total:
                raise ArtifactError(
                    f"index total_size {index.total_size} differs from the {total} plane bytes "
                    "listed by the shard headers",
                    path=where,
                )
        self.tensors: Mapping[str, TensorInfo] = types.MappingProxyType(tensors)
        """Every stored tensor by name, in stored order."""

    # -- files -------------------------------------------------------------------------------

    @property
    def files(self) -> tuple[Path, ...]:
        """The container files, in shard order (one path for a single-file artifact)."""
        return tuple(c.path for c in self._containers)

    @property
    def directory(self) -> Path:
        return self._containers[0].path.parent

    def total_bytes(self) -> int:
        """Size on disk of the container files (headers, gaps and planes)."""
        return sum(c.size for c in self._containers)

    # -- payload -----------------------------------------------------------------------------

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise UsageError(
                f"no tensor {name!r} in this artifact ({len(self.tensors)} tensors)",
                path=str(self.path),
            ) from None

    @contextmanager
    def _planes(self, info: TensorInfo) -> Iterator[list[memoryview]]:
        c = self._owner[info.name]
        views = [c.buffer(p.offset, p.nbytes) for p in info.planes]
        try:
            yield views
        finally:
            for v in views:
                with contextlib.suppress(BufferError):
                    v.release()

    def prefetch(self, name: str) -> None:
        """Start reading this tensor's planes into the page cache in the background
        (:func:`~ninfer_convert.readahead.read_ahead`); returns at once and allocates nothing.
        Readers that walk the tensors in order call it for the next one so cold reads overlap
        their work."""
        info = self._info(name)
        if info.planes:
            start = min(p.offset for p in info.planes)
            end = max(p.offset + p.nbytes for p in info.planes)
            read_ahead(self._owner[name].path, start, end - start)

    def plane_buffer(self, name: str, plane: str) -> memoryview:
        """A read-only view of one plane's stored bytes; valid until :meth:`close`."""
        info = self._info(name)
        for p in info.planes:
            if p.name == plane:
                return self._owner[name].buffer(p.offset, p.nbytes)
        raise UsageError(
            f"tensor has no plane {plane!r}; it has {[p.name for p in info.planes]}",
            tensor=name,
        )

    def _decode_error(self, info: TensorInfo, exc: NinferError) -> ArtifactError:
        return ArtifactError(f"cannot decode: {exc.message}", path=str(info.file), tensor=info.name)

    def verify_tensor(self, name: str) -> list[IntegrityError]:
        """Check the digests of one tensor's planes (a per-tensor slice of
        :meth:`integrity_problems`)."""
        info = self._info(name)
        c = self._owner[name]
        return self.plane_digest_problems(
            name, [self._hash(c, p.offset, p.nbytes) for p in info.planes]
        )

    @staticmethod
    def new_plane_digest() -> Any:
        """A fresh plane digest (xxh3-128, docs/container.md): ``update`` it with the plane's
        bytes in order and pass ``hexdigest()`` to :meth:`plane_digest_problems`; for readers
        that stream the planes for another purpose and digest them on the way."""
        return xxhash.xxh3_128()

    def plane_digest_problems(self, name: str, computed: list[str]) -> list[IntegrityError]:
        """Compare computed plane digests (hex, in plane order) with the recorded ones."""
        info = self._info(name)
        return [
            IntegrityError(
                f"plane {p.name!r} digest mismatch: stored {p.digest}, computed {actual}",
                path=str(info.file),
                tensor=name,
            )
            for p, actual in zip(info.planes, computed, strict=True)
            if actual != p.digest
        ]

    def read(self, name: str, *, verify: bool = False) -> LogicalTensor:
        """The tensor's logical representation (see :mod:`ninfer_convert.logical`).

        With ``verify=True`` the planes' digests are checked first and the first mismatch is
        raised as :class:`IntegrityError`.
        """
        info = self._info(name)
        if verify:
            problems = self.verify_tensor(name)
            if problems:
                raise problems[0]
        layout = LAYOUTS[info.layout]
        with self._planes(info) as views:
            try:
                return layout.unpack(info.format, info.shape, views)
            except (UsageError, ValueError) as exc:  # pragma: no cover - header validated
                raise self._decode_error(info, UsageError(str(exc))) from None

    def read_rows(self, name: str, rows: Rows) -> GroupedCodes:
        """Rows of a grouped tensor (slice, range, or list of row indices) without the rest."""
        info = self._info(name)
        layout = LAYOUTS[info.layout]
        if not isinstance(layout, RowSplitK128):
            raise UsageError(
                f"read_rows needs a row-split-k128-v1 tensor; this one is {info.format} in "
                f"{info.layout}",
                tensor=name,
            )
        with self._planes(info) as views:
            return layout.unpack_rows(info.format, info.shape, views, rows)

    def dequantize(self, name: str) -> npt.NDArray[np.float32]:
        """float32 values per the spec's reconstruction equations (Sections 3 and 6)."""
        from ..dequant import dequantize_logical  # numeric core; imported lazily

        info = self._info(name)
        result: npt.NDArray[np.float32] = dequantize_logical(info.format, self.read(name))
        return result

    # -- checks ------------------------------------------------------------------------------

    def integrity_problems(self, *, plane_digests: bool = True) -> list[IntegrityError]:
        """Check every digest and every gap byte; collect all problems rather than stop.

        Covers: each file's header digest, the index's per-shard digests, every plane's
        digest, zero bytes in every gap (prelude to first plane, between planes), and each
        recorded side file's presence, size and digest.  ``plane_digests=False`` leaves the
        plane digests to the caller, who then calls :meth:`verify_tensor` for every tensor
        (``verify`` does, in its per-tensor workers, so that the reads overlap other work).
        """
        problems: list[IntegrityError] = []
        for number, c in enumerate(self._containers, start=1):
            where = str(c.path)
            if c.mm is None:
                raise UsageError("the artifact is closed", path=where)
            if c.stored_digest != c.actual_digest:
                problems.append(
                    IntegrityError(
                        f"header digest mismatch: stored {c.stored_digest.hex()}, computed "
                        f"{c.actual_digest.hex()}",
                        path=where,
                    )
                )
            if self._index is not None:
                recorded = self._index.shards[number - 1].digest
                if c.stored_digest.hex() != recorded:
                    problems.append(
                        IntegrityError(
                            f"shard header digest {c.stored_digest.hex()} differs from "
                            f"{recorded} recorded in the index",
                            path=where,
                        )
                    )
            cursor = PRELUDE_SIZE
            for t in c.header.tensors:
                for p in t.planes:
                    problems += self._gap_problems(c, cursor, p.offset, t.name, p.name)
                    cursor = p.offset + p.nbytes
                if plane_digests:
                    problems += self.verify_tensor(t.name)
        problems += self._side_file_problems()
        return problems

    @staticmethod
    def _hash(c: _Container, offset: int, nbytes: int) -> str:
        h = xxhash.xxh3_128()
        pos = offset
        while pos < offset + nbytes:
            step = min(_HASH_CHUNK, offset + nbytes - pos)
            view = c.buffer(pos, step)
            h.update(view)
            view.release()
            pos += step
        return h.hexdigest()

    @staticmethod
    def _gap_problems(
        c: _Container, start: int, end: int, tensor: str, plane: str
    ) -> list[IntegrityError]:
        if end <= start:
            return []
        view = c.buffer(start, end - start)
        arr = np.frombuffer(view, dtype=np.uint8)
        nonzero = np.flatnonzero(arr)
        count = int(nonzero.size)
        first = int(nonzero[0]) + start if count else 0
        del arr
        view.release()
        if not count:
            return []
        return [
            IntegrityError(
                f"{count} non-zero byte(s) in the gap [{start}, {end}) before plane {plane!r}, "
                f"first at byte {first}",
                path=str(c.path),
                tensor=tensor,
            )
        ]

    def _side_file_problems(self) -> list[IntegrityError]:
        problems = []
        for f in self.side_files.values():
            path = self.directory / f.name
            try:
                h = xxhash.xxh3_128()
                size = 0
                with open(path, "rb") as fh:
                    while chunk := fh.read(_HASH_CHUNK):
                        h.update(chunk)
                        size += len(chunk)
            except OSError as exc:
                problems.append(
                    IntegrityError(f"side file {f.name!r}: {exc.strerror}", path=str(path))
                )
                continue
            if size != f.size or h.hexdigest() != f.digest:
                problems.append(
                    IntegrityError(
                        f"side file {f.name!r} is {size} bytes with digest {h.hexdigest()}, "
                        f"recorded {f.size} bytes with digest {f.digest}",
                        path=str(path),
                    )
                )
        return problems

    def padding_problems(self) -> list[ArtifactError]:
        """Every non-zero layout padding byte (canonical padding is all zero bits)."""
        problems: list[ArtifactError] = []
        for info in self.tensors.values():
            layout = LAYOUTS[info.layout]
            with self._planes(info) as views:
                messages = layout.padding_problems(info.format, info.shape, views)
            problems += [ArtifactError(m, path=str(info.file), tensor=info.name) for m in messages]
        return problems

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        for c in self._containers:
            c.close()

    def __enter__(self) -> Artifact:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Artifact {self.path} shards={len(self._containers)} tensors={len(self.tensors)}>"
