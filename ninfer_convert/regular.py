"""Opening an untrusted path for reading without ever blocking, regular files only.

Contract: :func:`open_regular` opens with ``O_NONBLOCK`` (so a FIFO returns at once instead of
waiting for a writer) and then asks ``fstat`` on the descriptor what was really opened, so
there is no race between a check and the open.  It returns ``(fd, stat)`` for a regular file;
for anything else (FIFO, device, socket) it closes the descriptor and returns ``None``, and the
caller raises its own typed error.  ``OSError`` from the open itself propagates.
"""

from __future__ import annotations

import os
import stat

__all__ = ["open_regular"]

_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result] | None:
    """``(fd, stat)`` of the regular file at ``path``, or ``None`` (closed) if it is not one."""
    fd = os.open(path, _FLAGS)
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st
