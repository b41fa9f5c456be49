"""Who made a lock or staging folder: the owner record (pid, process start marker, boot id,
host) written beside what a writer makes, read back without blocking, and whether the process
it names still runs (docs/container.md section 8).  A pid alone is not enough: it is reused by
later processes and after a reboot, so the start marker and boot id must match too."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

from ..jsonlimits import nesting_problem

__all__ = ["owner_record"]

_OWNER_MAX_BYTES = 4096
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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
