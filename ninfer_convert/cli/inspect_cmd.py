"""``ninfer inspect ARTIFACT [--json] [--tensor NAME] [--filter GLOB]``.

A thin layer over :mod:`ninfer_convert.inspect`: a summary and a tensor table from the header
alone, and with ``--tensor`` one tensor's provenance, layout and value statistics (which reads
that tensor's values).  ``--json`` prints the stable schema documented in docs/cli.md.  Exit
codes: 0, 2 for a usage error (missing path, not an artifact, unknown tensor name), 6 when the
artifact's header is invalid.  Whether the model directory carries a signature, and what it
claims, is read from the signature file alone (:func:`ninfer_convert.signing.signature_status`):
inspect never checks it.
"""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from ..inspect import InspectReport, TensorDetails, inspect_artifact
from ..signing import SignatureStatus, signature_status
from .render import human_bytes, json_option, make_console

__all__ = ["command", "render_details", "render_summary"]


def _bpw(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _shards(report: InspectReport) -> str:
    if len(report.files) < report.shard_count:  # one shard opened by its own name
        return f"{len(report.files)} of {report.shard_count} shards (opened alone)"
    return f"{report.shard_count} shard(s)"


def render_summary(
    report: InspectReport, *, table: bool = True, signature: SignatureStatus | None = None
) -> None:
    """The artifact summary, the per-format totals and (``table``) the tensor table."""
    console = make_console()
    src = report.source
    rec = report.recipe
    overhead = report.total_bytes - report.plane_bytes
    lines = [
        f"Artifact   {escape(report.path)}",
        f"Producer   {escape(str(report.producer.get('name')))} "
        f"{escape(str(report.producer.get('version')))}",
        f"Recipe     {escape(str(rec['name']))} ({escape(str(rec['digest']))}), "
        f"{len(rec['evidence'])} evidence entries",
        f"Source     {escape(str(src['kind']))} {escape(str(src['path']))}"
        + (f" @ {escape(str(src['repo']['commit']))}" if src.get("repo") else "")
        + ": "
        f"{len(src['files'])} file(s), {src['tensor_count']} tensors recorded"
        + (f", model_type {escape(str(src['model_type']))}" if src.get("model_type") else ""),
        f"Files      {_shards(report)}: "
        + ", ".join(f"{escape(n)} ({human_bytes(b)})" for n, b in report.files),
        f"Bytes      {human_bytes(report.total_bytes)} on disk = "
        f"{human_bytes(report.plane_bytes)} planes + {human_bytes(report.header_bytes)} headers "
        f"+ {human_bytes(report.gap_bytes)} alignment gaps (alignment {report.alignment}; "
        f"overhead {100 * overhead / report.total_bytes if report.total_bytes else 0:.2f}%)",
        f"Side files {', '.join(escape(str(f['name'])) for f in report.side_files) or '-'}",
    ]
    if report.stray_files:
        lines.append(
            "[bold yellow]Stray[/]      "
            + ", ".join(escape(n) for n in report.stray_files)
            + " (container-like files that are not part of this artifact; verify fails on them)"
        )
    if signature is not None:
        lines.append(f"Signature  {escape(signature.describe())}")
    for line in lines:
        console.print(line)
    ft = Table(title=f"Tensors per format ({report.tensor_count} tensors)")
    for col in ("format", "tensors", "weights", "bytes", "logical bits/w", "physical bits/w"):
        ft.add_column(col)
    for f in report.formats:
        ft.add_row(f.format, str(f.tensors), f"{f.weights:,}", human_bytes(f.bytes),
                   _bpw(f.logical_bits_per_weight), _bpw(f.physical_bits_per_weight))  # fmt: skip
    console.print(ft)
    if not table:
        return
    title = f"Tensors ({len(report.tensors)}"
    title += f" matching {report.filter!r})" if report.filter is not None else ")"
    tt = Table(title=escape(title))
    for col in ("name", "format", "layout", "shape", "bytes", "role", "encoder / conversion"):
        tt.add_column(col, overflow="fold")
    for t in report.tensors:
        tt.add_row(escape(t.name), t.format, t.layout, str(list(t.shape)), human_bytes(t.bytes),
                   escape(t.role or "-"), escape(t.derivation))  # fmt: skip
    console.print(tt)


def render_details(d: TensorDetails) -> None:
    """One tensor: provenance, planes, and value statistics."""
    console = make_console()
    r = d.row
    console.print(f"Tensor     {escape(r.name)}")
    console.print(
        f"Format     {r.format} in {r.layout}; shape {list(r.shape)}, physical "
        f"{list(r.physical)}; {human_bytes(r.bytes)} ({d.padding_bytes} padding bytes); "
        f"bits/weight logical {_bpw(r.logical_bits_per_weight)}, physical "
        f"{_bpw(r.physical_bits_per_weight)}"
    )
    console.print(f"Stored in  {escape(r.file)} (shard {r.shard}); role {escape(r.role or '-')}")
    console.print("Provenance " + escape(json.dumps(d.provenance, indent=2)))
    pt = Table(title="Planes")
    for col in ("plane", "offset", "bytes", "extents", "word", "digest (xxh3-128)"):
        pt.add_column(col)
    for p in d.planes:
        pt.add_row(p.name, str(p.offset), str(p.bytes), str(list(p.extents)), p.word, p.digest)
    console.print(pt)
    v = d.values

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.7g}"

    console.print(
        f"Values     {v.count:,} (finite {v.finite:,}, NaN {v.nan:,}, inf {v.inf:,}); "
        f"min {num(v.min)}, max {num(v.max)}, mean {num(v.mean)}"
    )
    if v.zero_scale_groups is not None:
        console.print(f"Zero scales {v.zero_scale_groups:,} of {v.scale_groups:,}")
    if v.code_histogram is not None:
        ht = Table(title="Code histogram")
        ht.add_column("code")
        ht.add_column("count")
        ht.add_column("share")
        total = sum(v.code_histogram.values()) or 1
        for code, count in sorted(v.code_histogram.items()):
            ht.add_row(str(code), f"{count:,}", f"{100 * count / total:.2f}%")
        console.print(ht)


@click.command("inspect")
@click.argument("artifact", type=click.Path(path_type=str))
@json_option("Print the stable JSON schema on stdout.")
@click.option("--tensor", "tensor", default=None, metavar="NAME",
              help="Also show this tensor's provenance, layout and value statistics "
              "(reads its values).")  # fmt: skip
@click.option("--filter", "pattern", default=None, metavar="GLOB",
              help="List only tensors whose name matches this case-sensitive glob.")  # fmt: skip
def command(artifact: str, as_json: bool, tensor: str | None, pattern: str | None) -> None:
    """Show what is inside ARTIFACT (reads only the header unless --tensor is given).

    For the registry of formats, layouts and encoder profiles use 'ninfer formats'.
    """
    report = inspect_artifact(artifact, filter=pattern, tensor=tensor)
    signature = signature_status(artifact)
    if as_json:
        data = {**report.to_json(), "signature": signature.to_json()}
        click.echo(json.dumps(data, indent=2, allow_nan=False))
        return
    render_summary(report, table=tensor is None or pattern is not None, signature=signature)
    if report.details is not None:
        render_details(report.details)
