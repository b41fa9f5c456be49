"""The output's lock: :class:`OutputLock` takes an exclusive ``fcntl.flock`` on
``.<name>.ninfer-lock`` beside the output (same parent) for the whole write (``ninfer
convert``) or the whole signing (``ninfer sign``); a second command on the same output gets a
:class:`ResourceError` naming the holder's command and pid.  The lock file records the holder
(:func:`~.owner.owner_record` plus ``command``) and is removed on release.  Without ``fcntl``
(Windows) there is no lock."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from ..errors import ResourceError, UsageError
from .owner import _NOFOLLOW, _OWNER_MAX_BYTES, _small_json_object, owner_record
from .resources import resource_error

__all__ = ["LOCK_SUFFIX", "OutputLock"]

LOCK_SUFFIX = ".ninfer-lock"

_DOING = {"convert": "written", "sign": "signed"}
"""What a holder does to the output, by the command recorded in the lock file."""


class OutputLock:
    """Exclusive lock on ``.<name>.ninfer-lock`` beside ``out``; see the module contract."""

    def __init__(self, out: Path, command: str = "convert") -> None:
        if command not in _DOING:
            raise ValueError(f"unknown lock command {command!r}")
        self.out = out
        self.command = command
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
                command, pid = self._holder(fd)
                os.close(fd)
                raise ResourceError(
                    f"output {self.out} is being {_DOING[command]} by another ninfer {command} "
                    f"({pid})",
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
                text = json.dumps({**owner_record(), "command": self.command}).encode()
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
    def _holder(fd: int) -> tuple[str, str]:
        """(command, "pid N") of the holder, from its lock file; a record that cannot be read
        (the holder is between its lock and its write, or an older version) says convert."""
        try:
            value = _small_json_object(os.pread(fd, _OWNER_MAX_BYTES + 1, 0))
        except OSError:
            value = None
        value = value or {}
        pid, command = value.get("pid"), value.get("command")
        return (
            command if isinstance(command, str) and command in _DOING else "convert",
            f"pid {pid}" if isinstance(pid, int) and not isinstance(pid, bool) else "pid unknown",
        )

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
