"""The recipes shipped with the package, by name, and how ``--recipe`` is resolved.

Contract (docs/recipes.md 9):

* The shipped recipes are the ``*.yaml`` files of one folder: ``ninfer_convert/recipes/`` in an
  installed package (pyproject.toml maps the repository's top-level ``recipes/`` there), else,
  in a source checkout, the repository's ``recipes/`` beside the package.  Each is registered
  under its ``name`` key, which must equal its file name without ``.yaml``; a shipped recipe
  that does not load, or two with one name, is a :class:`~..errors.RecipeError` (a packaging
  bug, never skipped).
* :func:`resolve_recipe` turns a ``--recipe`` argument into a recipe: an existing file is a
  path; otherwise the argument must be a shipped name, compared exactly; anything else is a
  :class:`~..errors.UsageError` that lists the shipped names.  Without an argument it picks the
  one shipped recipe whose source identity (docs/recipes.md 3) matches the source; none or
  several matching is a :class:`~..errors.UsageError` listing the candidates.  A recipe with an
  importance-weighted rule (:attr:`ShippedRecipe.needs_importance`) is never a candidate: it
  needs an importance file the user chooses, and shares its identity with the canonical recipe
  it is a variant of; it is used only by name or path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import RecipeError, UsageError
from ..formats import ENCODER_PROFILES, FORMATS
from ..source import SourceCheckpoint
from .model import Recipe, RecipeProblems
from .parse import load_recipe
from .plan import identity_problems

__all__ = [
    "ResolvedRecipe",
    "ShippedRecipe",
    "lookup_shipped",
    "matching_recipes",
    "resolve_recipe",
    "shipped_recipe_dir",
    "shipped_recipes",
]

_SUFFIX = ".yaml"


@dataclass(frozen=True)
class ShippedRecipe:
    """One shipped recipe: its registered name, file and loaded recipe."""

    name: str
    path: Path
    recipe: Recipe

    def formats(self) -> list[tuple[str, float, tuple[str, ...]]]:
        """(format, nominal bits per weight from the registry, roles) for every format the
        recipe's rules store, in registry order."""
        roles: dict[str, set[str]] = {}
        for rule in self.recipe.rules:
            if rule.format is not None:
                roles.setdefault(rule.format, set()).update([rule.role] if rule.role else [])
        return [
            (f.name, f.logical_bits_per_weight, tuple(sorted(roles[f.name])))
            for f in FORMATS.values()
            if f.name in roles
        ]

    @property
    def needs_importance(self) -> bool:
        """Whether a rule selects an importance-weighted encoder profile (convert then needs
        ``--importance``); such a recipe is never picked by source identity."""
        profiles = (ENCODER_PROFILES.get(r.encoder_profile or "") for r in self.recipe.rules)
        return any(p is not None and p.importance for p in profiles)

    @property
    def needs_factors(self) -> bool:
        """Whether a rule selects a compensated encoder profile (convert then also needs
        ``--factors``, from ``ninfer calibrate --compensation-block B --factors FILE``)."""
        profiles = (ENCODER_PROFILES.get(r.encoder_profile or "") for r in self.recipe.rules)
        return any(p is not None and p.factor for p in profiles)

    @property
    def calibration(self) -> tuple[str, ...]:
        """The calibration files convert needs with this recipe, as its options:
        ``()``, ``("--importance",)`` or ``("--importance", "--factors")``."""
        return ("--importance",) * self.needs_importance + ("--factors",) * self.needs_factors

    def to_dict(self) -> dict[str, object]:
        """The ``ninfer recipes --json`` entry (docs/cli.md)."""
        r = self.recipe
        ident = r.source
        return {
            "name": self.name,
            "version": r.version,
            "digest": r.digest,
            "path": str(self.path),
            "description": r.description,
            "identity": {
                "model_type": list(ident.model_type),
                "architectures": list(ident.architectures),
                "config": {k: v for k, v, _ in ident.config},
                "config_absent": [k for k, _ in ident.config_absent],
                "tensor_count": ident.tensor_count,
                "shapes": {n: list(s) for n, s, _ in ident.shapes},
            },
            "formats": [
                {"format": f, "nominal_bits_per_weight": bpw, "roles": list(roles)}
                for f, bpw, roles in self.formats()
            ],
            "output": {"readme": r.output.readme},
            "calibration": list(self.calibration),
        }


@dataclass(frozen=True)
class ResolvedRecipe:
    """What a ``--recipe`` argument (or its absence) resolved to: a recipe file to plan with.

    A recipe file given by path is not loaded here, so that planning reports the file's own
    problems together with those of applying it (docs/recipes.md 1)."""

    path: Path
    how: Literal["path", "name", "identity"]
    """``path``: a recipe file; ``name``: a shipped recipe by name; ``identity``: the one
    shipped recipe whose source identity matches the source."""
    name: str | None
    """The shipped name (None for a file given by path)."""

    def describe(self) -> str:
        if self.how == "path":
            return f"recipe file {self.path}"
        if self.how == "name":
            return f"shipped recipe {self.name} ({self.path})"
        return (
            f"shipped recipe {self.name}, the only one whose source identity matches ({self.path})"
        )


def shipped_recipe_dir() -> Path:
    """The folder the shipped recipes are read from (see the module contract)."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "recipes"
    if installed.is_dir():
        return installed
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "recipes").is_dir():
        return checkout / "recipes"
    raise RecipeError(
        "the shipped recipes are missing from this installation",
        path=str(installed),
        hint="reinstall ninfer-convert, or pass --recipe with a recipe file",
    )


def shipped_recipes(directory: str | os.PathLike[str] | None = None) -> tuple[ShippedRecipe, ...]:
    """Every shipped recipe, sorted by name (``directory`` overrides the shipped folder)."""
    root = Path(directory) if directory is not None else shipped_recipe_dir()
    out: dict[str, ShippedRecipe] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        if not path.name.endswith(_SUFFIX) or not path.is_file():
            continue
        try:
            recipe = load_recipe(path)
        except RecipeProblems as exc:
            raise RecipeError(
                f"a shipped recipe does not load: {exc.message}", path=str(path)
            ) from exc
        stem = path.name[: -len(_SUFFIX)]
        if recipe.name != stem:
            raise RecipeError(
                f"a shipped recipe is registered by its name, which must be its file name: "
                f"name {recipe.name!r} in {path.name}",
                path=str(path),
                hint=f"rename the file to {recipe.name}{_SUFFIX} or set name: {stem}",
            )
        out[recipe.name] = ShippedRecipe(recipe.name, path, recipe)
    return tuple(out[n] for n in sorted(out))


def _names(shipped: tuple[ShippedRecipe, ...]) -> str:
    return ", ".join(s.name for s in shipped) or "none"


def _find(shipped: tuple[ShippedRecipe, ...], name: str) -> ShippedRecipe | None:
    return next((s for s in shipped if s.name == name), None)  # exact: no folding, no prefix


def lookup_shipped(name: str, directory: str | os.PathLike[str] | None = None) -> ShippedRecipe:
    """The shipped recipe registered as exactly ``name``, or a :class:`UsageError`."""
    shipped = shipped_recipes(directory)
    found = _find(shipped, name)
    if found is not None:
        return found
    raise UsageError(
        f"unknown shipped recipe {name!r}",
        hint=f"shipped recipes: {_names(shipped)} (`ninfer recipes` lists them)",
    )


def matching_recipes(
    source: SourceCheckpoint, directory: str | os.PathLike[str] | None = None
) -> tuple[ShippedRecipe, ...]:
    """The shipped recipes that picking by identity chooses among and whose source identity
    matches ``source``, sorted by name (recipes that need importance vectors are not among
    them)."""
    return tuple(s for s in _candidates(directory) if not identity_problems(s.recipe, source))


def _candidates(directory: str | os.PathLike[str] | None) -> tuple[ShippedRecipe, ...]:
    """The shipped recipes that can be picked by identity (see the module contract)."""
    return tuple(s for s in shipped_recipes(directory) if not s.needs_importance)


def resolve_recipe(
    spec: str | os.PathLike[str] | None,
    source: SourceCheckpoint | None = None,
    *,
    directory: str | os.PathLike[str] | None = None,
) -> ResolvedRecipe:
    """Resolve a ``--recipe`` argument; ``source`` is needed only when ``spec`` is None."""
    if spec is not None:
        if Path(spec).is_file():
            return ResolvedRecipe(Path(spec), "path", None)
        text = os.fspath(spec)
        shipped = shipped_recipes(directory)
        found = _find(shipped, text)
        if found is not None:
            return ResolvedRecipe(found.path, "name", found.name)
        raise UsageError(
            f"--recipe {text!r} is neither a recipe file nor a shipped recipe name",
            hint=f"shipped recipes: {_names(shipped)}; or give the path of a YAML recipe",
        )
    if source is None:
        raise UsageError("resolving a recipe by identity needs the source checkpoint")
    checked = [(s, identity_problems(s.recipe, source)) for s in _candidates(directory)]
    matches = [s for s, problems in checked if not problems]
    if len(matches) == 1:
        return ResolvedRecipe(matches[0].path, "identity", matches[0].name)
    cfg = source.config or {}
    seen = f"model_type {cfg.get('model_type')!r}, architectures {cfg.get('architectures')!r}"
    if not matches:
        why = [
            f"{s.name}: {problems[0].message.removeprefix('source identity: ')}"
            for s, problems in checked
        ] + [
            f"{s.name}: needs calibration files (never picked by identity; name it with "
            f"--recipe {s.name} " + " ".join(f"{o} FILE" for o in s.calibration) + ")"
            for s in shipped_recipes(directory)
            if s.needs_importance
        ]
        raise UsageError(
            f"no shipped recipe matches the source (config.json: {seen})"
            + "".join(f"\n  {w}" for w in why),
            path=str(source.path),
            hint="write a recipe for this checkpoint (docs/recipes.md) and pass --recipe PATH",
        )
    raise UsageError(
        f"{len(matches)} shipped recipes match the source (config.json: {seen}): "
        + ", ".join(s.name for s in matches),
        path=str(source.path),
        hint="choose one with --recipe NAME",
    )
