"""Shared rendering helpers for the CLI (rich consoles that stay readable in pipes and logs)."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["human_bytes", "make_console"]


def make_console(*, stderr: bool = False) -> Console:
    """A rich console; when not on a terminal, wide enough that tables are never truncated."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=240, color_system=None, force_terminal=False)


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover
