"""The ``ninfer`` command line: a thin click layer over the library.

Contract: each command parses options, calls one library function and renders its result with
rich (or as JSON with ``--json``).  Every :class:`~ninfer_convert.errors.NinferError` becomes a
one-paragraph message on stderr and the exit code of its class (docs/cli.md); a traceback is
shown only with ``--debug``.  Click's own usage errors exit with 2, like :class:`UsageError`.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

import click

from .. import __version__
from ..errors import NinferError, UsageError

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ninfer")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Convert, verify and inspect NInfer checkpoint artifacts."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    from . import convert_cmd, eval_cmd, formats_cmd, inspect_cmd, recipes_cmd, sign_cmd, verify_cmd

    for module in (
        convert_cmd,
        verify_cmd,
        inspect_cmd,
        formats_cmd,
        recipes_cmd,
        sign_cmd,
        eval_cmd,
    ):
        cli.add_command(module.command)


_register()


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        result = cli.main(args=args, prog_name="ninfer", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return UsageError.exit_code
    except NinferError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("Interrupted; nothing was left under the output name.", err=True)
        return 130
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
