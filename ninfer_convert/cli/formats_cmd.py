"""``ninfer formats``: list the closed registry, its layouts and encoder profiles."""

from __future__ import annotations

import json

import click
from rich.table import Table

from ..formats import ENCODER_PROFILES, FORMATS
from .render import json_option, make_console


def registry_json() -> dict[str, object]:
    return {
        "formats": [
            {
                "name": f.name,
                "category": f.category.value,
                "code_bits": f.code_bits,
                "group_size": f.group_size,
                "qmin": f.qmin,
                "qmax": f.qmax,
                "scale_word": f.scale_word,
                "layout": f.layout,
                "logical_bits_per_weight": f.logical_bits_per_weight,
                "encoder_profiles": sorted(
                    p.name for p in ENCODER_PROFILES.values() if f.name in p.formats
                ),
            }
            for f in FORMATS.values()
        ],
        "encoder_profiles": [
            {"name": p.name, "formats": sorted(p.formats), "description": p.description}
            for p in ENCODER_PROFILES.values()
        ],
    }


@click.command("formats")
@json_option("Print the registry as JSON.")
def command(as_json: bool) -> None:
    """List the nine registered numeric formats, their layouts and encoder profiles."""
    data = registry_json()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = Table(title="NInfer numeric formats (closed registry)")
    for col in ("format", "category", "bits", "group", "codes", "scale", "layout", "profiles"):
        table.add_column(col)
    for f in FORMATS.values():
        codes = f"[{f.qmin}, {f.qmax}]" if f.qmin is not None else "-"
        profiles = ", ".join(p.name for p in ENCODER_PROFILES.values() if f.name in p.formats)
        table.add_row(
            f.name, f.category.value, str(f.code_bits), str(f.group_size or "-"), codes,
            f.scale_word or "-", f.layout, profiles or "-",
        )  # fmt: skip
    make_console().print(table)
