"""Publishing a staged model directory without ever losing the previous one (docs/container.md
section 8, docs/cli.md "What --force touches").

Contract:

* :class:`OutputLock` takes an exclusive ``fcntl.flock`` on ``.<name>.ninfer-lock`` beside the
  output (same parent) for the whole write; a second writer to the same output gets a
  :class:`ResourceError` naming the holder's pid.  The lock file records the holder's pid and is
  removed on release.  Without ``fcntl`` (Windows) there is no lock.
* :func:`check_destination` decides what may be at the output: nothing, an empty directory, or
  (with ``force``) a complete ``.ninfer`` model directory recognised from its own header/index,
  holding nothing but the files that artifact names (shards, index, recorded side files) and
  the caller's companion files (the signature ``model.sig``).
  Anything else is a :class:`UsageError` that lists what is there.  An output that is, contains
  or lies inside the source is refused whatever ``force`` says.
* :class:`StagingArea` is the hidden folder ``.<name>.ninfer-staging-<hex>`` beside the output:
  ``owner.json`` (pid, process start marker, boot id, host), ``new/`` (the artifact being
  written) and, in the fallback publish only, ``old/`` (the previous output, moved aside).
* :meth:`StagingArea.publish` puts ``new/`` at the output.  Where Linux ``renameat2`` is
  reachable it is one atomic ``RENAME_EXCHANGE`` (or ``RENAME_NOREPLACE`` when nothing is
  there), so the output name always holds the old or the new artifact.  Elsewhere: output ->
  ``old/``, ``new/`` -> output.  The commit point is the parent-directory fsync after that; a
  failure or interrupt before it undoes the renames (the previous state is back), after it the
  old artifact's named files are deleted and nothing else.  SIGINT, SIGTERM and SIGHUP are held
  back for the few renames and delivered right after (:func:`deferred_signals`).
* :func:`recover_stale` (run with the lock held) looks at staging folders of the same output left
  by a dead process (pid gone, or reused: its start marker differs, or another boot): one whose
  ``old/`` is the only copy of the previous output (the output name is missing) is renamed back
  ("restored"); any other is deleted ("removed").  Folders of live processes, of another host, or
  without an owner record (older versions) are left alone and reported.  Legacy
  ``.<name>.ninfer-old-<hex>`` folders are renamed back when the output name is missing.
* :func:`resource_error` maps ENOSPC, EDQUOT, EACCES, EPERM, EROFS (and any other ``OSError`` of
  the file system) to :class:`ResourceError` naming the path, and for space the bytes needed and
  free.

Test hooks (environment): ``NINFER_TEST_PAUSE_AT=<point>`` pauses at a named step
(:func:`ninfer_convert._startup.pause_point`; the points are ``startup``, ``staging`` after each
tensor, ``commit``, ``publish`` before the first rename, ``moved-aside`` between the fallback's
two renames, ``published`` after the new artifact is in place); ``NINFER_TEST_NO_EXCHANGE=1``
forces the fallback publish.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import stat
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from .._startup import pause_point
from ..errors import NinferError, ResourceError, UsageError
from ..jsonlimits import nesting_problem
from .reader import open_artifact
from .wire import INDEX_NAME, SINGLE_NAME

__all__ = [
    "Destination",
    "Interrupted",
    "OutputLock",
    "StagingArea",
    "check_destination",
    "check_free_space",
    "deferred_signals",
    "disk_free",
    "fsync_dir",
    "pause_point",
    "recover_stale",
    "resource_error",
]

STAGING_INFIX = ".ninfer-staging-"
LEGACY_OLD_INFIX = ".ninfer-old-"
LOCK_SUFFIX = ".ninfer-lock"
OWNER_NAME = "owner.json"
NEW_NAME = "new"
OLD_NAME = "old"
_MAX_LISTED = 12
_MAX_ENTRIES = 100_000
_OWNER_MAX_BYTES = 4096
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class Interrupted(BaseException):
    """Raised by the CLI's SIGINT/SIGTERM/SIGHUP handlers; ``published`` is set when the
    signal arrived while the new artifact was being published (it is then complete at that
    path).  A BaseException like KeyboardInterrupt, but not one: click would swallow that."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.published: Path | None = None

    @property
    def signame(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


# ---------------------------------------------------------------------------------------------
# test hooks


def _exchange_disabled() -> bool:
    return os.environ.get("NINFER_TEST_NO_EXCHANGE") == "1"


# ---------------------------------------------------------------------------------------------
# signals


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back inside the block and deliver them (once each) after it.

    Why: a handler that raises (KeyboardInterrupt, the CLI's :class:`Interrupted`) must not cut
    a publish between its renames.  Only the main thread can install handlers, and only it runs
    them, so elsewhere this is a no-op (nothing can be raised into the block)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous: dict[int, Any] = {}
    for sig in _SIGNALS:
        current = signal.getsignal(sig)
        if current is None:  # installed outside Python: cannot be restored, leave it
            continue
        signal.signal(sig, record)
        previous[sig] = current
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)


# ---------------------------------------------------------------------------------------------
# resource errors


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


# ---------------------------------------------------------------------------------------------
# processes


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _start_marker(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), else None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()  # fields after the name start at field 3
    return fields[19] if len(fields) > 19 else None  # field 22: starttime


def owner_record() -> dict[str, Any]:
    pid = os.getpid()
    return {
        "pid": pid,
        "start": _start_marker(pid),
        "boot": _boot_id(),
        "host": socket.gethostname(),
    }


def _alive(owner: dict[str, Any]) -> bool | None:
    """Whether the recorded process still runs (None: cannot tell, e.g. another host)."""
    pid = owner.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    if owner.get("host") != socket.gethostname():
        return None
    boot = _boot_id()
    if boot is not None and owner.get("boot") not in (None, boot):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    except OSError:
        return None
    start = owner.get("start")
    if start is not None:
        now = _start_marker(pid)
        if now is not None and now != start:
            return False  # the pid was reused by a later process
    return True


def _small_json_object(raw: bytes) -> dict[str, Any] | None:
    """A JSON object of at most _OWNER_MAX_BYTES (shallow: the one nesting bound), else None."""
    if len(raw) > _OWNER_MAX_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
        if nesting_problem(text) is not None:
            return None
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _read_owner(path: Path) -> dict[str, Any] | None:
    """The owner record, read only from a regular file (never blocks on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return _small_json_object(os.read(fd, _OWNER_MAX_BYTES + 1))
    except OSError:
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# the lock


class OutputLock:
    """Exclusive lock on ``.<name>.ninfer-lock`` beside ``out``; see the module contract."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.path = out.parent / f".{out.name}{LOCK_SUFFIX}"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory locks
            return
        for _ in range(20):
            try:
                # Never follow a symlink or truncate a file that is not ours.
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | _NOFOLLOW
                             | getattr(os, "O_NONBLOCK", 0), 0o644)  # fmt: skip
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise UsageError(
                        "the output's lock file is a symbolic link",
                        path=str(self.path),
                        hint="remove it; ninfer makes it as a plain file",
                    ) from None
                raise resource_error(exc, self.path, doing="creating the output lock") from None
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise UsageError(
                    "the output's lock file is not a regular file",
                    path=str(self.path),
                    hint="remove it; ninfer makes it as a plain file",
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._holder(fd)
                os.close(fd)
                raise ResourceError(
                    f"output {self.out} is being written by another ninfer convert ({holder})",
                    kind="output_locked",
                    path=str(self.path),
                    hint="wait for that run to finish or stop it; the lock ends with it",
                ) from None
            except OSError as exc:
                os.close(fd)
                raise resource_error(exc, self.path, doing="locking the output") from None
            # The previous holder may have removed the file between our open and our lock.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            try:
                text = json.dumps(owner_record()).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, text, 0)
            except OSError as exc:
                os.close(fd)
                raise resource_error(exc, self.path, doing="writing the output lock") from None
            self._fd = fd
            return
        raise ResourceError(  # pragma: no cover - 20 lost races in a row
            f"could not lock output {self.out}", kind="output_locked", path=str(self.path)
        )

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            value = _small_json_object(os.pread(fd, _OWNER_MAX_BYTES + 1, 0))
        except OSError:
            value = None
        pid = None if value is None else value.get("pid")
        return f"pid {pid}" if isinstance(pid, int) else "pid unknown"

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)  # while holding it: a waiter re-checks the inode
        except OSError:
            pass  # a stale lock file is harmless: the next run locks and reuses it
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# destination


@dataclass(frozen=True)
class Destination:
    """What is at the output now and what publishing over it would delete."""

    path: Path
    kind: Literal["absent", "empty", "artifact"]
    files: tuple[str, ...] = ()
    """Relative paths of the old artifact's files (shards, index, side files)."""
    nbytes: int = 0

    def describe(self) -> str:
        if self.kind == "absent":
            return f"creates {self.path}"
        if self.kind == "empty":
            return f"replaces the empty directory {self.path}"
        return (
            f"replaces the .ninfer model directory {self.path}, removing its "
            f"{len(self.files)} file(s) ({self.nbytes} bytes): {_listing(self.files)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "removes": list(self.files),
            "removes_bytes": self.nbytes,
        }


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def check_source_relation(out: Path, sources: Sequence[Path]) -> None:
    """Refuse an output that is, contains, or lies inside a source path."""
    real_out = _real(out)
    for src in sources:
        real_src = _real(src)
        if real_out == real_src:
            raise UsageError(
                f"the output is the source {src}",
                path=str(out),
                hint="choose an --output outside the source checkpoint",
            )
        if real_src.is_relative_to(real_out):
            raise UsageError(
                f"the output contains the source {src}",
                path=str(out),
                hint="choose an --output outside the source checkpoint",
            )
        if real_src.is_dir() and real_out.is_relative_to(real_src):
            raise UsageError(
                f"the output lies inside the source directory {src}",
                path=str(out),
                hint="choose an --output outside the source checkpoint",
            )


def _entries(root: Path) -> dict[str, os.stat_result]:
    """Every entry under ``root`` by relative path (lstat: symlinks are not followed)."""
    found: dict[str, os.stat_result] = {}
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                rel = Path(e.path).relative_to(root).as_posix()
                found[rel] = st
                if len(found) > _MAX_ENTRIES:
                    raise UsageError(
                        f"the output holds more than {_MAX_ENTRIES} entries; it is not a "
                        ".ninfer model directory, --force does not replace it",
                        path=str(root),
                    )
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
    return found


def _artifact_files(
    out: Path, entries: dict[str, os.stat_result], companions: Sequence[str]
) -> tuple[str, ...]:
    """The relative paths a complete artifact at ``out`` names (plus those of ``companions``
    that are there), or a UsageError."""
    refuse = "--force replaces only an empty directory or a complete .ninfer model directory"
    names = sorted(entries)
    odd = [
        n
        for n in names
        if not (stat.S_ISREG(entries[n].st_mode) or stat.S_ISDIR(entries[n].st_mode))
    ]
    if odd:
        raise UsageError(
            f"the output holds entries that are not regular files or folders "
            f"({_listing(odd)}); {refuse}",
            path=str(out),
            hint="move them away or choose another --output",
        )
    if SINGLE_NAME not in entries and INDEX_NAME not in entries:
        raise UsageError(
            f"the output is not a .ninfer model directory (no {SINGLE_NAME} or {INDEX_NAME}); "
            f"it holds {_listing(names)}; {refuse}",
            kind="output_exists",
            path=str(out),
            hint="choose another --output, or move these files away yourself",
        )
    try:
        with open_artifact(out) as art:
            named = {p.name for p in art.files} | set(art.side_files)
            if art.index_path is not None:
                named.add(art.index_path.name)
        named.update(c for c in companions if c in entries)
    except NinferError as exc:
        raise UsageError(
            f"the output holds an artifact that is not complete or not valid ({exc}); {refuse}",
            path=str(out),
            hint="remove it yourself if you do not need it, or choose another --output",
        ) from None
    folders = {str(Path(n).parent.as_posix()) for n in named if "/" in n}
    for f in list(folders):
        parts = Path(f).parts
        folders.update(Path(*parts[:i]).as_posix() for i in range(1, len(parts)))
    extra = [n for n in names if n not in named and n not in folders]
    if extra:
        raise UsageError(
            f"the output holds files the artifact there does not name ({_listing(extra)}); "
            "--force never deletes files the tool did not make",
            path=str(out),
            hint="move them away or choose another --output",
        )
    return tuple(sorted(named))


def check_destination(
    out: Path, *, force: bool, sources: Sequence[Path] = (), companions: Sequence[str] = ()
) -> Destination:
    """What is at ``out`` and whether it may be replaced; see the module contract.
    ``companions`` are files the caller makes beside an artifact that its header does not list
    (convert: the signature ``model.sig``); they are replaced with it."""
    check_source_relation(out, sources)
    if not os.path.lexists(out):
        return Destination(out, "absent")
    if out.is_symlink() or not out.is_dir():
        raise UsageError(
            "the output exists and is not a directory",
            path=str(out),
            hint="choose another --output",
        )
    try:
        entries = _entries(out)
    except OSError as exc:
        raise resource_error(exc, out, doing="listing the existing output") from None
    if not entries:
        return Destination(out, "empty")
    if not force:
        raise UsageError(
            "the output directory already exists and is not empty",
            kind="output_exists",
            path=str(out),
            hint="pass --force to replace it (only a .ninfer model directory is replaced)",
        )
    files = _artifact_files(out, entries, companions)
    return Destination(out, "artifact", files, sum(entries[f].st_size for f in files))


# ---------------------------------------------------------------------------------------------
# renames


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


# ---------------------------------------------------------------------------------------------
# the staging area


def _is_ours(name: str, out_name: str, infix: str) -> bool:
    prefix = f".{out_name}{infix}"
    return (
        name.startswith(prefix) and re.fullmatch(r"[0-9a-f]{12}", name[len(prefix) :]) is not None
    )


class StagingArea:
    """``.<name>.ninfer-staging-<hex>/{owner.json,new/}`` beside the output."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.root = out.parent / f".{out.name}{STAGING_INFIX}{secrets.token_hex(6)}"
        self.new = self.root / NEW_NAME
        self.old = self.root / OLD_NAME
        self.notes: list[str] = []
        self._replaced: Path | None = None  # where the previous output went
        self.root.mkdir()
        try:
            (self.root / OWNER_NAME).write_text(json.dumps(owner_record()))
            self.new.mkdir()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def publish(self, dest: Destination) -> None:
        """Put ``new/`` at the output over ``dest`` (re-checked by the caller just before);
        on any failure before the commit point (the parent fsync after the last rename) the
        previous state is restored and the error re-raised.  Then call :meth:`finish`.  Call
        both inside :func:`deferred_signals`, once ``new/`` is complete and fsynced."""
        out, parent = self.out, self.out.parent
        if dest.kind == "absent":
            pause_point("publish")
            rename_noreplace(self.new, out)
            try:
                pause_point("published")
                fsync_dir(parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.rename(out, self.new)
                raise
            return
        pause_point("publish")
        if exchange(self.new, out):
            try:
                pause_point("published")
                fsync_dir(parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    exchange(self.new, out)
                raise
            self._replaced = self.new
            return
        # Fallback without an atomic exchange: the output name is missing between the two
        # renames; recover_stale() renames old/ back if the process dies there.
        os.rename(out, self.old)
        try:
            pause_point("moved-aside")
            os.rename(self.new, out)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(self.old, out)
            raise
        try:
            pause_point("published")
            fsync_dir(parent)
            fsync_dir(self.root)
        except BaseException:
            with contextlib.suppress(OSError):
                os.rename(out, self.new)
                os.rename(self.old, out)
            raise
        self._replaced = self.old

    def finish(self, dest: Destination) -> None:
        """After the commit point: delete the replaced artifact's named files (nothing else)
        and the staging area.  Failures become :attr:`notes`; the new artifact stays."""
        old = self._replaced
        if old is None:
            self._cleanup_root()
            return
        try:
            for rel in dest.files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old / rel)
            folders = sorted(
                {
                    p
                    for rel in dest.files
                    for p in (old / rel).parents
                    if p != old and p.is_relative_to(old)
                },
                key=lambda p: len(p.parts),
                reverse=True,
            )
            for folder in folders:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(folder)
            os.rmdir(old)
        except OSError as exc:
            # The new artifact is published; only the clean-up failed.
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                self._keep(f"files the tool did not make appeared in the old output ({exc})")
            else:  # the owner record stays: a later run removes the folder
                self.notes.append(
                    f"could not remove the previous artifact in {self.root} ({exc}); "
                    "the next convert to this output removes it"
                )
            return
        self._cleanup_root()

    def _cleanup_root(self) -> None:
        try:
            os.unlink(self.root / OWNER_NAME)
            os.rmdir(self.root)
        except OSError as exc:
            if os.path.exists(self.root / OWNER_NAME):
                self.notes.append(
                    f"could not remove the staging folder {self.root} ({exc}); "
                    "the next convert to this output removes it"
                )
            else:
                self._keep(f"the staging folder could not be removed ({exc})")

    def _keep(self, why: str) -> None:
        # Without its owner record a later run leaves the folder alone: it may hold files
        # the tool did not make (added to the old output while we were writing).
        with contextlib.suppress(OSError):
            os.unlink(self.root / OWNER_NAME)
        self.notes.append(f"kept {self.root}: {why}; remove it by hand")

    def discard(self) -> None:
        """Remove the staging area (abort)."""
        shutil.rmtree(self.root, ignore_errors=True)


def recover_stale(out: Path) -> list[str]:
    """Restore or remove what dead writers of ``out`` left beside it (hold the lock first);
    returns one line per folder found."""
    parent = out.parent
    notes: list[str] = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return notes
    for name in names:
        folder = parent / name
        if _is_ours(name, out.name, STAGING_INFIX) and folder.is_dir() and not folder.is_symlink():
            note = _recover_area(out, folder)
        elif (
            _is_ours(name, out.name, LEGACY_OLD_INFIX)
            and folder.is_dir()
            and not folder.is_symlink()
        ):
            if os.path.lexists(out):
                note = f"left {folder} alone: an older ninfer's moved-aside output; {out} exists"
            else:
                os.rename(folder, out)
                fsync_dir(parent)
                note = f"restored {out} from {folder} (left by an interrupted --force)"
        else:
            continue
        if note:
            notes.append(note)
    return notes


def _recover_area(out: Path, folder: Path) -> str | None:
    owner = _read_owner(folder / OWNER_NAME)
    if owner is None:
        try:
            os.rmdir(folder)  # died between creating the folder and writing its record
        except OSError:
            return (
                f"left {folder} alone: it has no owner record (made by an older ninfer?); "
                "remove it by hand if no convert is running"
            )
        return None
    pid = owner.get("pid")
    alive = _alive(owner)
    if alive is None:
        return f"left {folder} alone: cannot tell whether its writer (pid {pid}) still runs"
    if alive:
        return f"left {folder} alone: its writer (pid {pid}) is still running"
    old = folder / OLD_NAME
    if old.is_dir() and not os.path.lexists(out):
        os.rename(old, out)
        fsync_dir(out.parent)
        shutil.rmtree(folder, ignore_errors=True)
        return f"restored {out} from {folder} (pid {pid} died while publishing)"
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        return f"could not remove {folder} left by dead pid {pid}; remove it by hand"
    return f"removed {folder} left by pid {pid}, which died before finishing"
