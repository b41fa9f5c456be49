"""``ninfer inspect``."""

from __future__ import annotations

import click

from ..errors import UsageError


@click.command("inspect")
def command() -> None:
    """Not built yet."""
    raise UsageError("'ninfer inspect' is not built yet")
