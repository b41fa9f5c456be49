"""Resource failures of the file system as typed errors: :func:`resource_error` maps ENOSPC,
EDQUOT, EACCES, EPERM, EROFS (and any other ``OSError`` of the file system) to
:class:`ResourceError` naming the path, and for space the bytes needed and free;
:func:`check_free_space` and :func:`check_writable` refuse an output before any byte is
written (docs/cli.md, exit code 7)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import ResourceError, UsageError

__all__ = ["check_free_space", "check_writable", "disk_free", "resource_error"]


def disk_free(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system (None: unknown)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


_RESOURCE_WORDS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
}
_RESOURCE_KINDS = {
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "quota_exceeded",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "read_only",
}


def resource_error(
    exc: OSError, path: Path | str, *, needed: int | None = None, doing: str = "writing"
) -> ResourceError:
    """The typed error for an OSError of the file system while ``doing`` something at ``path``."""
    where = Path(exc.filename) if isinstance(exc.filename, str) else Path(path)
    what = _RESOURCE_WORDS.get(exc.errno or -1) or exc.strerror or str(exc)
    text = f"{doing}: {what}"
    hint = "check the path and its permissions, or choose another --output"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = disk_free(_nearest_existing(where))
        need = f"needs {needed} bytes" if needed is not None else "needs more space"
        text += f" ({need}, {'unknown' if free is None else free} bytes free)"
        hint = "free some space or choose --output on another file system"
    elif exc.errno == errno.EROFS:
        hint = "choose --output on a writable file system"
    kind = _RESOURCE_KINDS.get(exc.errno or -1, ResourceError.default_kind)
    return ResourceError(text, kind=kind, path=str(where), hint=hint)


def check_free_space(target: Path, needed: int) -> int | None:
    """Refuse with a ResourceError when the file system of ``target`` (or its nearest existing
    ancestor) has fewer than ``needed`` bytes free; returns the free bytes (None: unknown)."""
    base = _nearest_existing(target)
    free = disk_free(base)
    if free is not None and free < needed:
        raise ResourceError(
            f"not enough space: the artifact needs {needed} bytes, {free} bytes free",
            kind="no_space",
            path=str(base),
            hint="free some space or choose --output on another file system",
        )
    return free


def check_writable(target: Path) -> None:
    """Refuse with a ResourceError when the output's parent (or nearest existing ancestor)
    cannot receive new entries."""
    base = _nearest_existing(target.parent)
    if not base.is_dir():
        raise UsageError(f"{base} is not a directory", path=str(target))
    if not _can_create_in(base):
        why = "read-only file system" if _is_read_only(base) else "permission denied"
        raise ResourceError(
            f"cannot create the output here: {why}",
            kind="read_only" if why.startswith("read-only") else "permission_denied",
            path=str(base),
            hint="choose --output in a directory you can write",
        )


def _can_create_in(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def _is_read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
