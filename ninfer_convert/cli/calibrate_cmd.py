"""``ninfer calibrate SOURCE --output FILE [--prompts FILE] [--max-tokens N] [--device D]
[--compensation-block B|full --factors FILE]``.

A thin layer over :func:`ninfer_convert.calibrate.calibrate_source`: progress lines on stderr,
one summary line on stdout, the vectors in a new safetensors file (docs/cli.md).
"""

from __future__ import annotations

import os

import click

from ..calibrate import calibrate_source, parse_block, write_calibration
from ..errors import UsageError
from ..evaluate import read_prompts
from ..importance import check_importance_output

__all__ = ["command"]


@click.command("calibrate")
@click.argument("source", type=click.Path(path_type=str))
@click.option(
    "--output", "-o", required=True, type=click.Path(path_type=str),
    help="New safetensors file for the importance vectors (never overwritten).",
)  # fmt: skip
@click.option(
    "--prompts", "prompts_file", type=click.Path(path_type=str), default=None,
    help="UTF-8 calibration texts, one per line (default: the packaged set).",
)  # fmt: skip
@click.option(
    "--max-tokens", type=int, default=256, show_default=True,
    help="Tokens kept from each calibration text.",
)  # fmt: skip
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda.")
@click.option(
    "--compensation-block", "block", default=None, metavar="B|full",
    help="Also compute GPTQ_F16_SEARCH_IW_V1 factors with B-wide diagonal blocks (a multiple "
    "of 128) or one block over the whole row ('full'); needs --factors.",
)  # fmt: skip
@click.option(
    "--factors", "factors_output", type=click.Path(path_type=str), default=None,
    help="New safetensors file for the compensation factors (never overwritten).",
)  # fmt: skip
def command(
    source: str,
    output: str,
    prompts_file: str | None,
    max_tokens: int,
    device: str,
    block: str | None,
    factors_output: str | None,
) -> None:
    """Write per-column activation statistics (mean x^2 per Linear input) for the
    importance-weighted encoder profiles, and with --compensation-block the compensation
    factors of GPTQ_F16_SEARCH_IW_V1."""
    parsed = parse_block(block)
    if (parsed is None) != (factors_output is None):
        raise UsageError(
            "--compensation-block and --factors go together",
            hint="give both (the block size and the new factor file) or neither",
        )
    check_importance_output(output)  # before the model is loaded and run
    if factors_output is not None:
        if os.path.abspath(factors_output) == os.path.abspath(output):  # ./x is x
            raise UsageError("--factors must name another file than --output")
        check_importance_output(factors_output)
    texts = read_prompts(prompts_file) if prompts_file is not None else None
    cal = calibrate_source(
        source,
        texts=texts,
        texts_origin=prompts_file,
        max_tokens=max_tokens,
        device=device,
        progress=lambda msg: click.echo(msg, err=True),
        compensation_block=parsed,
    )
    write_calibration(cal, output, factors_output)
    click.echo(
        f"wrote {len(cal.vectors)} importance vectors ({cal.model_class}, {cal.texts} texts, "
        f"{cal.tokens} tokens) to {output}"
    )
    if cal.factors is not None:
        click.echo(
            f"wrote {len(cal.factors)} compensation factors (block {cal.block}, "
            f"{cal.passes} passes) to {factors_output}"
        )
