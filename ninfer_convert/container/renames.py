"""The rename steps of a publish: an atomic exchange of two paths (Linux ``renameat2``
``RENAME_EXCHANGE``), a rename that never replaces (``RENAME_NOREPLACE``, else a checked
``os.rename``), and a directory fsync that makes renames durable.  Where ``renameat2`` is not
reachable :func:`exchange` answers False and the caller takes the two-rename fallback
(docs/container.md section 8).

Test hook (environment): ``NINFER_TEST_NO_EXCHANGE=1`` makes ``renameat2`` unreachable, which
forces the fallback publish.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["exchange", "fsync_dir", "rename_noreplace"]


def _exchange_disabled() -> bool:
    return os.environ.get("NINFER_TEST_NO_EXCHANGE") == "1"


AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_SYSCALL_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "ppc64le": 357}
_renameat2_cache: list[Any] = []


def _renameat2() -> Any:
    if _renameat2_cache:
        return _renameat2_cache[0]
    fn: Any = None
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError:  # pragma: no cover
            libc = None
        if libc is not None and hasattr(libc, "renameat2"):
            call = libc.renameat2
            call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                             ctypes.c_uint]  # fmt: skip
            call.restype = ctypes.c_int
            fn = call
        elif libc is not None and platform.machine() in _SYSCALL_RENAMEAT2:  # pragma: no cover
            number = _SYSCALL_RENAMEAT2[platform.machine()]
            syscall = libc.syscall
            syscall.restype = ctypes.c_long

            def fn(a: int, src: bytes, b: int, dst: bytes, flags: int) -> int:
                return int(
                    syscall(ctypes.c_long(number), ctypes.c_int(a), ctypes.c_char_p(src),
                            ctypes.c_int(b), ctypes.c_char_p(dst), ctypes.c_uint(flags))
                )  # fmt: skip

    _renameat2_cache.append(fn)
    return fn


def _rename2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(src, dst, flags); False when this OS or file system does not offer it."""
    fn = None if _exchange_disabled() else _renameat2()
    if fn is None:
        return False
    if fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux RENAME_EXCHANGE); False where unsupported."""
    return _rename2(a, b, RENAME_EXCHANGE)


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to a ``dst`` that must not exist (atomically so where the OS can)."""
    if _rename2(src, dst, RENAME_NOREPLACE):
        return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "output appeared meanwhile", str(dst))
    os.rename(src, dst)


def fsync_dir(path: Path) -> None:
    """fsync a directory so renames inside it are durable; file systems that cannot fsync a
    directory (EINVAL) are accepted, any other failure raises."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EISDIR):  # pragma: no cover - no directory fds
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
