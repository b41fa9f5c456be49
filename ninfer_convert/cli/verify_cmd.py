"""``ninfer verify``."""

from __future__ import annotations

import click

from ..errors import UsageError


@click.command("verify")
def command() -> None:
    """Not built yet."""
    raise UsageError("'ninfer verify' is not built yet")
