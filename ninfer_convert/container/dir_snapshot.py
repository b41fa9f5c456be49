"""Files of an artifact, opened through its model directory (one snapshot).

Contract (docs/container.md sections 5 and 9): the model directory is opened once
(:func:`open_dir`) and every file of the artifact is opened through that descriptor by
:func:`open_in_directory`: a relative path of plain names, no component a symbolic link
(``O_NOFOLLOW``), without blocking on a FIFO, and only when ``fstat`` says it is a regular
file.  :func:`read_bounded` reads exactly the size ``fstat`` gave; :class:`SideHandle` pins a
side file's descriptor (or why it could not be opened) at open time; :func:`replaced` tells
whether the name now holds another directory, so the opener can try again.  Every failure is
an :class:`~ninfer_convert.errors.ArtifactError` naming the file.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import ArtifactError

__all__ = [
    "CHUNK_BYTES",
    "SideHandle",
    "entry_kind",
    "open_dir",
    "open_in_directory",
    "read_bounded",
    "replaced",
]

CHUNK_BYTES = 64 << 20
"""Bytes read (or hashed) per call, so no read allocates more than this at once."""

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
            chunk = os.pread(fd, min(CHUNK_BYTES, size - got), got)
        except OSError as exc:
            raise ArtifactError(f"cannot read: {exc.strerror}", path=where) from None
        if not chunk:
            raise ArtifactError(
                f"file ended after {got} of {size} bytes (changed while read)", path=where
            )
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


_TOP_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def entry_kind(dir_fd: int, name: str, directory: Path) -> int | None:
    """The ``lstat`` mode of ``name`` in the directory, or None when there is no such entry."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ArtifactError(f"cannot look up: {exc.strerror}", path=str(directory / name)) from None


def open_dir(path: Path) -> tuple[int, bool]:
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


def replaced(path: Path, dir_fd: int, is_dir: bool) -> bool:
    """Whether the directory behind ``dir_fd`` was removed, or ``path`` now names another."""
    here = os.fstat(dir_fd)
    if here.st_nlink == 0:
        return True
    try:
        now = os.stat(path if is_dir else path.parent)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != (here.st_dev, here.st_ino)


@dataclass
class SideHandle:
    """A side file opened at open time (so it belongs to the same directory snapshot as the
    containers), or the reason it could not be opened."""

    fd: int | None
    size: int
    error: ArtifactError | None
    missing: bool = False

    @staticmethod
    def open(dir_fd: int, name: str, path: Path) -> SideHandle:
        try:
            fd, st = open_in_directory(dir_fd, name, str(path))
        except ArtifactError as exc:
            return SideHandle(None, 0, exc, missing=exc.message == _NO_SUCH_FILE)
        return SideHandle(fd, st.st_size, None)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
