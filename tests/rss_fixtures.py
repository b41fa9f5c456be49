"""Shared by the memory tests: the peak RssAnon of a subprocess, sampled from /proc."""

from __future__ import annotations

import subprocess
import threading
import time


def peak_rss_anon_mib(cmd: list[str]) -> tuple[float, str]:
    """Run ``cmd`` to completion (it must exit 0) and return (peak RssAnon in MiB sampled
    every 5 ms, its stdout and stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    for line in f:
                        if line.startswith("RssAnon:"):
                            peak = max(peak, int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    assert proc.returncode == 0, out
    return peak / 1024, out
