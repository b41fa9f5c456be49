"""Shared rendering helpers for the CLI (rich consoles that stay readable in pipes and logs)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

__all__ = [
    "JSON_FLAG",
    "JSON_PRINTED",
    "LOCAL_RAY",
    "human_bytes",
    "json_option",
    "json_printed",
    "make_console",
    "ray_option",
]

_F = TypeVar("_F", bound=Callable[..., Any])

JSON_FLAG = "ninfer.json"
"""Key of the root context's ``obj`` that is true once a command's ``--json`` was given: a
failure is then also printed as a JSON error object on stdout (docs/cli.md "Error objects")."""


JSON_PRINTED = "ninfer.json-printed"
"""Key of the root context's ``obj`` that is true once the command printed its JSON result: a
failure after that (``eval``'s missed thresholds) prints no second object on stdout."""


def json_printed() -> None:
    """Record that the running command printed its JSON result on stdout."""
    state = click.get_current_context().find_root().obj
    if isinstance(state, dict):
        state[JSON_PRINTED] = True


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    state = ctx.find_root().obj
    if value and isinstance(state, dict):
        state[JSON_FLAG] = True
    return value


def json_option(help_text: str) -> Callable[[_F], _F]:
    """The ``--json`` flag of every command (the parameter ``as_json``)."""
    return click.option("--json", "as_json", is_flag=True, help=help_text, callback=_remember_json)


LOCAL_RAY = "local"
"""The value of ``--ray`` given without an address: start a local Ray cluster."""


def ray_option(what: str) -> Callable[[_F], _F]:
    """The ``--ray [ADDRESS]`` option of convert and verify (the parameter ``ray_address``)."""
    return click.option(
        "--ray", "ray_address", is_flag=False, flag_value=LOCAL_RAY, default=None,
        metavar="[ADDRESS]",
        help=f"{what} on a Ray cluster: ADDRESS as ray.init takes it (auto: the running "
        "cluster, ray://HOST:10001); alone, a local cluster (needs the [ray] extra; "
        "docs/cli.md).",
    )  # fmt: skip


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
