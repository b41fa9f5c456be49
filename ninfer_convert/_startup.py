"""What must happen before anything heavy is imported (kept free of imports beyond the stdlib).

Contract:

* When the process is the ``ninfer`` console script (or ``python -m ninfer_convert.cli``),
  SIGINT, SIGTERM and SIGHUP arriving while the package is still being imported print one
  line and end the process with 128+signal (no ``KeyboardInterrupt`` traceback; nothing has
  been written yet).  ``ninfer_convert.cli.main`` replaces these handlers with its own once it
  runs.  Imported as a library, nothing changes.
* :func:`pause_point` is a test hook: with ``NINFER_TEST_PAUSE_AT=<point>`` the named step
  writes its name to ``NINFER_TEST_PAUSE_FILE`` and sleeps until that file is removed (at most
  60 s, in short sleeps so signal handlers run), so a test can signal the process at that step
  or change the world and let it go on.  Each point pauses once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import time
from types import FrameType

__all__ = ["pause_point"]

_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_paused: set[str] = set()


def pause_point(name: str) -> None:
    """Test hook: pause once at the named step when NINFER_TEST_PAUSE_AT names it."""
    if os.environ.get("NINFER_TEST_PAUSE_AT") != name or name in _paused:
        return
    _paused.add(name)
    marker = os.environ.get("NINFER_TEST_PAUSE_FILE")
    if marker:
        tmp = f"{marker}.tmp"
        with open(tmp, "w") as fh:
            fh.write(name)
        os.replace(tmp, marker)
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline and (marker is None or os.path.exists(marker)):
        time.sleep(0.02)


def _quiet_exit(signum: int, frame: FrameType | None) -> None:
    try:
        name = signal.Signals(signum).name
    except ValueError:  # pragma: no cover
        name = f"signal {signum}"
    try:
        os.write(2, f"Interrupted ({name}) while starting; nothing was written.\n".encode())
    finally:
        os._exit(128 + signum)


def _is_console_script() -> bool:
    """The ``ninfer`` script, or ``python -m ninfer_convert.cli``."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and os.path.basename(path) in ("ninfer", "ninfer.exe"):
        return True
    argv = list(getattr(sys, "orig_argv", ()))
    return any(a == "-m" and b == "ninfer_convert.cli" for a, b in itertools.pairwise(argv))


if _is_console_script():
    for _sig in _SIGNALS:
        with contextlib.suppress(OSError, ValueError):  # ValueError: not the main thread
            signal.signal(_sig, _quiet_exit)
    pause_point("startup")
