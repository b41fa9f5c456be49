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
  A weight file is opened at its first read, and its descriptor is shared by the later reads
  of that file (opening the file per tensor cost about 13 us, a tenth of a tiny tensor's
  conversion).  At most :data:`MAX_OPEN_WEIGHT_FILES` stay open between reads, the least
  recently used closed first, so a checkpoint of hundreds of files reads under a small
  ``ulimit -n``; a descriptor is never closed under a read that uses it (an evicted one, or
  one :meth:`SourceCheckpoint.close` closes while a read is in flight, is closed when that
  read ends), so its number cannot be reused by another file mid-read.
  :meth:`SourceCheckpoint.close` (or collecting the object) closes them.  Every read still
  checks the file's size (``fstat``) against the size it had when it was opened.
* :meth:`SourceCheckpoint.preread` (convert, per batch of small tensors): this thread's reads
  of the named small tensors take their bytes from one ``pread`` per run of neighbouring
  tensors, the size checked before each such ``pread``; the same words, digests and errors
  as reading them one by one (a run that fails is left to :meth:`SourceCheckpoint.read`).
  :meth:`SourceCheckpoint.preread_bytes` returns those runs' raw bytes per tensor instead
  (verify checks a batch of direct copies with them).
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
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
    "MAX_OPEN_WEIGHT_FILES",
    "SMALL_READ_BYTES",
    "SourceArray",
    "SourceCheckpoint",
    "SourceKind",
    "SourceTensorInfo",
    "digest_bytes",
]

DIGEST_PREFIX = SOURCE_DIGEST_PREFIX


SourceKind = Literal["hf-dir", "safetensors-file"]


MAX_OPEN_WEIGHT_FILES = 32
"""Weight files whose descriptors a :class:`SourceCheckpoint` keeps open between reads
(reads go through the files in plan order, so a few cover a conversion)."""

SMALL_READ_BYTES = 64 * 1024
"""Tensors up to this size are read with one ``pread``, larger ones are memory-mapped."""

PREREAD_BYTES = 1 << 20
"""The longest byte range :meth:`SourceCheckpoint.preread` reads with one ``pread``."""
PREREAD_GAP = 4096
"""The most bytes of other tensors a preread range may hold between two of its tensors."""


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
        self._fds = _SharedDescriptors()
        weakref.finalize(self, self._fds.close)
        self._pre = threading.local()  # this thread's preread bytes: name -> memoryview

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
        """Close the weight files opened by reads (a later read opens its file again); a
        descriptor a read in flight uses is closed when that read ends."""
        self._fds.close()

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

    @contextmanager
    def preread(self, names: Iterable[str]) -> Iterator[None]:
        """Within the block, this thread's :meth:`read` of these tensors takes their bytes
        from one ``pread`` per run of small tensors (at most :data:`SMALL_READ_BYTES` each) of
        one file, spanning at most :data:`PREREAD_BYTES` with gaps of at most
        :data:`PREREAD_GAP` between them, the file's size checked
        before each such ``pread`` as :meth:`read` checks it.  Only an optimisation: a run
        that cannot be read whole (an error, a changed size, a short read) is left to
        :meth:`read`, which reports it for its tensor; bytes not read by the end are
        dropped."""
        runs: dict[str, memoryview] = {}
        for file, members in self._preread_runs(names):
            runs.update(self._read_run(file, members))
        outer, self._pre.runs = getattr(self._pre, "runs", None), runs
        try:
            yield
        finally:
            self._pre.runs = outer

    def preread_bytes(self, infos: Iterable[SourceTensorInfo]) -> dict[str, memoryview]:
        """The raw bytes of the small tensors ``infos`` (entries of :attr:`tensors`) that
        :meth:`preread` would read ahead, by tensor name (the same runs, one ``pread`` each,
        the file's size checked before it); a tensor missing from the result (a run that
        failed, a tensor alone in its run, a large one) is left to :meth:`read`.  For callers
        that check many small tensors' bytes as one unit (``verify``'s direct copies, which
        hold the infos already); the bytes are not digested here."""
        runs: dict[str, memoryview] = {}
        for file, members in self._runs_of(infos):
            runs.update(self._read_run(file, members))
        return runs

    def _preread_runs(self, names: Iterable[str]) -> Iterator[tuple[str, list[SourceTensorInfo]]]:
        """The small tensors of ``names`` grouped into runs of one file, by offset."""
        tensors = self.tensors
        return self._runs_of(info for name in names if (info := tensors.get(name)) is not None)

    @staticmethod
    def _runs_of(
        infos: Iterable[SourceTensorInfo],
    ) -> Iterator[tuple[str, list[SourceTensorInfo]]]:
        """The small tensors of ``infos`` grouped into runs of one file, by offset."""
        by_file: dict[str, list[SourceTensorInfo]] = {}
        for info in infos:
            if 0 < info.nbytes <= SMALL_READ_BYTES:
                by_file.setdefault(info.file, []).append(info)
        for file, infos in by_file.items():
            infos.sort(key=_offset)
            run: list[SourceTensorInfo] = []
            for info in infos:
                if run and (
                    info.offset - (run[-1].offset + run[-1].nbytes) > PREREAD_GAP
                    or info.offset + info.nbytes - run[0].offset > PREREAD_BYTES
                ):
                    yield file, run
                    run = []
                run.append(info)
            if len(run) > 1:  # a single tensor is read as usual
                yield file, run

    def _read_run(self, file: str, run: list[SourceTensorInfo]) -> dict[str, memoryview]:
        """One run's bytes per tensor name, or nothing when anything is unusual."""
        if len(run) < 2:
            return {}
        fpath = self._paths.get(file)
        if fpath is None:
            fpath = self._paths[file] = self._root / file
        start = run[0].offset
        span = max(i.offset + i.nbytes for i in run) - start
        try:
            slot = self._fds.lend(file, fpath)
        except OSError:
            return {}
        try:
            if os.fstat(slot.fd).st_size != self._sizes[file]:
                return {}
            data = os.pread(slot.fd, span, start)
        except OSError:
            return {}
        finally:
            self._fds.give_back(slot)
        if len(data) != span:
            return {}
        view = memoryview(data)
        return {i.name: view[i.offset - start : i.offset - start + i.nbytes] for i in run}

    def read(self, name: str) -> SourceArray:
        """Read one tensor bit-exactly (see the module contract)."""
        info = self.tensors.get(name)
        if info is None:
            raise SourceError(f"no tensor named {name!r} in the source", path=str(self.path))
        fpath = self._paths.get(info.file)
        if fpath is None:
            fpath = self._paths[info.file] = self._root / info.file
        dt = np.dtype(info.word_dtype)
        runs: dict[str, memoryview] | None = getattr(self._pre, "runs", None)
        early = None if runs is None else runs.pop(name, None)
        if early is not None:  # read (and its file's size checked) by preread
            got = np.frombuffer(early, dtype=np.uint8)
            shaped = got.view(dt).reshape(info.shape) if info.convertible else got
            return self._checked_array(info, got, shaped, fpath)
        try:
            slot = self._fds.lend(info.file, fpath)
        except OSError as exc:
            raise SourceError(
                f"cannot open: {exc.strerror or exc}", path=str(fpath), tensor=name
            ) from exc
        fd = slot.fd
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
            self._fds.give_back(slot)  # a map holds the file by itself
        return self._checked_array(info, raw, words, fpath)

    @staticmethod
    def _checked_array(
        info: SourceTensorInfo,
        raw: npt.NDArray[np.uint8],
        words: npt.NDArray[np.generic],
        fpath: Path,
    ) -> SourceArray:
        name = info.name
        digest = digest_bytes(raw)
        if info.dtype == "BOOL" and raw.size and int(raw.max()) > 1:
            bad = int(np.argmax(raw > 1))
            raise SourceError(
                f"BOOL element {bad} holds byte 0x{int(raw[bad]):02x}; only 0 and 1 are valid",
                path=str(fpath),
                tensor=name,
            )
        return SourceArray(info=info, words=words, digest=digest)


class _Slot:
    """One shared descriptor: the reads using it now, and whether it left the table (then the
    last of them closes it)."""

    __slots__ = ("detached", "fd", "users")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.users = 0
        self.detached = False


class _SharedDescriptors:
    """The read-only weight-file descriptors of one :class:`SourceCheckpoint` (see the module
    contract): lent to a read by :meth:`lend`, handed back by :meth:`give_back`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Slot] = OrderedDict()  # least recently lent first

    def lend(self, file: str, path: Path) -> _Slot:
        """The descriptor of weight file ``file`` at ``path`` (opened if it is not open),
        in use until :meth:`give_back`; ``OSError`` when it cannot be opened."""
        with self._lock:
            slot = self._open.get(file)
            if slot is None:
                slot = _Slot(self._open_fd(path))
                self._open[file] = slot
                while len(self._open) > MAX_OPEN_WEIGHT_FILES:
                    self._detach(self._open.popitem(last=False)[1])
            else:
                self._open.move_to_end(file)
            slot.users += 1
            return slot

    def give_back(self, slot: _Slot) -> None:
        with self._lock:
            slot.users -= 1
            if slot.detached and slot.users == 0:
                os.close(slot.fd)

    def close(self) -> None:
        with self._lock:
            while self._open:
                self._detach(self._open.popitem()[1])

    def _open_fd(self, path: Path) -> int:
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0)
        try:
            return os.open(path, flags)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._open:
                raise
        # Out of descriptors: give back the idle ones this source holds and try once more.
        for file, slot in list(self._open.items()):
            if slot.users == 0:
                del self._open[file]
                self._detach(slot)
        return os.open(path, flags)

    @staticmethod
    def _detach(slot: _Slot) -> None:
        slot.detached = True
        if slot.users == 0:
            os.close(slot.fd)


def _offset(info: SourceTensorInfo) -> int:
    return info.offset


def _info(header: SafetensorsHeader, file: str) -> dict[str, SourceTensorInfo]:
    return {
        e.name: SourceTensorInfo(e.name, e.dtype, e.shape, file, e.nbytes, e.begin)
        for e in header.tensors.values()
    }
