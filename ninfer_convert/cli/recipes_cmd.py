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


def _needs(s: ShippedRecipe) -> str:
    """The calibration files convert needs with the recipe ('-' for none)."""
    return " ".join(f"{o} FILE" for o in s.calibration) or "-"


@click.command("recipes")
@json_option("Print the list as JSON.")
def command(as_json: bool) -> None:
    """List the shipped recipes: the names `ninfer convert --recipe` accepts, the source
    identity each is picked by when --recipe is left out, the formats it stores, and the
    calibration files (`ninfer calibrate`) convert needs with it."""
    directory = shipped_recipe_dir()
    shipped = shipped_recipes(directory)
    if as_json:
        doc = {"directory": str(directory), "recipes": [s.to_dict() for s in shipped]}
        click.echo(json.dumps(doc, indent=2))
        return
    table = Table(title=f"Shipped recipes ({directory})")
    cols = ("name", "version", "source identity", "formats (nominal bits per weight)", "needs")
    for col in cols:
        table.add_column(col, overflow="fold")
    for s in shipped:
        formats = ", ".join(f"{f} ({bpw:g})" for f, bpw, _ in s.formats())
        needs = _needs(s)
        table.add_row(s.name, s.recipe.version, _identity(s), formats, needs)
    make_console().print(table)
