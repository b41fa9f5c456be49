"""The open artifact: its tensors, their planes, values and integrity checks.

Contract (docs/container.md, "Reading" and "Validation"): an :class:`Artifact` is built by
:func:`~ninfer_convert.container.open_artifact` from containers whose headers are already
valid; it checks what spans files (every shard agrees on the artifact metadata and side-file
list, no tensor is stored twice, the index's weight map and total size match the shard
headers), pins every side file's descriptor and lists stray container-like names.
:attr:`Artifact.tensors` holds one :class:`TensorInfo` per tensor, a view of the typed
header entry (no per-tensor copy).  :meth:`Artifact.read` returns fresh arrays (valid after
``close``); :meth:`Artifact.read_rows` decodes only the requested rows of a row-split tensor;
the digest, gap and side-file checks are :mod:`.integrity`'s.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ArtifactError, IntegrityError, NinferError, UsageError
from ..layouts import LAYOUTS, Rows, RowSplitK128
from ..logical import DirectWords, GroupedCodes, LogicalTensor
from ..readahead import read_ahead
from .container_file import ContainerFile
from .dir_snapshot import SideHandle
from .integrity import container_problems, plane_digest, side_file_check, side_file_range
from .schema import ArtifactMeta, IndexFile, PlaneEntry, SideFile, TensorEntry
from .wire import INDEX_NAME, SINGLE_NAME, new_digest, parse_shard_name

__all__ = ["Artifact", "PlaneInfo", "TensorInfo"]


PlaneInfo = PlaneEntry
"""One stored plane: the header's own :class:`~ninfer_convert.container.schema.PlaneEntry`
(name, absolute byte offset in its file, size, and xxh3-128 hex digest)."""


class TensorInfo:
    """Header facts of one stored tensor (no payload access): the typed header entry with the
    file that holds it.  The entry's fields are read through it, not copied (a 100,000-tensor
    artifact opens without building a second object per tensor and plane)."""

    __slots__ = ("entry", "file", "shard")

    def __init__(self, entry: TensorEntry, file: Path, shard: int) -> None:
        self.entry = entry
        """The typed header entry."""
        self.file = file
        """The container file holding the tensor."""
        self.shard = shard
        """1-based shard number (1 for a single file)."""

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def format(self) -> str:
        """Canonical format name, a plain string (e.g. ``"Q4G64_F16S"``)."""
        return self.entry.format

    @property
    def layout(self) -> str:
        return self.entry.layout

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape."""
        return self.entry.shape

    @property
    def physical(self) -> tuple[int, ...]:
        """Padded extents as stored (layout-defined)."""
        return self.entry.physical

    @property
    def planes(self) -> tuple[PlaneEntry, ...]:
        return self.entry.planes

    @property
    def role(self) -> str:
        return self.entry.role

    @property
    def provenance(self) -> dict[str, Any]:
        """The provenance object exactly as stored (JSON form; a fresh dict per access, built
        from :attr:`entry` on demand: keeping one per tensor cost time and about 1.5 KB each
        when opening a 100,000-tensor artifact)."""
        return self.entry.provenance.to_json()

    @property
    def nbytes(self) -> int:
        """Stored bytes of all planes (alignment gaps excluded)."""
        return sum(p.nbytes for p in self.entry.planes)

    def __repr__(self) -> str:
        return f"TensorInfo({self.entry!r}, file={str(self.file)!r}, shard={self.shard})"


def _strays(
    dir_fd: int, containers: list[ContainerFile], index: IndexFile | None
) -> tuple[str, ...]:
    ours = {c.path.name for c in containers}
    if index is not None:
        ours.add(INDEX_NAME)
    try:
        names = os.listdir(dir_fd)
    except OSError as exc:
        raise ArtifactError(
            f"cannot list the directory: {exc.strerror}", path=str(containers[0].path.parent)
        ) from None
    return tuple(
        sorted(
            n
            for n in names
            if n not in ours
            and (n in (SINGLE_NAME, INDEX_NAME) or n.endswith(".ninfer") or parse_shard_name(n))
        )
    )


def _check_index(index: IndexFile, index_path: Path | None, tensors: dict[str, TensorInfo]) -> None:
    """Refuse an index whose weight map or total size disagrees with the shard headers."""
    where = str(index_path)
    expected = {name: info.file.name for name, info in tensors.items()}
    if dict(index.weight_map) != expected:
        missing = sorted(set(expected) - set(index.weight_map))
        extra = sorted(set(index.weight_map) - set(expected))
        moved = sorted(
            k for k in set(expected) & set(index.weight_map) if expected[k] != index.weight_map[k]
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


class Artifact:
    """An open artifact.  Use as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        opened: Path,
        index_path: Path | None,
        containers: list[ContainerFile],
        index: IndexFile | None,
        *,
        dir_fd: int,
        whole_directory: bool,
    ) -> None:
        self.path = opened
        self.index_path = index_path
        self._containers = containers
        self._index = index
        self._dir_fd: int | None = dir_fd
        """The model directory, opened once, through which every file was opened; held
        until :meth:`close` so the snapshot's directory can be told apart from whatever the
        name holds later."""
        first = containers[0].header
        self.meta: ArtifactMeta = first.artifact
        """Typed artifact metadata."""
        self.side_files: Mapping[str, SideFile] = {f.name: f for f in first.files}
        """Non-weight files of the model directory, recorded with size and digest."""
        self.shard_count = first.shard.count
        tensors: dict[str, TensorInfo] = {}
        self._owner: dict[str, ContainerFile] = {}
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
                tensors[t.name] = TensorInfo(t, c.path, h.shard.index if index is None else number)
                self._owner[t.name] = c
        if index is not None:
            _check_index(index, index_path, tensors)
        self.tensors: Mapping[str, TensorInfo] = types.MappingProxyType(tensors)
        """Every stored tensor by name, in stored order."""
        self._side: dict[str, SideHandle] = {}
        try:
            for f in first.files:
                self._side[f.name] = SideHandle.open(dir_fd, f.name, self.directory / f.name)
            self.stray_files: tuple[str, ...] = (
                _strays(dir_fd, containers, index) if whole_directory else ()
            )
            """Names in the model directory that look like container files (``*.ninfer``, a
            shard name, the index) but are not part of this artifact; empty when one shard or
            a file that is not the directory's ``model.ninfer`` was opened."""
        except BaseException:
            self._close_side()
            raise

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        """Artifact-level metadata as stored (producer, recipe, source, alignment); built on
        first use (its source tensor table is as long as the model's tensor list)."""
        return self.meta.to_json()

    # -- files -------------------------------------------------------------------------------

    @property
    def files(self) -> tuple[Path, ...]:
        """The container files, in shard order (one path for a single-file artifact)."""
        return tuple(c.path for c in self._containers)

    @property
    def directory(self) -> Path:
        return self._containers[0].path.parent

    @property
    def file_sizes(self) -> tuple[int, ...]:
        """Sizes of the container files as opened, in shard order (like :attr:`files`)."""
        return tuple(c.size for c in self._containers)

    def total_bytes(self) -> int:
        """Size on disk of the container files (headers, gaps and planes)."""
        return sum(c.size for c in self._containers)

    def read_side_file(self, name: str) -> bytes:
        """The bytes of the recorded side file ``name`` (e.g. ``config.json``) from the same
        directory snapshot as the containers, checked against its recorded size and digest.

        Reads at most the recorded size: a file of another size is refused before it is read.
        A side file that is missing, a symbolic link, not a regular file or changed raises
        :class:`IntegrityError`; a name the header does not list is a :class:`UsageError`."""
        problem, data = self._side_check(self._side_file(name), keep=True)
        if problem is not None:
            raise problem
        assert data is not None
        return data

    def check_side_file(self, name: str) -> None:
        """:meth:`read_side_file`'s checks and errors, reading the file in chunks and keeping
        nothing: for a side file too large to hold, read in parts by :meth:`read_side_range`."""
        problem, _ = self._side_check(self._side_file(name), keep=False)
        if problem is not None:
            raise problem

    def read_side_range(self, name: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of the recorded side file ``name``, through the
        descriptor pinned at open and within its recorded size (a range past it is a
        :class:`UsageError`).  The part is not digest-checked: :meth:`check_side_file` checks
        the whole file, and a caller that reads a part later checks that part itself."""
        f = self._side_file(name)
        path = str(self.directory / name)
        return side_file_range(f, self._side.get(name), path, self.path, offset, size)

    def _side_file(self, name: str) -> SideFile:
        f = self.side_files.get(name)
        if f is None:
            raise UsageError(
                f"no side file {name!r} in this artifact; it records {sorted(self.side_files)}",
                path=str(self.path),
            )
        return f

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

    def mapping_of(self, name: str) -> mmap.mmap:
        """The read-only map of the file storing ``name``, valid until :meth:`close` (for checks
        that slice many tiny planes: a :meth:`plane_buffer` each cost more than comparing)."""
        return self._owner[self._info(name).name].mapping()

    def _decode_error(self, info: TensorInfo, exc: NinferError) -> ArtifactError:
        return ArtifactError(f"cannot decode: {exc.message}", path=str(info.file), tensor=info.name)

    def verify_tensor(self, name: str) -> list[IntegrityError]:
        """Check the digests of one tensor's planes (a per-tensor slice of
        :meth:`integrity_problems`)."""
        info = self._info(name)
        c = self._owner[name]
        return self.plane_digest_problems(
            name, [plane_digest(c, p.offset, p.nbytes) for p in info.planes]
        )

    @staticmethod
    def new_plane_digest() -> Any:
        """A fresh plane digest (xxh3-128, docs/container.md): ``update`` it with the plane's
        bytes in order and pass ``hexdigest()`` to :meth:`plane_digest_problems`; for readers
        that stream the planes for another purpose and digest them on the way."""
        return new_digest()

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

    def dequantize(self, name: str) -> npt.NDArray[np.float32] | npt.NDArray[np.int32]:
        """Values per the spec's reconstruction equations (Sections 3 and 6): float32 for
        every format except I32, whose values are integers and come back exactly as int32
        (binary32 would round every odd value above 2^24)."""
        from ..dequant import dequantize_logical  # numeric core; imported lazily

        info = self._info(name)
        logical = self.read(name)
        if info.format == "I32":
            assert isinstance(logical, DirectWords)
            exact: npt.NDArray[np.int32] = np.ascontiguousarray(logical.words).view(np.int32)
            return exact
        result: npt.NDArray[np.float32] = dequantize_logical(info.format, logical)
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
        verify = self.verify_tensor if plane_digests else None
        problems = container_problems(self._containers, self._index, verify)
        problems += self._side_file_problems()
        return problems

    def integrity_order(self, path: str | None, tensor: str | None) -> tuple[int, int]:
        """Where a problem about the file ``path`` and ``tensor`` falls in the order of
        :meth:`integrity_problems`: shard by shard in index order, a shard's own problems before
        its tensors' (in stored order), side files after every shard.  A caller that finds some
        of these problems itself (verify checks plane digests in its workers) sorts by this key
        to report them as this reader does."""
        shards, tensors = self._integrity_positions
        shard = shards.get(path or "", len(shards))
        return shard, -1 if tensor is None else tensors.get(tensor, -1)

    @functools.cached_property
    def _integrity_positions(self) -> tuple[dict[str, int], dict[str, int]]:
        shards = {str(c.path): i for i, c in enumerate(self._containers)}
        return shards, {name: i for i, name in enumerate(self.tensors)}

    def _side_file_problems(self) -> list[IntegrityError]:
        problems = []
        for f in self.side_files.values():
            problem, _ = self._side_check(f, keep=False)
            if problem is not None:
                problems.append(problem)
        return problems

    def _side_check(self, f: SideFile, *, keep: bool) -> tuple[IntegrityError | None, bytes | None]:
        """(problem, bytes when ``keep``) of one side file (:func:`.integrity.side_file_check`)."""
        path = str(self.directory / f.name)
        return side_file_check(f, self._side.get(f.name), path, self.path, keep=keep)

    def padding_problems(self) -> list[ArtifactError]:
        """Every non-zero layout padding byte (canonical padding is all zero bits)."""
        problems: list[ArtifactError] = []
        for info in self.tensors.values():
            layout = LAYOUTS[info.layout]
            if not layout.has_padding():  # nothing to report: no plane needs mapping
                continue
            with self._planes(info) as views:
                messages = layout.padding_problems(info.format, info.shape, views)
            problems += [
                ArtifactError(m, kind="nonzero_padding", path=str(info.file), tensor=info.name)
                for m in messages
            ]
        return problems

    # -- lifetime ----------------------------------------------------------------------------

    def _side_missing(self) -> bool:
        return any(h.missing for h in self._side.values())

    def _close_side(self) -> None:
        for handle in getattr(self, "_side", {}).values():
            handle.close()

    def close(self) -> None:
        for c in self._containers:
            c.close()
        self._close_side()
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

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
