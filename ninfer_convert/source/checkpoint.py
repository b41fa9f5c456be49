"""Source checkpoints: open, cross-check and read safetensors weights one tensor at a time.

Contract:

* :func:`~.opening.open_source` accepts a local Hugging Face model directory
  (``model.safetensors``, or shards listed by ``model.safetensors.index.json``), a single
  ``.safetensors`` file, or a repo id ``org/name[@revision]`` found offline in the local Hugging
  Face cache.  A local path always wins over a repo id of the same spelling.
* Opening reads only metadata.  Every safetensors header is validated strictly
  (:mod:`.header`).  For a sharded directory the index is checked against every shard header
  (:mod:`.shard_index`) before anything else happens, and *all* problems (missing shard file,
  tensor in the index but not in its shard, tensor in a shard but not in the index, tensor in
  two shards, unreadable shard) are reported together in one
  :class:`~ninfer_convert.errors.SourceError`.
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
  directory that the converter copies into the output, found by
  :func:`~.side_files.scan_side_files` under the rules of
  :data:`~.side_files.SIDE_FILE_LEFT_OUT` (docs/cli.md, "Side files"): regular files
  only, in subfolders too (kept with their relative path, ``1_Pooling/config.json``);
  symlinks only when they resolve inside the source directory (for a cached repo id, or a
  path to a cache snapshot folder: inside that repo's cache folder, where the snapshot's
  symlinks point); FIFOs, devices, sockets,
  symlinked folders, names that are not UTF-8 or that the container cannot store, and names
  that collide on a case-insensitive or normalising file system are a SourceError listing
  every offender.  ``config.json`` and the shard index are read the same way (regular files,
  never blocking, at most :data:`~.json_files.MAX_JSON_FILE_BYTES`: :mod:`.json_files`).
* Nothing here writes; reading is thread-safe (each read maps or ``pread``s its own region).
  Each weight file is opened once, at its first read, and its descriptor is shared by every
  later read of that file (opening the file per tensor cost about 13 us, a tenth of a tiny
  tensor's conversion); :meth:`SourceCheckpoint.close` (or collecting the object) closes
  them, and must not run while a read is in flight.  Every read still checks the file's size
  (``fstat``) against the size it had when it was opened.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..container.wire import SOURCE_DIGEST_PREFIX, digest_hex
from ..errors import SourceError
from ..readahead import read_ahead
from .header import DTYPES, SafetensorsHeader
from .side_files import SideFileSource

__all__ = [
    "SMALL_READ_BYTES",
    "SourceArray",
    "SourceCheckpoint",
    "SourceKind",
    "SourceTensorInfo",
    "digest_bytes",
]

DIGEST_PREFIX = SOURCE_DIGEST_PREFIX


SourceKind = Literal["hf-dir", "safetensors-file"]


SMALL_READ_BYTES = 64 * 1024
"""Tensors up to this size are read with one ``pread``, larger ones are memory-mapped."""


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
        (see the module contract and :func:`~.side_files.scan_side_files`)."""
        self._root = root
        self._sizes = dict(files)
        self._paths: dict[str, Path] = {}  # weight file -> its path, built once per file
        self._fds: dict[str, int] = {}  # weight file -> its descriptor, opened at first read
        self._fd_lock = threading.Lock()
        weakref.finalize(self, _close_fds, self._fds)

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
        """Close the weight files opened by reads (a later read opens its file again); not
        while a read is in flight."""
        _close_fds(self._fds)

    def _fd(self, file: str, fpath: Path, name: str) -> int:
        """The shared read-only descriptor of weight file ``file`` (opened at first use)."""
        fd = self._fds.get(file)
        if fd is None:
            with self._fd_lock:  # one descriptor per file, even when two reads race for it
                fd = self._fds.get(file)
                if fd is None:
                    try:
                        fd = os.open(fpath, os.O_RDONLY | getattr(os, "O_BINARY", 0))
                    except OSError as exc:
                        raise SourceError(
                            f"cannot open: {exc.strerror or exc}", path=str(fpath), tensor=name
                        ) from exc
                    self._fds[file] = fd
        return fd

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
        fd = self._fd(info.file, fpath, name)
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
        digest = digest_bytes(raw)
        if info.dtype == "BOOL" and raw.size and int(raw.max()) > 1:
            bad = int(np.argmax(raw > 1))
            raise SourceError(
                f"BOOL element {bad} holds byte 0x{int(raw[bad]):02x}; only 0 and 1 are valid",
                path=str(fpath),
                tensor=name,
            )
        return SourceArray(info=info, words=words, digest=digest)


def _close_fds(fds: dict[str, int]) -> None:
    """Close and forget the descriptors of :attr:`SourceCheckpoint._fds`."""
    while fds:
        _, fd = fds.popitem()
        os.close(fd)


def _info(header: SafetensorsHeader, file: str) -> dict[str, SourceTensorInfo]:
    return {
        e.name: SourceTensorInfo(e.name, e.dtype, e.shape, file, e.nbytes, e.begin)
        for e in header.tensors.values()
    }
