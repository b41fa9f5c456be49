"""``ninfer recipes``: list the shipped recipes, their source identity and formats."""

from __future__ import annotations

import json

import click
from rich.table import Table

from ..recipe import ShippedRecipe, shipped_recipe_dir, shipped_recipes
from .render import json_option, make_console


def _identity(s: ShippedRecipe) -> str:
    ident = s.recipe.source
    parts = []
    if ident.model_type:
        parts.append("model_type " + " | ".join(ident.model_type))
    if ident.architectures:
        parts.append("architectures " + " | ".join(ident.architectures))
    parts += [f"{k} = {json.dumps(v)}" for k, v, _ in ident.config]
    parts += [f"no {k}" for k, _ in ident.config_absent]
    if ident.tensor_count is not None:
        parts.append(f"{ident.tensor_count} tensors")
    if ident.shapes:
        parts.append(f"{len(ident.shapes)} tensor shapes")
    return "; ".join(parts)


@click.command("recipes")
@json_option("Print the list as JSON.")
def command(as_json: bool) -> None:
    """List the shipped recipes: the names `ninfer convert --recipe` accepts, the source
    identity each is picked by when --recipe is left out, and the formats it stores."""
    directory = shipped_recipe_dir()
    shipped = shipped_recipes(directory)
    if as_json:
        doc = {"directory": str(directory), "recipes": [s.to_dict() for s in shipped]}
        click.echo(json.dumps(doc, indent=2))
        return
    table = Table(title=f"Shipped recipes ({directory})")
    for col in ("name", "version", "source identity", "formats (nominal bits per weight)"):
        table.add_column(col, overflow="fold")
    for s in shipped:
        formats = ", ".join(f"{f} ({bpw:g})" for f, bpw, _ in s.formats())
        table.add_row(s.name, s.recipe.version, _identity(s), formats)
    make_console().print(table)
