"""``ninfer verify ARTIFACT [--source SOURCE] [--device ...] [--jobs N] [--json]``.

A thin layer over :func:`ninfer_convert.verify.verify_artifact`: it renders the report as a rich
table (plain text when stdout is not a terminal) or as JSON (``--json``, schema in docs/cli.md),
shows progress on stderr, and exits with the report's code: 0 when every check passed, 6 when
the artifact is invalid or differs from its source, 4 when the source is not the recorded one
or cannot be found (only ``--no-source`` skips the source checks; every check that did not run
is printed as ``NOT RUN``), 2 for usage errors (missing path, not an artifact, bad option).
With ``--public-key`` (or ``--certificate-chain``, or a Sigstore identity) the directory's
signature is checked first
(:func:`ninfer_convert.signing.verify_directory`): a missing, invalid or non-matching signature
exits 8 before any other check runs; without them the signature's presence is reported, marked
not checked.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from ..errors import UsageError
from ..signing import SignatureStatus, signature_status, verify_directory
from ..verify import (
    CHECK_DESCRIPTIONS,
    DEFAULT_ORACLE_GROUPS,
    DEFAULT_SEED,
    ProgressEvent,
    VerifyReport,
    verify_artifact,
)
from .render import LOCAL_RAY, human_bytes, json_option, make_console, ray_option

__all__ = ["command", "render_report"]

_PHASES = {
    "open": "opening",
    "integrity": "digests",
    "padding": "padding",
    "plan": "planning against the source",
    "tensors": "tensors",
}


class _Reporter:
    """Rich progress on a terminal; one plain stderr line per phase and per ~5 s otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.phase = ""
        self.last = 0.0
        self.lock = threading.Lock()

    def __enter__(self) -> _Reporter:
        if self.tty and not self.quiet:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[item]}"), console=make_console(stderr=True),
                transient=True,
            )  # fmt: skip
            self.progress.__enter__()
            self.task = self.progress.add_task("verify", total=None, item="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(None, None, None)

    def __call__(self, ev: ProgressEvent) -> None:
        if self.quiet:
            return
        label = _PHASES.get(ev.phase, ev.phase)
        with self.lock:
            if self.progress is not None and self.task is not None:
                self.progress.update(
                    self.task, description=label, total=ev.total or None, completed=ev.done,
                    item=ev.item or "",
                )  # fmt: skip
                return
            now = time.monotonic()
            new_phase = ev.phase != self.phase
            tick = ev.phase == "tensors" and (ev.done == ev.total or now - self.last >= 5.0)
            if new_phase or tick:
                count = f" {ev.done}/{ev.total}" if ev.phase == "tensors" else ""
                click.echo(f"verify: {label}{count}", err=True)
                self.phase = ev.phase
                self.last = now


def _status_cell(status: str) -> str:
    """Upper-case status with a colour (rich drops the style on a plain console)."""
    style = {"pass": "green", "fail": "bold red", "skipped": "yellow"}.get(status, "")
    return f"[{style}]{status.upper()}[/]" if style else status.upper()


def render_report(report: VerifyReport, *, max_findings: int = 20) -> None:
    """Print the checks table, the findings, the first mismatch and the error statistics."""
    console = make_console()
    src = report.source
    where = (
        f"source {src.path} ({'given' if src.origin == 'argument' else 'recorded path'})"
        if src.compared
        else f"no source comparison: {src.reason}"
    )
    console.print(
        f"Verify {escape(report.artifact)}: {report.tensors} tensors, "
        f"{human_bytes(report.bytes)}; {escape(where)}"
    )
    table = Table(title="Checks")
    for col in ("#", "check", "status", "tensors", "findings", "what it proves / note"):
        table.add_column(col, overflow="fold")
    for i, c in enumerate(report.checks, start=1):
        text = CHECK_DESCRIPTIONS.get(c.name, "")
        if c.note:
            text += f" ({escape(c.note)})"
        table.add_row(str(i), c.name, _status_cell(c.status), str(c.tensors),
                      str(len(c.findings)), text)  # fmt: skip
    console.print(table)

    findings = report.findings
    if findings:
        ft = Table(title=f"Findings ({len(findings)})")
        for col in ("check", "error", "tensor / file", "message"):
            ft.add_column(col, overflow="fold")
        for f in findings[:max_findings]:
            where = f.tensor or (Path(f.path).name if f.path else "-")
            ft.add_row(f.check, f.error, escape(where), escape(f.message))
        console.print(ft)
        if len(findings) > max_findings:
            console.print(
                f"... and {len(findings) - max_findings} more (--max-findings, or --json for all)"
            )
    first = report.first_mismatch
    if first is not None:
        console.print(
            f"First mismatch: tensor {escape(first.tensor)!s}: {escape(first.describe())}"
        )

    if report.statistics:
        worst = report.worst()
        st = Table(
            title=f"Error statistics against the source (worst {len(worst)} of "
            f"{len(report.statistics)} quantized tensors; information, not pass/fail)"
        )
        for col in ("tensor", "format", "weights", "max |error|", "RMS error", "SQNR dB"):
            st.add_column(col, overflow="fold")
        for s in worst:
            sqnr = "exact" if s.exact else ("-" if s.sqnr_db is None else f"{s.sqnr_db:.2f}")
            st.add_row(escape(s.tensor), s.format, f"{s.numel:,}", f"{s.max_abs_error:.6g}",
                       f"{s.rms_error:.6g}", sqnr)  # fmt: skip
        console.print(st)

    rate = human_bytes(int(report.bytes_per_second))
    not_run = report.not_run
    reasons: dict[str, list[str]] = {}
    for name, why in not_run:
        reasons.setdefault(why, []).append(name)
    for why, names in reasons.items():  # one loud line per reason, naming every check
        console.print(f"[bold yellow]NOT RUN[/]: {', '.join(names)}: {escape(why)}")
    if report.passed:
        what = (
            f"every check that ran passed; {len(not_run)} NOT RUN: "
            + ", ".join(name for name, _ in not_run)
            if not_run
            else "every check passed"
        )
        console.print(
            f"[bold green]PASS[/]: {what} ({report.tensors} tensors, "
            f"{human_bytes(report.bytes)} in {report.seconds:.2f} s, {rate}/s)"
        )
    else:
        console.print(
            f"[bold red]FAIL[/]: {len(findings)} finding(s); exit code {report.exit_code} "
            f"({report.seconds:.2f} s)"
        )


@click.command("verify")
@click.argument("artifact", type=click.Path(path_type=str))
@click.option("--source", default=None, metavar="SOURCE",
              help="Source checkpoint to compare against (model directory, .safetensors file, "
              "or cached org/name). Default: the path recorded in the artifact, when it "
              "exists.")  # fmt: skip
@click.option("--no-source", is_flag=True,
              help="Skip the source checks (reported as NOT RUN). Without it, source checks "
              "that cannot run (recorded source not found) fail with exit 4.")  # fmt: skip
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Where grouped tensors are re-encoded.")  # fmt: skip
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker threads (one tensor each at a time).")  # fmt: skip
@click.option("--oracle-groups", type=click.IntRange(min=0), default=DEFAULT_ORACLE_GROUPS,
              show_default=True,
              help="Groups per grouped tensor re-encoded with the bit-level oracle.")  # fmt: skip
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True,
              help="Seed of the oracle group sample.")  # fmt: skip
@json_option("Print the report as JSON on stdout.")
@click.option("--max-findings", type=click.IntRange(min=0), default=20, show_default=True,
              help="Findings listed in the table (--json lists all).")  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@click.option("--public-key", default=None, metavar="KEY.pem",
              help="Check the directory's signature with this EC public key first (exit 8 "
              "when it fails).")  # fmt: skip
@click.option("--certificate-chain", "chain", multiple=True, metavar="PEM",
              help="Check a certificate signature against these trusted certificates "
              "(repeatable).")  # fmt: skip
@click.option("--sigstore-identity", default=None, metavar="IDENTITY",
              help="Check a Sigstore signature made by this identity (needs the "
              "network).")  # fmt: skip
@click.option("--sigstore-issuer", default=None, metavar="URL",
              help="The OIDC issuer of --sigstore-identity.")  # fmt: skip
@click.option("--signature", default=None, metavar="PATH",
              help="The signature file (default: ARTIFACT/model.sig).")  # fmt: skip
@ray_option("Run the per-tensor checks")
@click.pass_context
def command(
    ctx: click.Context,
    artifact: str,
    source: str | None,
    no_source: bool,
    device: str,
    jobs: int,
    oracle_groups: int,
    seed: int,
    as_json: bool,
    max_findings: int,
    quiet: bool,
    public_key: str | None,
    chain: tuple[str, ...],
    sigstore_identity: str | None,
    sigstore_issuer: str | None,
    signature: str | None,
    ray_address: str | None,
) -> None:
    """Check that ARTIFACT is exactly what its recipe promised.

    In order: structure, integrity (every digest), layout padding, value invariants, and
    against the source (identity, bit-exact re-derivation, oracle sample), then error
    statistics. Every finding is reported. Exit code 0 only when everything passes (source
    checks count unless --no-source); 6 when the artifact is invalid or differs from its source;
    4 when the source is not the recorded one or cannot be found; 2 for usage errors. With
    --public-key the signature is checked first: exit 8 when it does not match.
    """
    if source is not None and no_source:
        raise UsageError("--source and --no-source contradict each other")
    checks = None
    if ray_address is not None:
        from ..cluster import RayCluster

        checks = RayCluster(None if ray_address == LOCAL_RAY else ray_address).verify_runner()
    sig: SignatureStatus
    # ``is not None``: an empty value (an unset shell variable) asks for a check too.
    asked = (public_key, sigstore_identity, sigstore_issuer)
    if chain or any(a is not None for a in asked):
        if not quiet:
            click.echo("verify: signature", err=True)
        sig = verify_directory(
            artifact, signature=signature, public_key=public_key, certificate_chain=chain,
            sigstore_identity=sigstore_identity, sigstore_issuer=sigstore_issuer,
        )  # fmt: skip
    else:
        sig = signature_status(artifact, signature=signature)
    with _Reporter(quiet) as reporter:
        report = verify_artifact(
            artifact,
            source=source,
            use_recorded_source=not no_source,
            device=device,
            jobs=jobs,
            oracle_groups=oracle_groups,
            seed=seed,
            progress=reporter,
            tensor_checks=checks,
        )
    if as_json:
        data = {**report.to_json(), "signature": sig.to_json()}
        click.echo(json.dumps(data, indent=2, allow_nan=False))
    else:
        make_console().print(f"Signature {escape(sig.describe())}")
        render_report(report, max_findings=max_findings)
    if report.exit_code:
        ctx.exit(report.exit_code)
