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
  array is dropped.  The xxh3-128 digest of the raw bytes is computed in the same pass.
* Nothing here writes; reading is thread-safe (each read maps its own region).
"""

from __future__ import annotations

import math
import mmap
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Literal

import numpy as np
import numpy.typing as npt
import xxhash

from ..errors import SourceError
from ..readahead import read_ahead
from .header import DTYPES, SafetensorsHeader, loads_strict_json, parse_header
from .hf_cache import looks_like_repo_id, resolve_cached_repo

__all__ = [
    "INDEX_NAME",
    "SINGLE_NAME",
    "SourceArray",
    "SourceCheckpoint",
    "SourceKind",
    "SourceTensorInfo",
    "digest_bytes",
    "open_source",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DIGEST_PREFIX = "xxh3-128:"

SourceKind = Literal["hf-dir", "safetensors-file"]

# Weight files of other serialisations are not copied as side files: they duplicate the
# safetensors weights (often at full size) and are never part of the output model directory.
_OTHER_WEIGHT_SUFFIXES = (
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".gguf",
    ".onnx",
    ".ot",
    ".safetensors",
)
_OTHER_WEIGHT_INDEX = re.compile(r".*\.(bin|pt|pth|safetensors|msgpack|h5)\.index\.json")


def digest_bytes(data: object) -> str:
    """``"xxh3-128:<hex>"`` of a bytes-like object (the source-digest spelling)."""
    return DIGEST_PREFIX + xxhash.xxh3_128(data).hexdigest()  # type: ignore[arg-type]


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
    def word_dtype(self) -> str:
        """numpy dtype of the words :meth:`SourceCheckpoint.read` returns."""
        return DTYPES[self.dtype].word_dtype


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
        side_files: tuple[Path, ...],
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
        """Non-weight files of a model directory to copy to the output, sorted by name."""
        self._root = root
        self._sizes = dict(files)

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
                read_ahead(self._root / info.file, info.offset, info.nbytes)

    def read(self, name: str) -> SourceArray:
        """Read one tensor bit-exactly (see the module contract)."""
        info = self.tensors.get(name)
        if info is None:
            raise SourceError(f"no tensor named {name!r} in the source", path=str(self.path))
        fpath = self._root / info.file
        dt = np.dtype(DTYPES[info.dtype].word_dtype)
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
                words: npt.NDArray[np.generic] = np.zeros(info.shape, dtype=dt)
            else:
                # mmap offsets must be multiples of the allocation granularity.
                start = info.offset - info.offset % mmap.ALLOCATIONGRANULARITY
                delta = info.offset - start
                mm = mmap.mmap(fd, delta + info.nbytes, access=mmap.ACCESS_READ, offset=start)
                raw = np.frombuffer(mm, dtype=np.uint8, count=info.nbytes, offset=delta)
                words = raw.view(dt).reshape(info.shape)
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
    if p.exists():
        if p.is_dir():
            return _open_dir(p)
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
        return _open_dir(resolve_cached_repo(text, cache_dir=cache_dir), shown=text)
    raise SourceError(
        "no such file or directory",
        path=str(p),
        hint="pass a model directory, a .safetensors file, or a cached org/name",
    )


def _info(header: SafetensorsHeader, file: str) -> dict[str, SourceTensorInfo]:
    return {
        e.name: SourceTensorInfo(e.name, e.dtype, e.shape, file, e.nbytes, e.begin)
        for e in header.tensors.values()
    }


def _open_file(p: Path) -> SourceCheckpoint:
    header = parse_header(p)
    return SourceCheckpoint(
        path=p,
        kind="safetensors-file",
        config=None,
        tensors=_info(header, p.name),
        files=((p.name, header.file_size),),
        side_files=(),
        root=p.parent,
    )


def _read_json(p: Path) -> object:
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read: {exc}", path=str(p)) from exc
    try:
        return loads_strict_json(text)
    except ValueError as exc:
        raise SourceError(f"not valid JSON: {exc}", path=str(p)) from exc


def _side_files(root: Path) -> tuple[Path, ...]:
    out = []
    for entry in sorted(root.iterdir(), key=lambda q: q.name):
        name = entry.name
        if name.startswith(".") or not entry.is_file():
            continue
        if name == INDEX_NAME or name.endswith(_OTHER_WEIGHT_SUFFIXES):
            continue
        if _OTHER_WEIGHT_INDEX.fullmatch(name):
            continue
        out.append(entry)
    return tuple(out)


def _open_dir(root: Path, *, shown: str | None = None) -> SourceCheckpoint:
    where = shown or str(root)
    config: dict[str, object] | None = None
    cfg_path = root / "config.json"
    if cfg_path.is_file():
        cfg = _read_json(cfg_path)
        if not isinstance(cfg, dict):
            raise SourceError("config.json is not a JSON object", path=str(cfg_path))
        config = cfg
    index_path = root / INDEX_NAME
    if index_path.is_file():
        tensors, files = _check_index(root, index_path)
    elif (root / SINGLE_NAME).is_file():
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
    return SourceCheckpoint(
        path=root if shown is None else Path(shown),
        kind="hf-dir",
        config=config,
        tensors=tensors,
        files=files,
        side_files=_side_files(root),
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
            or shard != Path(shard).name
            or shard in (".", "..")
        ):
            problems.append(f"tensor {tensor!r}: shard {shard!r} is not a plain file name")
            continue
        shard_names.add(shard)

    headers: dict[str, SafetensorsHeader] = {}
    for shard in sorted(shard_names):
        sp = root / shard
        if not sp.is_file():
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
