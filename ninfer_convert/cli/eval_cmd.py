"""``ninfer eval ARTIFACT [--source SRC] [--prompts FILE] [--max-tokens N] [--device D] [--json]``.

A thin layer over :func:`ninfer_convert.evaluate.evaluate_artifact`: progress lines on stderr,
the report as a table (or JSON with ``--json``, schema in docs/cli.md) on stdout, then the
opt-in thresholds: any missed one is a :class:`~ninfer_convert.errors.QualityError` (exit 9)
after the report has been printed.  Exit 0 otherwise, whatever the numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math

import click
from rich.markup import escape
from rich.table import Table

from ..errors import QualityError
from ..evaluate import EvalReport, evaluate_artifact, read_prompts, threshold_failures
from .render import json_option, json_printed, make_console

__all__ = ["command", "render_report"]


def _num(x: float | None, fmt: str = ".4f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def render_report(report: EvalReport, *, max_sqnr: int = 15) -> None:
    console = make_console()
    console.print(
        f"Eval {escape(report.artifact)} against {escape(report.source)}"
        + (f": {report.model_class} ({report.kind})" if report.model_class else "")
        + (
            f", {report.prompts} prompts ({report.prompts_origin}), {report.prompt_tokens} "
            f"tokens ({report.tokenizer}), device {report.device}, {report.dtype}"
            if report.kind
            else ""
        )
    )
    c = report.causal
    if c is not None:
        t = Table(title="Causal LM: artifact against source")
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_row("top-1 agreement", f"{c.top1_agreement:.4f} of {c.positions} positions")
        t.add_row("KL(source || artifact) mean", f"{c.kl_mean:.6f}")
        t.add_row("KL(source || artifact) max", f"{c.kl_max:.6f}")
        t.add_row("perplexity source", f"{c.perplexity_source:.4f}")
        change = c.perplexity_artifact / c.perplexity_source - 1.0
        t.add_row("perplexity artifact", f"{c.perplexity_artifact:.4f} ({change:+.2%})")
        t.add_row(
            f"greedy continuations ({report.max_tokens} tokens)",
            f"{c.greedy_identical}/{c.greedy_prompts} identical, "
            f"{c.greedy_token_agreement:.4f} token agreement",
        )
        console.print(t)
    e = report.encoder
    if e is not None:
        t = Table(title=f"Encoder ({e.pooling} pooling): artifact against source")
        t.add_column("metric")
        t.add_column("value", justify="right")
        t.add_row("cosine min", f"{e.cosine_min:.6f}")
        t.add_row("cosine mean", f"{e.cosine_mean:.6f}")
        t.add_row("nearest-neighbour agreement", _num(e.nearest_neighbour_agreement))
        console.print(t)
    if report.sqnr is not None:
        ranked = sorted(report.sqnr, key=lambda s: math.inf if s.sqnr_db is None else s.sqnr_db)
        t = Table(
            title=f"SQNR per tensor (lowest {min(max_sqnr, len(ranked))} of {len(ranked)}; "
            "--json lists all)"
        )
        for col in ("tensor", "format", "SQNR dB"):
            t.add_column(col, overflow="fold")
        for s in ranked[:max_sqnr]:
            t.add_row(escape(s.name), s.format, "exact" if s.exact else _num(s.sqnr_db, ".2f"))
        console.print(t)
    console.print(f"done in {report.elapsed_s:.2f} s")


@click.command("eval")
@click.argument("artifact", type=click.Path(path_type=str))
@click.option("--source", default=None, metavar="SRC",
              help="Source model directory. Default: the path recorded in the "
              "artifact.")  # fmt: skip
@click.option("--prompts", "prompts_file", default=None, metavar="FILE",
              type=click.Path(path_type=str),
              help="UTF-8 file, one prompt per line ('#' lines and blank lines ignored). "
              "Default: the packaged prompt set.")  # fmt: skip
@click.option("--max-tokens", type=click.IntRange(min=1), default=16, show_default=True,
              help="Length of each greedy continuation (causal LMs).")  # fmt: skip
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the model runs.")  # fmt: skip
@click.option("--dtype", "model_dtype", type=click.Choice(["float32", "bfloat16"]),
              default="float32", show_default=True,
              help="Model compute dtype. bfloat16 halves the memory but rounds the artifact's "
              "reconstructed values to bfloat16.")  # fmt: skip
@click.option("--sqnr", is_flag=True, help="Also report per-tensor SQNR against the source.")
@click.option("--sqnr-only", is_flag=True,
              help="Only per-tensor SQNR: no model run, no transformers needed.")  # fmt: skip
@click.option("--min-top1", type=click.FloatRange(0, 1), default=None,
              help="Fail (exit 9) when top-1 agreement is below this (causal LMs).")  # fmt: skip
@click.option("--max-kl", type=click.FloatRange(min=0), default=None,
              help="Fail (exit 9) when the mean KL is above this (causal LMs).")  # fmt: skip
@click.option("--min-cosine", type=click.FloatRange(-1, 1), default=None,
              help="Fail (exit 9) when the minimum cosine is below this (encoders).")  # fmt: skip
@json_option("Print the report as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def command(
    artifact: str,
    source: str | None,
    prompts_file: str | None,
    max_tokens: int,
    device: str,
    model_dtype: str,
    sqnr: bool,
    sqnr_only: bool,
    min_top1: float | None,
    max_kl: float | None,
    min_cosine: float | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Run ARTIFACT's dequantized weights and its source in the same transformers model and
    compare: top-1 agreement, KL, perplexity and greedy continuations for causal LMs; pooled
    embedding cosine and nearest-neighbour agreement for encoders. Needs the interop extra.
    Exit 0 whatever the numbers, unless a threshold option is given and missed (exit 9).
    """

    def progress(msg: str) -> None:
        if not quiet:
            click.echo(f"eval: {msg}", err=True)

    prompts = read_prompts(prompts_file) if prompts_file is not None else None
    report = evaluate_artifact(
        artifact,
        source=source,
        prompts=prompts,
        prompts_origin=prompts_file,
        max_tokens=max_tokens,
        device=device,
        dtype=model_dtype,
        sqnr=sqnr or sqnr_only,
        run_model=not sqnr_only,
        progress=progress,
    )
    failures = threshold_failures(report, min_top1=min_top1, max_kl=max_kl, min_cosine=min_cosine)
    thresholds = {"min_top1": min_top1, "max_kl": max_kl, "min_cosine": min_cosine}
    report = dataclasses.replace(report, thresholds=thresholds, failures=tuple(failures))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, allow_nan=False))
        json_printed()  # a missed threshold below is in the report's failures
    else:
        render_report(report)
    if failures:
        raise QualityError("; ".join(failures), path=artifact, hint="the thresholds were opt-in")
