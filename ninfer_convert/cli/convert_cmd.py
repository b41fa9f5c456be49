"""``ninfer convert SOURCE [--recipe NAME|PATH] --output OUT``.

A thin layer over :func:`ninfer_convert.convert.convert_checkpoint` and
:func:`ninfer_convert.convert.plan_conversion` with :func:`ninfer_convert.convert.check_output`
(``--dry-run``: with ``--output`` it also says what would be created or replaced, and fails like
the real run would on a refused destination, an unwritable parent or too little space).
``--sign-key`` loads the key before the source is read, and the artifact is signed before it
is published.  Notices (stale staging folders restored or removed) go to stderr, one line each.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from ..container import DEFAULT_ALIGNMENT
from ..convert import (
    ConvertReport,
    OutputCheck,
    ProgressEvent,
    check_output,
    convert_checkpoint,
    plan_conversion,
)
from ..errors import UsageError
from ..recipe import Plan, padding_warnings, resolve_recipe
from ..recipe.cost import WARNINGS_SHOWN
from ..signing import Signer, key_signer
from ..source import SourceCheckpoint, open_source
from .render import LOCAL_RAY, human_bytes, json_option, make_console, ray_option

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6,
          "MIB": 2**20, "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12,
          "TIB": 2**40}  # fmt: skip


def parse_size(text: str) -> int:
    """'5GB' -> 5_000_000_000, '512MiB' -> 536_870_912 (the Hugging Face spelling)."""
    m = _SIZE.match(text)
    unit = (m.group(2) or "").upper() if m else None
    if m is None or unit not in _UNITS:
        raise UsageError(
            f"cannot read size {text!r}", hint="write e.g. 5GB, 500MB, 2GiB or a byte count"
        )
    size = int(m.group(1)) * _UNITS[unit]
    if size <= 0:
        raise UsageError(f"--max-shard-size must be positive, got {text!r}")
    return size


def resolve_cli_recipe(
    source: str, spec: str | None, *, ignore_identity: bool
) -> tuple[str | SourceCheckpoint, Path]:
    """``--recipe`` as a path or shipped name, or picked by the source's identity; a shipped
    recipe is named on stderr."""
    src: str | SourceCheckpoint = source
    if spec is None:
        if ignore_identity:
            raise UsageError(
                "--ignore-identity needs --recipe: without it the recipe is chosen by its identity"
            )
        src = open_source(source)
    resolved = resolve_recipe(spec, src if isinstance(src, SourceCheckpoint) else None)
    if resolved.how != "path":
        click.echo(f"Using the {resolved.describe()}.", err=True)
    return src, resolved.path


def render_plan(plan: Plan) -> None:
    console = make_console()
    table = Table(title=f"Plan: recipe {plan.recipe.name} on {plan.source_path}")
    for col in ("tensor", "source", "rule", "format", "shape", "encoded"):
        table.add_column(col, overflow="fold")
    for e in plan.entries:
        src = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in e.sources)
        rule = f"{e.rule.index + 1} (line {e.rule.line})"
        conv = f" via {e.conversion}" if e.conversion else ""
        table.add_row(e.output, src + conv, rule, e.format, str(list(e.shape)),
                      human_bytes(e.encoded_bytes))  # fmt: skip
    console.print(table)
    totals = Table(title="Totals per format")
    for col in ("format", "tensors", "weights", "source", "encoded", "bits/weight"):
        totals.add_column(col)
    for t in plan.totals:
        totals.add_row(t.format, str(t.tensors), f"{t.weights:,}", human_bytes(t.source_bytes),
                       human_bytes(t.encoded_bytes), f"{t.bits_per_weight:.3f}")  # fmt: skip
    totals.add_row("all", str(len(plan.entries)), f"{plan.total_weights:,}",
                   human_bytes(plan.total_source_bytes), human_bytes(plan.total_encoded_bytes),
                   f"{plan.bits_per_weight:.3f}")  # fmt: skip
    console.print(totals)
    if plan.skipped:
        console.print(f"{len(plan.skipped)} source tensors skipped by the recipe.")
    for m in plan.identity_mismatches:
        console.print(f"[yellow]identity check overridden:[/] {m}")
    render_warnings(plan)


def render_warnings(plan: Plan) -> None:
    """Padding-cost warnings (docs/recipes.md 7.1) on stderr, so --json stdout stays JSON."""
    console = make_console(stderr=True)
    warnings = padding_warnings(plan.entries)
    for w in warnings[:WARNINGS_SHOWN]:
        console.print(f"[yellow]warning:[/] {escape(w.message)}", highlight=False)
    if len(warnings) > WARNINGS_SHOWN:
        console.print(
            f"[yellow]warning:[/] ... and {len(warnings) - WARNINGS_SHOWN} more tensors above "
            'their nominal bits per weight (--json lists every one under "warnings")',
            highlight=False,
        )


class _Reporter:
    """Rich progress bar on a terminal; one plain line per ~5 s (and at the end) otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.last = 0.0

    def __enter__(self) -> _Reporter:
        if self.tty and not self.quiet:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                TransferSpeedColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[tensors]}"), console=make_console(stderr=True),
            )  # fmt: skip
            self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(None, None, None)

    def __call__(self, ev: ProgressEvent) -> None:
        if self.quiet:
            return
        if self.progress is not None:
            if self.task is None:
                self.task = self.progress.add_task(
                    "converting", total=ev.source_bytes_total, tensors=""
                )
            self.progress.update(
                self.task, completed=ev.source_bytes_done, tensors=f"{ev.done}/{ev.total} tensors"
            )
            return
        now = time.monotonic()
        if ev.done in (0, ev.total) or now - self.last >= 5.0:
            self.last = now
            rate = ev.source_bytes_done / ev.elapsed_s if ev.elapsed_s > 0 else 0.0
            click.echo(
                f"[{ev.done}/{ev.total} tensors] {human_bytes(ev.source_bytes_done)} of "
                f"{human_bytes(ev.source_bytes_total)} read, {human_bytes(ev.written_bytes)} "
                f"written, {human_bytes(int(rate))}/s",
                err=True,
            )


def render_output_check(checked: OutputCheck) -> None:
    free = "unknown" if checked.free_bytes is None else human_bytes(checked.free_bytes)
    make_console().print(
        f"Output: {checked.destination.describe()}; needs {human_bytes(checked.needed_bytes)} "
        f"({checked.needed_bytes} bytes), {free} free."
    )


def render_report(report: ConvertReport) -> None:
    console = make_console()
    rate = report.source_bytes / report.elapsed_s if report.elapsed_s > 0 else 0.0
    console.print(
        f"Wrote {report.output} ({', '.join(report.files)}): {report.tensors} tensors, "
        f"{human_bytes(report.source_bytes)} read -> {human_bytes(report.written_bytes)} written "
        f"in {report.elapsed_s:.2f} s ({human_bytes(int(rate))}/s) on {report.device}."
    )
    if report.signature is not None:
        console.print(f"Signed: {report.signature.files} files, {report.signature.identity}; "
                      f"signature {report.signature.path}")  # fmt: skip
        console.print(f"Next: ninfer verify {report.output} --public-key PUBLIC_KEY.pem")
    else:
        console.print(f"Next: ninfer verify {report.output}")


@click.command("convert")
@click.argument("source")
@click.option("--recipe", "recipe", default=None, metavar="NAME|PATH",
              help="A shipped recipe name (see `ninfer recipes`) or a YAML recipe file; "
                   "default: the shipped recipe whose source identity matches SOURCE.")  # fmt: skip
@click.option("--output", "output", type=click.Path(file_okay=False),
              help="Model directory to create (required unless --dry-run).")  # fmt: skip
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Where grouped tensors are encoded.")  # fmt: skip
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker threads.")  # fmt: skip
@click.option("--max-shard-size", "max_shard_size", default=None,
              help="Split the artifact into shards of at most this size (e.g. 5GB).")  # fmt: skip
@click.option("--alignment", type=int, default=DEFAULT_ALIGNMENT, show_default=True,
              help="Byte alignment of every plane: a power of two in [64, 2^30].")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the plan and exit without writing.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--ignore-identity", is_flag=True,
              help="Convert even if config.json does not match the recipe's identity.")  # fmt: skip
@json_option("Print a machine-readable summary.")
@click.option("--sign-key", default=None, metavar="PRIVATE_KEY.pem",
              help="Sign the artifact with this EC private key before publishing it (needs "
              "the [sign] extra).")  # fmt: skip
@click.option("--importance", default=None, metavar="FILE.safetensors",
              help="Importance vectors (ninfer calibrate) for rules that select "
              "MSE_F16_SEARCH_IW_V1 or GPTQ_F16_SEARCH_IW_V1; stored in the artifact.")  # fmt: skip
@click.option("--factors", default=None, metavar="FILE.safetensors",
              help="Compensation factors (ninfer calibrate --factors) for rules that select "
              "GPTQ_F16_SEARCH_IW_V1; stored in the artifact.")  # fmt: skip
@ray_option("Derive and write the shards (one task per shard; needs --max-shard-size)")
def command(
    source: str,
    recipe: str | None,
    output: str | None,
    device: str,
    jobs: int,
    max_shard_size: str | None,
    alignment: int,
    dry_run: bool,
    force: bool,
    ignore_identity: bool,
    as_json: bool,
    sign_key: str | None,
    importance: str | None,
    factors: str | None,
    ray_address: str | None,
) -> None:
    """Convert a safetensors checkpoint SOURCE (model directory, .safetensors file or cached
    org/name repo id) into a .ninfer model directory."""
    shard_size = parse_size(max_shard_size) if max_shard_size is not None else None
    runner = None
    if ray_address is not None:
        from ..cluster import RayCluster

        if shard_size is None:
            raise UsageError(
                "convert --ray needs --max-shard-size: one task writes each shard",
                hint="add e.g. --max-shard-size 5GB (the same flag gives the same bytes locally)",
            )
        cluster = RayCluster(None if ray_address == LOCAL_RAY else ray_address)
        runner = cluster.convert_runner()
    # Fail fast: a bad key is reported before the source is read.
    signer: Signer | None = key_signer(sign_key) if sign_key is not None else None
    src, recipe_path = resolve_cli_recipe(source, recipe, ignore_identity=ignore_identity)
    if dry_run:
        opened, plan = plan_conversion(
            src, recipe_path, check_identity=not ignore_identity, importance=importance,
            factors=factors,
        )  # fmt: skip
        checked: OutputCheck | None = None
        if output is not None:
            checked = check_output(
                opened, plan, output, force=force, alignment=alignment,
                max_shard_size=shard_size, signed=signer is not None,
            )  # fmt: skip
        if as_json:
            doc = plan.to_dict()
            doc["output"] = None if checked is None else checked.to_dict()
            click.echo(json.dumps(doc, indent=2))
            render_warnings(plan)
        else:
            render_plan(plan)
            if checked is not None:
                render_output_check(checked)
        return
    if output is None:
        raise UsageError("--output is required (or use --dry-run)")
    with _Reporter(quiet=as_json) as reporter:
        report = convert_checkpoint(
            src, recipe_path, output, device=device, jobs=jobs, max_shard_size=shard_size,
            alignment=alignment, force=force, check_identity=not ignore_identity,
            progress=reporter, signer=signer, importance=importance, runner=runner,
            factors=factors,
            on_notice=lambda line: click.echo(f"note: {line}", err=True),
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        render_report(report)
    render_warnings(report.plan)
