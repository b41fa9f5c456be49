"""Planning: apply a recipe to a source's metadata and produce the ordered conversion plan.

Contract: :func:`build_plan` reads only metadata (headers, config.json, the recipe).  It checks
the source identity (unless ``check_identity=False``, which records the mismatches instead),
assigns every source tensor to exactly one rule or skip, derives every output's logical shape,
format, layout, conversion and encoded size, and reports *every* problem found together in one
:class:`~.model.RecipeProblems` (each with its rule's line), before any tensor byte is read.

Claiming (docs/recipes.md, "How rules claim tensors"): rules are applied in file order and each
claims source tensors not claimed by an earlier rule; the first rule that matches a tensor
owns it.  A rule that ends up claiming nothing is an error (unless ``optional: true``), so a
rule can never be silently shadowed.  ``derive`` and ``copy`` rules name their inputs
explicitly; an input already claimed by an earlier rule is an error, never a silent reuse.
Tensors no rule claims are an error.  A tensor of a dtype the converter cannot read as values
(F4, F6_*, F8_*FNUZ, C64: ``source.header.OPAQUE_DTYPES``) can only be skipped; an output
made from one is an error.

The plan is deterministic (entries sorted by output name) and JSON-serialisable
(:meth:`Plan.to_json`); :meth:`PlanEntry.to_dict` / :meth:`PlanEntry.from_dict` round-trip.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..formats import FORMATS
from ..jsonfields import paused_gc
from ..source import SourceCheckpoint
from .claiming import Claims
from .cost import padding_warnings
from .entries import PlanEntry, PlanSource, RuleRef, SkippedTensor, TransformStep
from .identity import identity_problems
from .model import Problem, Recipe, RecipeProblems
from .parse import parse_recipe_file
from .plan_entries import EntryBuilder

__all__ = [
    "FormatTotal",
    "Plan",
    "PlanEntry",
    "PlanSource",
    "RuleRef",
    "SkippedTensor",
    "TransformStep",
    "build_plan",
    "identity_problems",
]


@dataclass(frozen=True)
class FormatTotal:
    """Totals of one format: ``bits_per_weight`` = 8 * encoded_bytes / weights."""

    format: str
    tensors: int
    weights: int
    encoded_bytes: int
    source_bytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.encoded_bytes / self.weights if self.weights else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "format": self.format,
            "tensors": self.tensors,
            "weights": self.weights,
            "encoded_bytes": self.encoded_bytes,
            "source_bytes": self.source_bytes,
            "bits_per_weight": self.bits_per_weight,
        }


@dataclass(frozen=True)
class Plan:
    """The whole plan.  ``entries`` are sorted by output name."""

    recipe: Recipe
    source_path: str
    source_kind: str
    source_files: tuple[tuple[str, int], ...]
    identity_checked: bool
    identity_mismatches: tuple[str, ...]
    """Identity problems that ``check_identity=False`` overrode (empty when checked)."""
    entries: tuple[PlanEntry, ...]
    skipped: tuple[SkippedTensor, ...]
    totals: tuple[FormatTotal, ...] = field(default=())

    @property
    def total_weights(self) -> int:
        return sum(t.weights for t in self.totals)

    @property
    def total_encoded_bytes(self) -> int:
        return sum(t.encoded_bytes for t in self.totals)

    @property
    def total_source_bytes(self) -> int:
        return sum(t.source_bytes for t in self.totals)

    @property
    def bits_per_weight(self) -> float:
        """Effective bits per stored element over every output (8 * bytes / elements)."""
        w = self.total_weights
        return 8 * self.total_encoded_bytes / w if w else 0.0

    def entry(self, output: str) -> PlanEntry:
        for e in self.entries:
            if e.output == output:
                return e
        raise KeyError(output)

    def to_dict(self) -> dict[str, object]:
        r = self.recipe
        return {
            "recipe": {"name": r.name, "version": r.version, "digest": r.digest, "path": r.path},
            "source": {
                "path": self.source_path,
                "kind": self.source_kind,
                "files": [[n, s] for n, s in self.source_files],
            },
            "identity": {
                "checked": self.identity_checked,
                "mismatches": list(self.identity_mismatches),
            },
            "entries": [e.to_dict() for e in self.entries],
            "skipped": [s.to_dict() for s in self.skipped],
            "totals": self.totals_dict(),
            "evidence": [e.to_dict() for e in r.evidence],
            "warnings": self.warnings_list(),
        }

    def totals_dict(self) -> dict[str, object]:
        """The ``totals`` member of :meth:`to_dict`."""
        return {
            "per_format": [t.to_dict() for t in self.totals],
            "tensors": len(self.entries),
            "weights": self.total_weights,
            "encoded_bytes": self.total_encoded_bytes,
            "source_bytes": self.total_source_bytes,
            "bits_per_weight": self.bits_per_weight,
        }

    def warnings_list(self) -> list[dict[str, object]]:
        """The ``warnings`` member of :meth:`to_dict`."""
        return [w.to_dict() for w in padding_warnings(self.entries)]

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


def build_plan(
    recipe: Recipe | str | os.PathLike[str],
    source: SourceCheckpoint,
    *,
    check_identity: bool = True,
) -> Plan:
    """Plan ``source`` with ``recipe`` (a loaded :class:`Recipe`, or a recipe file path).

    Given a path, problems of the recipe file itself and of applying it to the source are
    reported together.  Raises :class:`RecipeProblems` listing every problem found.
    """
    load_problems: list[Problem] = []
    if isinstance(recipe, Recipe):
        loaded: Recipe | None = recipe
        path = recipe.path
    else:
        path = os.fspath(recipe)
        loaded, load_problems = parse_recipe_file(path)
    if loaded is None:
        raise RecipeProblems(load_problems, path=path, stage="in the recipe")

    identity = identity_problems(loaded, source)
    applied: list[Problem] = []  # claiming, entry and unclaimed problems, in the order found
    claims = Claims(loaded, source, applied)
    # A few objects per tensor, none cyclic: the collector's passes over them would cost
    # more than building them (see paused_gc).
    with paused_gc():
        claims.claim_all()
        entries = EntryBuilder(claims.candidates, applied).entries()
    claims.unclaimed()
    problems = list(load_problems)
    if check_identity:
        problems += identity
    problems += applied
    if problems:
        applied = applied or (identity if check_identity else [])
        stage = f"applying the recipe to {source.path}" if applied else "in the recipe"
        raise RecipeProblems(problems, path=path, stage=stage)

    totals: dict[str, list[int]] = {}
    for e in entries:
        t = totals.setdefault(e.format, [0, 0, 0, 0])
        t[0] += 1
        t[1] += e.numel
        t[2] += e.encoded_bytes
        t[3] += e.source_bytes
    return Plan(
        recipe=loaded,
        source_path=str(source.path),
        source_kind=source.kind,
        source_files=tuple(source.files),
        identity_checked=check_identity,
        identity_mismatches=() if check_identity else tuple(p.render() for p in identity),
        entries=tuple(entries),
        skipped=tuple(sorted(claims.skipped, key=lambda s: s.name)),
        totals=tuple(FormatTotal(f, *totals[f]) for f in FORMATS if f in totals),
    )
