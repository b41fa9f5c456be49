"""``ninfer convert``."""

from __future__ import annotations

import click

from ..errors import UsageError


@click.command("convert")
def command() -> None:
    """Not built yet."""
    raise UsageError("'ninfer convert' is not built yet")
