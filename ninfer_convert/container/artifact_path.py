"""Whether a path given on the command line is recognisably an artifact (no parsing).

Contract (docs/cli.md, exit codes): :func:`check_artifact_path` refuses, as a
:class:`~ninfer_convert.errors.UsageError` (exit 2), a missing path and one that is not
recognisably an artifact; a recognisable artifact that is damaged is left to
:func:`~ninfer_convert.container.open_artifact`, whose error is an invalid artifact (exit 6).
It reads at most the magic's length and never blocks on a FIFO.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import UsageError
from .wire import INDEX_NAME, MAGIC, SINGLE_NAME

__all__ = ["check_artifact_path"]


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
