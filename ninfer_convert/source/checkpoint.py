"""Source checkpoints: open, cross-check and read safetensors weights one tensor at a time.

Contract:

* :func:`open_source` accepts a local Hugging Face model directory (``model.safetensors``, or
  shards listed by ``model.safetensors.index.json``), a single ``.safetensors`` file, or a repo id
  ``org/name[@revision]`` found offline in the local Hugging Face cache.  A local path always wins
  over a repo id of the same spelling.
* Opening reads only metadata.  Every safetensors header is validated strictly
  (:mod:`.header`).  For a sharded directory the index is checked against every shard header
  before anything else happens, and *all* problems (missing shard file, tensor in the index but
  not in its shard, tensor in a shard but not in the index, tensor in two shards, unreadable
  shard) are reported together in one :class:`~ninfer_convert.errors.SourceError`.
* :meth:`SourceCheckpoint.read` returns one tensor's words bit-exactly: floating-point dtypes as
  unsigned words of their width (BF16/F16 ``uint16``, F32 ``uint32``, F64 ``uint64``, FP8
  ``uint8``), integer and BOOL dtypes as themselves.  No cast ever happens, so NaN payloads and
  -0.0 survive.  The array is a read-only view of a memory map of just that tensor's bytes, so
  memory follows the largest tensor being read, never the model; the map is released when the
  array is dropped.  A tensor of at most :data:`SMALL_READ_BYTES` is read into a read-only
  private buffer instead (mapping and unmapping it cost more than the copy).  The xxh3-128
  digest of the raw bytes is computed in the same pass.
* Tensors of the :data:`~.header.OPAQUE_DTYPES` (F4, F6_*, F8_*FNUZ, C64) are listed and
  digested like any other, so a ``skip`` rule can name them; :meth:`SourceCheckpoint.read`
  returns their raw bytes as a flat ``uint8`` array (``SourceTensorInfo.convertible`` is
  False), and no rule can convert them.
* Tensor names that differ but are equal after Unicode NFKC normalisation (which includes NFC)
  are refused as twins: tools downstream that normalise names would merge them.
* Side files (:attr:`SourceCheckpoint.side_files`) are the non-weight files of a model
  directory that the converter copies into the output, found by :func:`scan_side_files`
  under the rules of :data:`SIDE_FILE_LEFT_OUT` (docs/cli.md, "Side files"): regular files
  only, in subfolders too (kept with their relative path, ``1_Pooling/config.json``);
  symlinks only when they resolve inside the source directory (for a cached repo id, or a
  path to a cache snapshot folder: inside that repo's cache folder, where the snapshot's
  symlinks point); FIFOs, devices, sockets,
  symlinked folders, names that are not UTF-8 or that the container cannot store, and names
  that collide on a case-insensitive or normalising file system are a SourceError listing
  every offender.  ``config.json`` and the shard index are read the same way (regular files,
  never blocking, at most :data:`MAX_JSON_FILE_BYTES`).
* Nothing here writes; reading is thread-safe (each read maps its own region).
"""

from __future__ import annotations

import fnmatch
import math
import mmap
import os
import stat
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..container.wire import SOURCE_DIGEST_PREFIX, digest_hex
from ..errors import SourceError
from ..names import MAX_SIDE_FILE_DEPTH, side_file_key, side_file_path_problem
from ..readahead import read_ahead
from ..regular import open_regular
from .header import DTYPES, SafetensorsHeader, loads_strict_json, parse_header
from .hf_cache import looks_like_repo_id, resolve_cached_repo

__all__ = [
    "INDEX_NAME",
    "MAX_JSON_FILE_BYTES",
    "MAX_SIDE_FILES",
    "SIDE_FILE_LEFT_OUT",
    "SINGLE_NAME",
    "SideFileSource",
    "SourceArray",
    "SourceCheckpoint",
    "SourceKind",
    "SourceTensorInfo",
    "digest_bytes",
    "open_source",
    "scan_side_files",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DIGEST_PREFIX = SOURCE_DIGEST_PREFIX

SourceKind = Literal["hf-dir", "safetensors-file"]

MAX_JSON_FILE_BYTES = 100_000_000
"""Cap on ``config.json`` and ``model.safetensors.index.json`` (the safetensors header cap)."""

MAX_SIDE_FILES = 10_000
"""Most side files one model directory may have (real ones have a few dozen)."""

SMALL_READ_BYTES = 64 * 1024
"""Tensors up to this size are read with one ``pread``, larger ones are memory-mapped."""

SIDE_FILE_LEFT_OUT: tuple[tuple[str, str], ...] = (
    # (pattern on the case-folded name of a file or folder, at any depth; why it is left out)
    (".*", "hidden file or folder (.git/, .gitattributes, .DS_Store, .cache/)"),
    ("*.safetensors", "safetensors weights: the artifact holds them converted"),
    ("*.safetensors.index.json", "the safetensors shard index: the artifact has its own"),
    ("*.bin", "weights in another format (PyTorch pickle)"),
    ("*.bin.index.json", "shard index of weights in another format"),
    ("*.pt", "weights in another format (PyTorch pickle)"),
    ("*.pt.index.json", "shard index of weights in another format"),
    ("*.pth", "weights in another format (PyTorch pickle)"),
    ("*.pth.index.json", "shard index of weights in another format"),
    ("*.ckpt", "weights in another format (checkpoint)"),
    ("*.gguf", "weights in another format (GGUF)"),
    ("*.onnx", "weights in another format (ONNX)"),
    ("*.onnx_data", "weights in another format (ONNX external data)"),
    ("*.msgpack", "weights in another format (Flax)"),
    ("*.msgpack.index.json", "shard index of weights in another format"),
    ("*.h5", "weights in another format (Keras/TensorFlow)"),
    ("*.h5.index.json", "shard index of weights in another format"),
    ("*.ot", "weights in another format (rust-bert)"),
    ("*.ninfer", "a .ninfer container: the output's own file names"),
    ("*.ninfer.index.json", "a .ninfer shard index: the output's own file names"),
    ("shard-*.partial", "the converter's temporary shard file names"),
    ("desktop.ini", "operating-system junk (Windows)"),
    ("thumbs.db", "operating-system junk (Windows)"),
    ("ehthumbs.db", "operating-system junk (Windows)"),
    ("__macosx", "operating-system junk (macOS archive folder)"),
    ("icon\r", "operating-system junk (macOS folder icon)"),
)
"""What :func:`scan_side_files` does not copy: the one table (docs/cli.md, "Side files").
Everything else that is a regular file under the source directory is copied."""


def digest_bytes(data: object) -> str:
    """``"xxh3-128:<hex>"`` of a bytes-like object (the source-digest spelling)."""
    return DIGEST_PREFIX + digest_hex(data)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SourceTensorInfo:
    """Metadata of one source tensor, from its validated safetensors header entry."""

    name: str
    dtype: str
    """safetensors spelling: 'BF16', 'F16', 'F32', 'F8_E4M3', 'U8', 'I32', 'BOOL', ..."""
    shape: tuple[int, ...]
    file: str
    """File name relative to the source root (the shard holding the tensor)."""
    nbytes: int
    offset: int
    """Absolute byte offset of the tensor's data in ``file``."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # Python ints: never wraps

    @property
    def convertible(self) -> bool:
        """False for the opaque dtypes (F4, F6_*, F8_*FNUZ, C64): only skipping applies."""
        return self.dtype in DTYPES

    @property
    def word_dtype(self) -> str:
        """numpy dtype of the words :meth:`SourceCheckpoint.read` returns (``u1``, the raw
        bytes, for an opaque dtype)."""
        info = DTYPES.get(self.dtype)
        return "u1" if info is None else info.word_dtype


@dataclass(frozen=True)
class SideFileSource:
    """One side file to copy: its relative name in the output and where it is read from.

    It is path-like (``os.fspath`` and ``str`` give :attr:`path`), so it can be opened
    directly; :attr:`name` is the relative name, as ``Path.name`` is for a top-level file."""

    name: str
    """Relative path with ``/`` separators, the name it gets in the output (``a/b.json``)."""
    path: Path
    """Absolute path in the source (may be a symlink that resolves inside the source)."""
    size: int
    """Size in bytes when the source was opened."""

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:  # where it is read from, as for a Path
        return str(self.path)


@dataclass(frozen=True, eq=False)
class SourceArray:
    """One tensor as read: its exact words (read-only) and the digest of its raw bytes."""

    info: SourceTensorInfo
    words: npt.NDArray[np.generic]
    digest: str
    """``"xxh3-128:<32 hex digits>"`` of the tensor's raw little-endian bytes."""

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dtype(self) -> str:
        return self.info.dtype


class SourceCheckpoint:
    """An opened, cross-checked source.  Build it with :func:`open_source`."""

    def __init__(
        self,
        *,
        path: Path,
        kind: SourceKind,
        config: dict[str, object] | None,
        tensors: Mapping[str, SourceTensorInfo],
        files: tuple[tuple[str, int], ...],
        side_files: tuple[SideFileSource, ...],
        root: Path,
    ) -> None:
        self.path = path
        self.kind: SourceKind = kind
        self.config = config
        self.tensors: Mapping[str, SourceTensorInfo] = MappingProxyType(
            {name: tensors[name] for name in sorted(tensors)}
        )
        self.files = files
        """Weight files as ``(name, size in bytes)``, sorted by name."""
        self.side_files = side_files
        """Non-weight files of a model directory to copy to the output, sorted by name
        (see the module contract and :func:`scan_side_files`)."""
        self._root = root
        self._sizes = dict(files)
        self._paths: dict[str, Path] = {}  # weight file -> its path, built once per file

    def __repr__(self) -> str:
        return (
            f"SourceCheckpoint({str(self.path)!r}, kind={self.kind!r}, tensors={len(self.tensors)})"
        )

    def __enter__(self) -> SourceCheckpoint:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Nothing stays open between reads; present for symmetry with other readers."""

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def file_path(self, name: str) -> Path:
        """Absolute path of a weight file listed in :attr:`files`."""
        return self._root / name

    def prefetch(self, names: Iterable[str]) -> None:
        """Start reading these tensors' bytes into the page cache in the background
        (:func:`~ninfer_convert.readahead.read_ahead`): no memory is allocated and nothing
        waits.  Converters call it for the next tensors so a cold read overlaps the current
        tensor's encoding."""
        for name in names:
            info = self.tensors.get(name)
            if info is not None and info.nbytes:
                fpath = self._paths.get(info.file)
                if fpath is None:
                    fpath = self._paths[info.file] = self._root / info.file
                read_ahead(fpath, info.offset, info.nbytes)

    def read(self, name: str) -> SourceArray:
        """Read one tensor bit-exactly (see the module contract)."""
        info = self.tensors.get(name)
        if info is None:
            raise SourceError(f"no tensor named {name!r} in the source", path=str(self.path))
        fpath = self._paths.get(info.file)
        if fpath is None:
            fpath = self._paths[info.file] = self._root / info.file
        dt = np.dtype(info.word_dtype)
        try:
            fd = os.open(fpath, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            raise SourceError(
                f"cannot open: {exc.strerror or exc}", path=str(fpath), tensor=name
            ) from exc
        try:
            size = os.fstat(fd).st_size
            if size != self._sizes[info.file]:
                raise SourceError(
                    f"file is now {size} bytes but was {self._sizes[info.file]} when opened",
                    path=str(fpath),
                    tensor=name,
                    hint="the source changed during conversion",
                )
            if info.nbytes == 0:
                raw = np.zeros(0, dtype=np.uint8)
                words: npt.NDArray[np.generic] = (
                    np.zeros(info.shape, dtype=dt) if info.convertible else raw
                )
            elif info.nbytes <= SMALL_READ_BYTES:
                data = os.pread(fd, info.nbytes, info.offset)
                if len(data) != info.nbytes:  # the file shrank after the size check
                    raise SourceError(
                        f"short read: {len(data)} of {info.nbytes} bytes at {info.offset}",
                        path=str(fpath),
                        tensor=name,
                        hint="the source changed during conversion",
                    )
                raw = np.frombuffer(data, dtype=np.uint8)
                words = raw.view(dt).reshape(info.shape) if info.convertible else raw
            else:
                # mmap offsets must be multiples of the allocation granularity.
                start = info.offset - info.offset % mmap.ALLOCATIONGRANULARITY
                delta = info.offset - start
                mm = mmap.mmap(fd, delta + info.nbytes, access=mmap.ACCESS_READ, offset=start)
                raw = np.frombuffer(mm, dtype=np.uint8, count=info.nbytes, offset=delta)
                words = raw.view(dt).reshape(info.shape) if info.convertible else raw
        except OSError as exc:
            raise SourceError(
                f"cannot read: {exc.strerror or exc}", path=str(fpath), tensor=name
            ) from exc
        finally:
            os.close(fd)
        digest = digest_bytes(raw)
        if info.dtype == "BOOL" and raw.size and int(raw.max()) > 1:
            bad = int(np.argmax(raw > 1))
            raise SourceError(
                f"BOOL element {bad} holds byte 0x{int(raw[bad]):02x}; only 0 and 1 are valid",
                path=str(fpath),
                tensor=name,
            )
        return SourceArray(info=info, words=words, digest=digest)


# ---------------------------------------------------------------------------------------------
# opening


def open_source(
    spec: str | os.PathLike[str], *, cache_dir: str | Path | None = None
) -> SourceCheckpoint:
    """Open a model directory, a ``.safetensors`` file or a cached repo id (see module doc).

    ``cache_dir`` overrides the Hugging Face cache used for repo ids (default: the hub
    library's own setting, ``HF_HUB_CACHE``).
    """
    text = os.fspath(spec)
    p = Path(text).expanduser()
    try:
        found = p.exists()
    except OSError as exc:  # a name the file system cannot hold, a permission problem
        raise SourceError(f"cannot look it up: {exc.strerror or exc}", path=text) from exc
    if found:
        if p.is_dir():
            # A snapshot folder of the Hugging Face cache given as a path (what
            # snapshot_download returns) is bounded like a repo id.
            real = Path(os.path.realpath(p))
            cached = real.parent.name == "snapshots" and (real.parent.parent / "blobs").is_dir()
            return _open_dir(p, bound=_cache_bound(real) if cached else None)
        if p.is_file():
            if p.suffix != ".safetensors":
                raise SourceError(
                    "not a .safetensors file or a model directory",
                    path=str(p),
                    hint="pass the model directory, or a file ending in .safetensors",
                )
            return _open_file(p)
        raise SourceError("neither a file nor a directory", path=str(p))
    if looks_like_repo_id(text):
        snapshot = resolve_cached_repo(text, cache_dir=cache_dir)
        return _open_dir(snapshot, shown=text, bound=_cache_bound(snapshot))
    raise SourceError(
        "no such file or directory",
        path=str(p),
        hint="pass a model directory, a .safetensors file, or a cached org/name",
    )


def _cache_bound(snapshot: Path) -> Path:
    """What bounds a cache snapshot's symlinks: they point to ../../blobs/, so the repo's
    cache folder (the snapshot itself when it is not under ``snapshots/``)."""
    return snapshot.parent.parent if snapshot.parent.name == "snapshots" else snapshot


def _info(header: SafetensorsHeader, file: str) -> dict[str, SourceTensorInfo]:
    return {
        e.name: SourceTensorInfo(e.name, e.dtype, e.shape, file, e.nbytes, e.begin)
        for e in header.tensors.values()
    }


def _check_twins(tensors: Mapping[str, SourceTensorInfo], where: str) -> None:
    """Refuse distinct tensor names that are equal after NFKC normalisation."""
    seen: dict[str, str] = {}
    twins: list[str] = []
    for name in sorted(tensors):
        key = unicodedata.normalize("NFKC", name)
        other = seen.setdefault(key, name)
        if other != name:
            twins.append(f"{other!r} ({tensors[other].file}) and {name!r} ({tensors[name].file})")
    if twins:
        raise SourceError(
            f"{len(twins)} pair(s) of tensor names differ only in Unicode normalisation "
            "(equal after NFKC): " + "; ".join(twins[:20]) + (" ..." if len(twins) > 20 else ""),
            path=where,
            hint="rename one of each pair in the checkpoint; tools that normalise names would "
            "merge them",
        )


def _open_file(p: Path) -> SourceCheckpoint:
    header = parse_header(p)
    tensors = _info(header, p.name)
    _check_twins(tensors, str(p))
    return SourceCheckpoint(
        path=p,
        kind="safetensors-file",
        config=None,
        tensors=tensors,
        files=((p.name, header.file_size),),
        side_files=(),
        root=p.parent,
    )


def _open_regular(p: Path, limit: int | None) -> tuple[int, int]:
    """Open ``p`` for reading without ever blocking; return ``(fd, size)`` of a regular file.

    ``O_NONBLOCK`` makes opening a FIFO return at once; ``fstat`` on the descriptor then tells
    what was really opened (no race between a check and the open)."""
    try:
        opened = open_regular(p)
    except OSError as exc:
        raise SourceError(f"cannot open: {exc.strerror or exc}", path=str(p)) from exc
    if opened is None:
        raise SourceError(
            "is not a regular file (a FIFO, device or socket)",
            path=str(p),
            hint="replace it with a regular file or remove it",
        )
    fd, st = opened
    if limit is not None and st.st_size > limit:
        os.close(fd)
        raise SourceError(f"is {st.st_size} bytes, over the cap of {limit} bytes", path=str(p))
    return fd, st.st_size


def _read_json(p: Path) -> object:
    fd, size = _open_regular(p, MAX_JSON_FILE_BYTES)
    try:
        with os.fdopen(fd, "rb") as f:
            fd = -1
            raw = f.read(size + 1)
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}", path=str(p)) from exc
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) != size:
        raise SourceError(
            f"changed while read ({len(raw)} bytes read, {size} expected)", path=str(p)
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"is not valid UTF-8 ({exc.reason} at byte {exc.start})", path=str(p)
        ) from exc
    try:
        return loads_strict_json(text)
    except ValueError as exc:
        raise SourceError(f"not valid JSON: {exc}", path=str(p)) from exc


def _left_out(name: str) -> bool:
    folded = name.casefold()
    return any(fnmatch.fnmatchcase(folded, pattern) for pattern, _why in SIDE_FILE_LEFT_OUT)


def scan_side_files(root: Path, *, bound: Path | None = None) -> tuple[SideFileSource, ...]:
    """The side files of the model directory ``root``, sorted by relative name.

    Walks ``root`` and its subfolders (at most ``MAX_SIDE_FILE_DEPTH`` path components),
    leaves out what :data:`SIDE_FILE_LEFT_OUT` names, and refuses, in one SourceError listing
    them all: FIFOs, devices and sockets; symlinks that resolve outside ``bound`` (default:
    ``root``), dangling ones and symlinked folders; names that are not UTF-8 or that the
    container cannot store; names that collide case-insensitively or after Unicode NFC
    normalisation; more than :data:`MAX_SIDE_FILES` files.  Nothing is opened (no FIFO can
    block the scan); the copy itself re-checks each file's type on the opened descriptor."""
    fence = os.path.realpath(bound if bound is not None else root)
    found: list[SideFileSource] = []
    problems: list[str] = []
    stack: list[tuple[Path, tuple[str, ...]]] = [(root, ())]
    while stack and len(found) <= MAX_SIDE_FILES:  # stop early: the count alone refuses
        folder, parts = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"{'/'.join(parts) or '.'}/: cannot list: {exc.strerror or exc}")
            continue
        for entry in entries:
            name = entry.name
            if _left_out(name):
                continue
            rel_parts = (*parts, name)
            rel = "/".join(rel_parts)
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                problems.append(f"{rel!r}: the name is not valid UTF-8")
                continue
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if os.path.commonpath([fence, target]) != fence:
                        problems.append(f"{rel}: a symlink to {target}, outside the source")
                        continue
                st = os.stat(entry.path)  # follows a symlink; never opens, never blocks
            except (OSError, ValueError) as exc:
                problems.append(f"{rel}: cannot stat: {getattr(exc, 'strerror', None) or exc}")
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.is_symlink():
                    problems.append(f"{rel}/: a symlinked folder (copy it in instead)")
                elif len(rel_parts) >= MAX_SIDE_FILE_DEPTH:
                    problems.append(f"{rel}/: nested deeper than {MAX_SIDE_FILE_DEPTH} levels")
                else:
                    stack.append((Path(entry.path), rel_parts))
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{rel}: not a regular file (a FIFO, device or socket)")
                continue
            bad_name = side_file_path_problem(rel)
            if bad_name is not None:
                problems.append(f"{rel!r}: {bad_name}")
                continue
            found.append(SideFileSource(rel, Path(entry.path), st.st_size))
    found.sort(key=lambda f: f.name)
    if len(found) > MAX_SIDE_FILES:
        problems.append(f"more than {MAX_SIDE_FILES} side files (the cap)")
    owners: dict[str, str] = {}
    for f in found:
        names = f.name.split("/")
        # A file and a folder collide too: "A" (file) against "a/b.json".
        for i in range(1, len(names) + 1):
            rel = "/".join(names[:i])
            key = side_file_key(rel)
            other = owners.setdefault(key, rel)
            if other != rel:
                problems.append(
                    f"{other!r} and {rel!r} are the same name on a case-insensitive or "
                    "normalising file system"
                )
    if problems:
        unique = sorted(set(problems))
        raise SourceError(
            f"{len(unique)} side file problem{'s' if len(unique) != 1 else ''} "
            "(non-weight files copied to the output):\n  "
            + "\n  ".join(unique[:50])
            + (f"\n  ... and {len(unique) - 50} more" if len(unique) > 50 else ""),
            path=str(root),
            hint="remove or rename these files, or replace links with copies "
            "(docs/cli.md, 'Side files')",
        )
    return tuple(found)


def _open_dir(
    root: Path, *, shown: str | None = None, bound: Path | None = None
) -> SourceCheckpoint:
    where = shown or str(root)
    config: dict[str, object] | None = None
    cfg_path = root / "config.json"
    if cfg_path.exists():
        cfg = _read_json(cfg_path)
        if not isinstance(cfg, dict):
            raise SourceError("config.json is not a JSON object", path=str(cfg_path))
        config = cfg
    index_path = root / INDEX_NAME
    if index_path.exists():
        tensors, files = _check_index(root, index_path)
    elif (root / SINGLE_NAME).exists():  # parse_header refuses what is not a regular file
        header = parse_header(root / SINGLE_NAME)
        tensors = _info(header, SINGLE_NAME)
        files = ((SINGLE_NAME, header.file_size),)
    else:
        found = sorted(q.name for q in root.glob("*.safetensors"))
        raise SourceError(
            f"no {SINGLE_NAME} and no {INDEX_NAME}",
            path=where,
            hint=("found " + ", ".join(found) + "; pass one file directly")
            if found
            else "this is not a Hugging Face safetensors model directory",
        )
    _check_twins(tensors, where)
    return SourceCheckpoint(
        path=root if shown is None else Path(shown),
        kind="hf-dir",
        config=config,
        tensors=tensors,
        files=files,
        side_files=scan_side_files(root, bound=bound),
        root=root,
    )


def _check_index(
    root: Path, index_path: Path
) -> tuple[dict[str, SourceTensorInfo], tuple[tuple[str, int], ...]]:
    """Cross-check the index against every shard header; report every problem at once."""
    doc = _read_json(index_path)
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise SourceError('index has no "weight_map" object', path=str(index_path))
    weight_map: dict[str, object] = doc["weight_map"]
    problems: list[str] = []
    shard_names: set[str] = set()
    for tensor, shard in weight_map.items():
        if (
            not isinstance(shard, str)
            or not shard
            or len(shard) > 255
            or shard != Path(shard).name
            or shard in (".", "..")
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in shard)
        ):
            shown = shard if not isinstance(shard, str) or len(shard) <= 80 else shard[:60] + "..."
            problems.append(f"tensor {tensor!r}: shard {shown!r} is not a plain file name")
            continue
        shard_names.add(shard)

    headers: dict[str, SafetensorsHeader] = {}
    for shard in sorted(shard_names):
        sp = root / shard
        try:
            present = sp.exists()  # parse_header refuses what is not a regular file
        except OSError as exc:  # e.g. a name the file system cannot hold
            problems.append(f"shard file {shard!r}: {exc.strerror or exc}")
            continue
        if not present:
            users = sum(1 for s in weight_map.values() if s == shard)
            problems.append(
                f"shard file {shard!r} is missing ({users} tensors in the index point to it)"
            )
            continue
        try:
            headers[shard] = parse_header(sp)
        except SourceError as exc:
            problems.append(exc.render())

    owners: dict[str, list[str]] = {}
    for shard, header in headers.items():
        for tensor in header.tensors:
            owners.setdefault(tensor, []).append(shard)
    for tensor in sorted(owners):
        shards = owners[tensor]
        if len(shards) > 1:
            problems.append(f"tensor {tensor!r} is in more than one shard: " + ", ".join(shards))
        listed = weight_map.get(tensor)
        if listed is None:
            problems.append(f"tensor {tensor!r} is in shard {shards[0]!r} but not in the index")
        elif isinstance(listed, str) and listed not in shards and listed in headers:
            problems.append(
                f"tensor {tensor!r}: the index says shard {listed!r} but it is in "
                + ", ".join(repr(s) for s in shards)
            )
    for tensor, shard in sorted(weight_map.items()):
        if isinstance(shard, str) and shard in headers and tensor not in owners:
            problems.append(
                f"tensor {tensor!r} is in the index (shard {shard!r}) but not in that shard"
            )
    if problems:
        raise SourceError(
            f"the shard index does not match the shards ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}):\n  " + "\n  ".join(problems),
            path=str(index_path),
            hint="re-download or re-save the checkpoint",
        )
    # No problems: every shard is a plain name with a parsed header, and each header's tensors
    # are exactly the index entries pointing to it.
    tensors: dict[str, SourceTensorInfo] = {}
    for shard, header in headers.items():
        tensors.update(_info(header, shard))
    files = tuple((shard, headers[shard].file_size) for shard in sorted(headers))
    return tensors, files
