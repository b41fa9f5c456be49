"""Shared benchmark helpers: machine description, timing, RssAnon sampling, page-cache eviction."""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    import numpy
    import torch

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """Fastest wall time of ``repeat`` runs (after one warm-up run)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def rss_anon_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


class PeakRssAnon:
    """Samples RssAnon of a process every ``interval`` seconds in a background thread."""

    def __init__(self, pid: int | str = "self", interval: float = 0.01) -> None:
        self.pid, self.interval = pid, interval
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_kib = max(self.peak_kib, rss_anon_kib(self.pid))
            except OSError:
                return
            time.sleep(self.interval)

    def __enter__(self) -> PeakRssAnon:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def evict_files(paths: Iterable[Path]) -> None:
    """Write back and drop the page-cache pages of these files only (fsync, then
    ``POSIX_FADV_DONTNEED``): a cold start without dropping the whole machine's cache."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
