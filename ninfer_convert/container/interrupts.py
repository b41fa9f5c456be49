"""Signals during a write: the CLI's :class:`Interrupted` and :func:`deferred_signals`, which
holds SIGINT, SIGTERM and SIGHUP back for the few renames of a publish and delivers them right
after (docs/container.md section 8; the publish itself is :mod:`.publish`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["Interrupted", "deferred_signals"]

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
