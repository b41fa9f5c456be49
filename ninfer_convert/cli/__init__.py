"""The ``ninfer`` command line: a thin click layer over the library.

Contract: each command parses options, calls one library function and renders its result with
rich (or as JSON with ``--json``).  Every :class:`~ninfer_convert.errors.NinferError` becomes a
one-paragraph message on stderr and the exit code of its class (docs/cli.md); a traceback is
shown only with ``--debug``.  Click's own usage errors exit with 2, like :class:`UsageError`.
After a command's ``--json`` flag, a failure also prints its error object (``kind``
``ninfer-error``, :meth:`~ninfer_convert.errors.NinferError.to_json`) on stdout.
An ``OSError`` of the machine (no space, quota, permission, read-only) that reaches here is a
:class:`ResourceError` (exit 7), never a traceback.

While :func:`main` runs, SIGINT, SIGTERM and SIGHUP raise
:class:`~ninfer_convert.container.publish.Interrupted`: the writer removes its staging area
(or, when the signal came during the publish, finishes it) and the process exits with 128+signal
after one line saying what was (not) written.
"""

from __future__ import annotations

import errno
import json
import signal
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

import click

from .._version import __version__
from ..container.publish import Interrupted, resource_error
from ..errors import NinferError, UsageError
from .render import JSON_FLAG, JSON_PRINTED

__all__ = ["ERROR_SCHEMA_VERSION", "cli", "main"]

ERROR_SCHEMA_VERSION = 1
"""Version of the ``--json`` error object (docs/cli.md "Error objects"); fields are only added."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ninfer")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Convert, verify and inspect NInfer checkpoint artifacts."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    from . import (
        calibrate_cmd,
        convert_cmd,
        eval_cmd,
        formats_cmd,
        inspect_cmd,
        recipes_cmd,
        sign_cmd,
        verify_cmd,
    )

    for module in (
        convert_cmd,
        verify_cmd,
        inspect_cmd,
        formats_cmd,
        recipes_cmd,
        sign_cmd,
        eval_cmd,
        calibrate_cmd,
    ):
        cli.add_command(module.command)


_register()


_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise Interrupted inside the block (main thread only)."""
    previous: dict[int, Any] = {}
    try:
        for sig in _SIGNALS:
            previous[sig] = signal.signal(sig, _interrupt)
    except ValueError:  # not the main thread: leave the process's handlers alone
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        with _signals_interrupt():
            return _run(args, debug)
    except Interrupted as exc:  # a signal after _run returned (or while unwinding)
        return _interrupted(exc)
    except KeyboardInterrupt:  # only when the handlers could not be installed
        click.echo("Interrupted (SIGINT); nothing was written.", err=True)
        return 130


def _interrupted(exc: Interrupted) -> int:
    if exc.published is not None:
        click.echo(
            f"Interrupted ({exc.signame}) after the new artifact was published at {exc.published}.",
            err=True,
        )
    else:
        click.echo(f"Interrupted ({exc.signame}); nothing was written.", err=True)
    return 128 + exc.signum


def _failed(exc: NinferError, state: dict[str, Any], *, shown: bool = False) -> int:
    """One failure: its line on stderr (unless ``shown``) and, after ``--json``, its error
    object on stdout."""
    if not shown:
        click.echo(f"error: {exc}", err=True)
    if state.get(JSON_FLAG) and not state.get(JSON_PRINTED):
        obj = {
            "schema_version": ERROR_SCHEMA_VERSION,
            "kind": "ninfer-error",
            "error": exc.to_json(),
        }
        click.echo(json.dumps(obj, indent=2, allow_nan=False))
    return exc.exit_code


def _run(args: list[str], debug: bool) -> int:
    state: dict[str, Any] = {}
    try:
        result = cli.main(args=args, prog_name="ninfer", standalone_mode=False, obj=state)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        # The command line did not parse, so the flag may not have been seen: ask the words.
        if "--json" in args:
            state[JSON_FLAG] = True
        return _failed(UsageError(exc.format_message()), state, shown=True)
    except NinferError as exc:
        if debug:
            traceback.print_exc()
        return _failed(exc, state)
    except Interrupted as exc:
        return _interrupted(exc)
    except KeyboardInterrupt:
        click.echo("Interrupted (SIGINT); nothing was written.", err=True)
        return 130
    except OSError as exc:
        if exc.errno not in _RESOURCE_ERRNOS:
            raise
        if debug:
            traceback.print_exc()
        return _failed(resource_error(exc, exc.filename or "?", doing="file system"), state)
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
