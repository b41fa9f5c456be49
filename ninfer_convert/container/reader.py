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
* One snapshot (docs/container.md sections 5 and 9): the model directory is opened once and
  every file of the artifact (index, shards, side files) is opened through that descriptor
  before :func:`open_artifact` returns, without following symbolic links, without blocking on
  a FIFO, and only when ``fstat`` says it is a regular file.  Side files stay open and are
  read (never beyond their recorded size) by :meth:`Artifact.read_side_file` and the integrity
  check, so a concurrent ``convert --force`` cannot pair one version's shards with another's
  side files.  A file's ``shard`` object must match the name it was opened under, and
  :attr:`Artifact.stray_files` lists container-like names that are not part of the artifact.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import mmap
import os
import re
import stat
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import ArtifactError, IntegrityError, NinferError, UsageError
from ..jsonlimits import compact_members, scan
from ..layouts import LAYOUTS, Rows, RowSplitK128
from ..logical import DirectWords, GroupedCodes, LogicalTensor
from ..readahead import read_ahead
from .checks import (
    GeometryCache,
    check_alignment,
    check_placement,
    check_side_file_name,
    check_tensor_geometry,
)
from .schema import (
    MAX_JSON_DEPTH,
    ArtifactMeta,
    Header,
    IndexFile,
    PlaneEntry,
    SchemaError,
    SideFile,
    TensorEntry,
    paused_gc,
)
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
    new_digest,
    parse_shard_name,
    shard_name,
)

__all__ = ["Artifact", "PlaneInfo", "TensorInfo", "check_artifact_path", "open_artifact"]

_HASH_CHUNK = 64 << 20


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


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_repeated_keys(text: str, what: str, path: Path) -> None:
    """Parse again with a hook on every object and raise the first repeated key, if any (the
    slow path of :func:`_typed`'s duplicate detection)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):  # find the first repeated key for the message
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    raise ArtifactError(f"{what} repeats the JSON key {key!r}", path=str(path))
                seen.add(key)
        return out

    _parse(text, what, path, pairs)


def _utf8(raw: bytes, what: str, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(
            f"{what} is not valid UTF-8 (byte {exc.start}: {exc.reason})", path=str(path)
        ) from None


def _parse(
    text: str, what: str, path: Path, hook: Callable[[list[tuple[str, Any]]], Any] | None
) -> Any:
    def finite(literal: str) -> float:
        # A literal such as 1e999 parses to inf, which is not JSON either.
        number = float(literal)
        if not math.isfinite(number):
            raise ValueError(f"the number {literal[:40]} is out of the float range")
        return number

    def constant(name: str) -> Any:
        raise ArtifactError(f"{what} contains {name}, which is not JSON", path=str(path))

    try:
        value = json.loads(
            text, object_pairs_hook=hook, parse_constant=constant, parse_float=finite
        )
        # A \ud800 escape parses to a lone surrogate, which is not Unicode text: refuse it, so
        # every accepted string can be written back as UTF-8.  Only a \uD800-\uDFFF escape
        # can make one (decoded UTF-8 holds none), so the encoding test runs only then.
        if _SURROGATE_ESCAPE.search(text) is not None:
            canonical_json(value)
        return value
    except UnicodeEncodeError:
        raise ArtifactError(
            f"{what} contains an escaped lone surrogate, which is not Unicode text",
            path=str(path),
        ) from None
    except RecursionError:  # the first parse of a hostile document; the checked order follows
        raise ArtifactError(f"{what} JSON is nested too deeply", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            path=str(path),
        ) from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ArtifactError(f"{what} is not acceptable JSON: {exc}", path=str(path)) from None


def _checked_shape(text: str, what: str, path: Path, depth: int) -> int:
    """The object members of ``text``, after refusing nesting deeper than ``depth`` (bracket
    levels of the whole document, checked by :func:`~ninfer_convert.jsonlimits.scan` without
    recursion)."""
    deep, members = scan(text, depth)
    if deep is not None:
        raise ArtifactError(
            f"{what} JSON is nested too deeply: deeper than {depth} levels at character {deep}",
            path=str(path),
            hint="not a file this tool writes; it may be hostile",
        )
    return members


_S = TypeVar("_S", Header, IndexFile)
_PARSE_FIRST_MAX_RECURSION = 4000  # Python's default is 1000; 60,000 levels fit in 8 MiB
_UNPARSED = object()


def _typed(cls: type[_S], raw: bytes, what: str, path: Path, depth: int) -> _S:
    """The header or index in ``raw``: strict JSON (UTF-8 only, no repeated keys, no
    NaN/Infinity, bounded integers and nesting) that fits the schema ``cls``.

    A document is refused for the first of: not UTF-8; nested deeper than ``depth``; not JSON;
    a repeated key; what the schema says.  The common case is cheaper than that order: the C
    parser runs first, without a per-object hook (which cost a Python call per object), so an
    object that repeats a key keeps its last value.  The members in the text
    (:func:`~ninfer_convert.jsonlimits.compact_members`, or :func:`scan` when whitespace
    precedes a colon) then tell: a schema-valid document has exactly as many members as its
    typed value (``json_pairs()``), so any difference is a repeated key, which
    :func:`_refuse_repeated_keys` names.  A schema-valid document nests at most 7 levels plus
    ``config``'s bounded depth, so it is within ``depth``; the parser itself stops at
    Python's recursion limit (when that limit was raised above
    :data:`_PARSE_FIRST_MAX_RECURSION`, the nesting scan runs first instead).  Whenever the
    parse or the schema refuses, the full order above runs, so the message is the one that
    order gives."""
    text = _utf8(raw, what, path)
    # The parser's C recursion is bounded only by Python's recursion limit: parsing before the
    # nesting scan is safe only while that limit is low enough for the C stack (a host that
    # raised it to 1,000,000 got a SIGSEGV from 200,000 nested brackets).
    members = (
        compact_members(text) if sys.getrecursionlimit() <= _PARSE_FIRST_MAX_RECURSION else None
    )
    value: Any = _UNPARSED
    if members is not None:
        with contextlib.suppress(ArtifactError):
            value = _parse(text, what, path, None)
    if value is _UNPARSED or members is None:
        members = _checked_shape(text, what, path, depth)
        value = _parse(text, what, path, None)
    try:
        typed = cls.from_json(value)
    except SchemaError as exc:
        _checked_shape(text, what, path, depth)
        _refuse_repeated_keys(text, what, path)
        raise exc.as_error(
            ArtifactError, f"invalid {what}", kind="header_invalid", path=str(path)
        ) from None
    del value  # the parsed JSON is freed here, while the collector is paused
    if typed.json_pairs() != members:
        _refuse_repeated_keys(text, what, path)
        raise ArtifactError(  # pragma: no cover - only a repeated key makes the counts differ
            f"{what} holds {members} object members but its schema reads {typed.json_pairs()}",
            path=str(path),
        )
    return typed


# Bracket levels of a header: the root, ``artifact`` and ``source`` objects, then the free-form
# ``config`` (its own level plus at most MAX_JSON_DEPTH nested levels, schema.json_value's
# bound), so every header a writer can produce passes.  The index nests 3 levels.
_HEADER_DEPTH = 3 + 1 + MAX_JSON_DEPTH
_INDEX_DEPTH = 8

_FILE_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    # A FIFO opened for reading would block until a writer appears; O_NONBLOCK makes the open
    # return at once, and the fstat below then refuses anything that is not a regular file.
    | getattr(os, "O_NONBLOCK", 0)
)
_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOFOLLOW", 0)
)


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def open_in_directory(dir_fd: int, name: str, where: str) -> tuple[int, os.stat_result]:
    """Open the regular file ``name`` inside the open directory ``dir_fd`` for reading.

    ``name`` is a relative path of plain components.  No component is a symbolic link (each is
    opened with ``O_NOFOLLOW`` through the previous one), so nothing outside the directory is
    reached; a FIFO, device or socket is refused without blocking.  Returns the descriptor and
    its ``fstat``; any failure is an :class:`ArtifactError` naming ``where``."""
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(f"{name!r} is not a relative path of plain names", path=where)
    opened: list[int] = []
    try:
        cur = dir_fd
        for part in parts[:-1]:
            try:
                cur = os.open(part, _DIR_FLAGS, dir_fd=cur)
            except OSError as exc:
                raise _open_error(exc, where, folder=part) from None
            opened.append(cur)
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=cur)
        except OSError as exc:
            raise _open_error(exc, where) from None
    finally:
        for d in opened:
            os.close(d)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(
                f"{_kind_of(st.st_mode)}, not a regular file",
                path=where,
                hint="every file of an artifact must be a regular file",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


_NO_SUCH_FILE = "no such file"


def _open_error(exc: OSError, where: str, folder: str | None = None) -> ArtifactError:
    if exc.errno == errno.ELOOP or (folder is not None and exc.errno == errno.ENOTDIR):
        what = f"folder {folder!r}" if folder is not None else "it"
        return ArtifactError(
            f"{what} is a symbolic link or not a plain folder; artifact files are opened "
            "without following links",
            path=where,
            hint="replace the link by the file it points to",
        )
    if exc.errno == errno.ENOENT:
        return ArtifactError(_NO_SUCH_FILE, path=where)
    return ArtifactError(f"cannot open: {exc.strerror}", path=where)


def read_bounded(fd: int, size: int, where: str) -> bytes:
    """Exactly ``size`` bytes from offset 0 of ``fd`` (a regular file whose ``fstat`` gave
    ``size``); fewer means the file shrank while it was read."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        try:
            chunk = os.pread(fd, min(_HASH_CHUNK, size - got), got)
        except OSError as exc:
            raise ArtifactError(f"cannot read: {exc.strerror}", path=where) from None
        if not chunk:
            raise ArtifactError(
                f"file ended after {got} of {size} bytes (changed while read)", path=where
            )
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class _Container:
    """One memory-mapped container file whose prelude and header have been validated.

    ``expect`` is the (index, count) its ``shard`` object must say: the position the index
    gives it, or what its file name says (section 5: a file not named as a shard is a
    single-file artifact)."""

    def __init__(
        self,
        dir_fd: int,
        name: str,
        path: Path,
        *,
        check_header_digest: bool,
        expect: tuple[int, int],
        expect_size: int | None = None,
    ) -> None:
        self.path = path
        self.mm: mmap.mmap | None = None
        where = str(path)
        fd, st = open_in_directory(dir_fd, name, where)
        try:
            self.size = st.st_size
            if expect_size is not None and self.size != expect_size:
                raise ArtifactError(
                    f"shard is {self.size} bytes but the index records {expect_size} "
                    "(truncated or replaced shard)",
                    path=where,
                )
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
            self._check_shard(expect, expect_size is not None)
        except BaseException:
            self.close()
            raise

    def _check_shard(self, expect: tuple[int, int], via_index: bool) -> None:
        shard = (self.header.shard.index, self.header.shard.count)
        if shard == expect:
            return
        if expect == (1, 1) and not via_index:
            raise ArtifactError(
                f"header says shard {shard[0]} of {shard[1]}, but the file is not named as a "
                f"shard, so it must be a single-file artifact ({{index: 1, count: 1}})",
                path=str(self.path),
                hint="a shard is read through its model.ninfer.index.json or under its own "
                "model-NNNNN-of-NNNNN.ninfer name",
            )
        said = "the index says" if via_index else "its file name says"
        raise ArtifactError(
            f"header says shard {shard[0]} of {shard[1]}, {said} {expect[0]} of {expect[1]}",
            path=str(self.path),
            hint="a shard renamed or copied under another shard's name",
        )

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
        header = _typed(Header, raw, "header", self.path, _HEADER_DEPTH)
        try:
            check_alignment(header.artifact.alignment)
            names: set[str] = set()
            layouts: GeometryCache = {}
            for i, t in enumerate(header.tensors):
                if t.name in names:
                    raise SchemaError(f"tensors[{i}].name", f"duplicate tensor name {t.name!r}")
                names.add(t.name)
                check_tensor_geometry(t, f"tensors[{i}]", layouts)
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
            raise exc.as_error(
                ArtifactError, "invalid header", kind="header_invalid", path=where
            ) from None
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


_TOP_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _entry_kind(dir_fd: int, name: str, directory: Path) -> int | None:
    """The ``lstat`` mode of ``name`` in the directory, or None when there is no such entry."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArtifactError(f"cannot look up: {exc.strerror}", path=str(directory / name)) from None


def _open_dir(path: Path) -> tuple[int, bool]:
    """(descriptor of the model directory, whether ``path`` itself is that directory)."""
    try:
        return os.open(path, _TOP_DIR_FLAGS), True
    except NotADirectoryError:
        pass
    except FileNotFoundError:
        raise ArtifactError("no such file or directory", path=str(path)) from None
    except OSError as exc:
        raise ArtifactError(f"cannot open: {exc.strerror}", path=str(path)) from None
    parent = path.parent
    try:
        return os.open(parent, _TOP_DIR_FLAGS), False
    except OSError as exc:
        raise ArtifactError(
            f"cannot open its directory: {exc.strerror}", path=str(parent)
        ) from None


_SNAPSHOT_TRIES = 5
"""Opens tried when the directory is replaced while it is being opened (convert --force)."""


def _replaced(path: Path, dir_fd: int, is_dir: bool) -> bool:
    """Whether the directory behind ``dir_fd`` was removed, or ``path`` now names another."""
    here = os.fstat(dir_fd)
    if here.st_nlink == 0:
        return True
    try:
        now = os.stat(path if is_dir else path.parent)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != (here.st_dev, here.st_ino)


def check_artifact_path(path: str | os.PathLike[str]) -> Path:
    """Refuse (UsageError, exit 2) a missing path and one that is not recognisably an artifact.

    Recognisable: a directory holding ``model.ninfer`` or ``model.ninfer.index.json``, a file
    named ``*.index.json`` or ``*.ninfer``, or a file whose first bytes are (a prefix of) the
    container magic.  A recognisable artifact that is damaged (even in its magic bytes) is not
    a usage error: verify reports it as invalid (exit 6).
    """
    p = Path(path)
    if not p.exists():
        raise UsageError("no such file or directory", path=str(p), hint="check the artifact path")
    if p.is_dir():
        # lexists: a link named model.ninfer is an artifact entry the reader then refuses.
        if not os.path.lexists(p / SINGLE_NAME) and not os.path.lexists(p / INDEX_NAME):
            raise UsageError(
                f"not a .ninfer artifact: the directory has no {SINGLE_NAME} or {INDEX_NAME}",
                kind="not_an_artifact",
                path=str(p),
            )
        return p
    if p.name.endswith((".index.json", ".ninfer")):
        return p
    head = _read_magic(p)
    if not head or not MAGIC.startswith(head):
        what = f"starts with {head.hex(' ')}" if head else "is empty"
        raise UsageError(
            f"not a .ninfer artifact (it {what}; a container starts with {MAGIC.hex(' ')})",
            kind="not_an_artifact",
            path=str(p),
            hint="pass a model.ninfer file, a shard index or the artifact directory",
        )
    return p


def _read_magic(p: Path) -> bytes:
    """The first bytes of ``p``, without blocking on a FIFO or reading a device."""
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", path=str(p)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(
                "not a .ninfer artifact: not a regular file (a FIFO, device or socket)",
                kind="not_an_artifact",
                path=str(p),
                hint="pass a model.ninfer file, a shard index or the artifact directory",
            )
        return os.pread(fd, len(MAGIC), 0)
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", path=str(p)) from None
    finally:
        os.close(fd)


def open_artifact(path: str | os.PathLike[str], *, check_header_digest: bool = True) -> Artifact:
    """Open a .ninfer file, one shard, a ``model.ninfer.index.json`` or a model directory.

    The directory is opened once and every file of the artifact (shards, index, side files)
    is opened through that descriptor before this returns, so the artifact is one consistent
    snapshot even while ``convert --force`` replaces the directory (docs/container.md
    section 9): when the directory is replaced or removed while it is being opened and a file
    is missing because of it, the open starts again on what the name holds now."""
    p = Path(path)
    for attempt in range(1, _SNAPSHOT_TRIES + 1):
        dir_fd, is_dir = _open_dir(p)
        try:
            with paused_gc():  # see paused_gc: the collector's passes cost more than the parse
                art = _open_snapshot(p, dir_fd, is_dir, check_header_digest)
        except ArtifactError:
            again = attempt < _SNAPSHOT_TRIES and _replaced(p, dir_fd, is_dir)
            os.close(dir_fd)
            if again:
                continue
            raise
        except BaseException:
            os.close(dir_fd)
            raise
        if attempt < _SNAPSHOT_TRIES and art._side_missing() and _replaced(p, dir_fd, is_dir):
            art.close()
            continue
        return art
    raise AssertionError("unreachable")  # pragma: no cover - the last try returns or raises


def _open_snapshot(p: Path, dir_fd: int, is_dir: bool, check_header_digest: bool) -> Artifact:
    """One try of :func:`open_artifact`; the caller owns ``dir_fd`` until this returns."""
    directory = p if is_dir else p.parent
    if is_dir:
        has_index = _entry_kind(dir_fd, INDEX_NAME, directory) is not None
        has_single = _entry_kind(dir_fd, SINGLE_NAME, directory) is not None
        if has_index and has_single:
            raise ArtifactError(
                f"directory holds both {SINGLE_NAME} and {INDEX_NAME}; which one is the "
                "artifact is ambiguous",
                path=str(p),
            )
        if not has_index and not has_single:
            raise ArtifactError(
                f"no artifact here: expected {SINGLE_NAME} or {INDEX_NAME}", path=str(p)
            )
        name = INDEX_NAME if has_index else SINGLE_NAME
    else:
        name = p.name
        if _entry_kind(dir_fd, name, directory) is None:
            raise ArtifactError("no such file or directory", path=str(p))
    if name.endswith(".index.json"):
        return _open_index(p, dir_fd, directory, name, check_header_digest)
    expect = parse_shard_name(name) or (1, 1)
    container = _Container(
        dir_fd, name, directory / name, check_header_digest=check_header_digest, expect=expect
    )
    try:
        whole = name == SINGLE_NAME
        return Artifact(p, None, [container], None, dir_fd=dir_fd, whole_directory=whole)
    except BaseException:
        container.close()
        raise


def _open_index(
    opened: Path, dir_fd: int, directory: Path, name: str, check_digest: bool
) -> Artifact:
    index_path = directory / name
    where = str(index_path)
    fd, st = open_in_directory(dir_fd, name, where)
    try:
        if st.st_size > MAX_INDEX_BYTES:
            raise ArtifactError(
                f"index is {st.st_size} bytes, over the {MAX_INDEX_BYTES}-byte cap", path=where
            )
        raw = read_bounded(fd, st.st_size, where)
    finally:
        os.close(fd)
    index = _typed(IndexFile, raw, "index", index_path, _INDEX_DEPTH)
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
            shard_path = directory / s.file
            if _entry_kind(dir_fd, s.file, directory) is None:
                raise ArtifactError(f"shard {i} of {count} is missing", path=str(shard_path))
            c = _Container(
                dir_fd, s.file, shard_path, check_header_digest=check_digest,
                expect=(i, count), expect_size=s.size,
            )  # fmt: skip
            containers.append(c)
            if check_digest and c.stored_digest.hex() != s.digest:
                raise IntegrityError(
                    f"shard header digest {c.stored_digest.hex()} differs from {s.digest} "
                    "recorded in the index",
                    path=str(shard_path),
                )
        artifact = Artifact(
            opened, index_path, containers, index, dir_fd=dir_fd, whole_directory=True
        )
    except BaseException:
        for c in containers:
            c.close()
        raise
    return artifact


@dataclass
class _SideHandle:
    """A side file opened at open time (so it belongs to the same directory snapshot as the
    containers), or the reason it could not be opened."""

    fd: int | None
    size: int
    error: ArtifactError | None
    missing: bool = False

    @staticmethod
    def open(dir_fd: int, name: str, path: Path) -> _SideHandle:
        try:
            fd, st = open_in_directory(dir_fd, name, str(path))
        except ArtifactError as exc:
            return _SideHandle(None, 0, exc, missing=exc.message == _NO_SUCH_FILE)
        return _SideHandle(fd, st.st_size, None)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _strays(dir_fd: int, containers: list[_Container], index: IndexFile | None) -> tuple[str, ...]:
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


class Artifact:
    """An open artifact.  Use as a context manager, or call :meth:`close`."""

    def __init__(
        self,
        opened: Path,
        index_path: Path | None,
        containers: list[_Container],
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
                tensors[t.name] = TensorInfo(t, c.path, h.shard.index if index is None else number)
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
        self._side: dict[str, _SideHandle] = {}
        try:
            for f in first.files:
                self._side[f.name] = _SideHandle.open(dir_fd, f.name, self.directory / f.name)
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
        f = self.side_files.get(name)
        if f is None:
            raise UsageError(
                f"no side file {name!r} in this artifact; it records {sorted(self.side_files)}",
                path=str(self.path),
            )
        problem, data = self._side_check(f, keep=True)
        if problem is not None:
            raise problem
        assert data is not None
        return data

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
        h = new_digest()
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
                kind="nonzero_gap",
                path=str(c.path),
                tensor=tensor,
            )
        ]

    def _side_file_problems(self) -> list[IntegrityError]:
        problems = []
        for f in self.side_files.values():
            problem, _ = self._side_check(f, keep=False)
            if problem is not None:
                problems.append(problem)
        return problems

    def _side_check(self, f: SideFile, *, keep: bool) -> tuple[IntegrityError | None, bytes | None]:
        """(problem, bytes when ``keep``) of one side file, read through its pinned
        descriptor and never beyond its recorded size."""
        path = str(self.directory / f.name)
        handle = self._side.get(f.name)
        if handle is None or (handle.fd is None and handle.error is None):
            raise UsageError("the artifact is closed", path=str(self.path))
        if handle.error is not None:
            return IntegrityError(f"side file {f.name!r}: {handle.error.message}", path=path), None
        assert handle.fd is not None
        if handle.size != f.size:
            return (
                IntegrityError(
                    f"side file {f.name!r} is {handle.size} bytes, recorded {f.size} bytes "
                    f"with digest {f.digest}",
                    path=path,
                ),
                None,
            )
        h = new_digest()
        parts: list[bytes] = []
        pos = 0
        try:
            while pos < f.size:
                chunk = os.pread(handle.fd, min(_HASH_CHUNK, f.size - pos), pos)
                if not chunk:
                    break
                h.update(chunk)
                if keep:
                    parts.append(chunk)
                pos += len(chunk)
        except OSError as exc:
            return IntegrityError(f"side file {f.name!r}: {exc.strerror}", path=path), None
        if pos != f.size or h.hexdigest() != f.digest:
            return (
                IntegrityError(
                    f"side file {f.name!r} is {pos} bytes with digest {h.hexdigest()}, "
                    f"recorded {f.size} bytes with digest {f.digest}",
                    path=path,
                ),
                None,
            )
        return None, b"".join(parts) if keep else None

    def padding_problems(self) -> list[ArtifactError]:
        """Every non-zero layout padding byte (canonical padding is all zero bits)."""
        problems: list[ArtifactError] = []
        for info in self.tensors.values():
            layout = LAYOUTS[info.layout]
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
