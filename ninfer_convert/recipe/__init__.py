"""Checkpoint recipes: load, plan against a source, materialise (docs/recipes.md).

Typical use::

    source = open_source("path/to/model")
    plan = build_plan("recipes/generic-dense.yaml", source)   # or build_plan(load_recipe(p), ...)
    for entry in plan.entries:
        m = materialize(entry, source)
        # m.value: a LogicalTensor (direct, NVFP4/FP8 copies) or an EncodeInput (grouped)
"""

from __future__ import annotations

from .cost import PADDING_TOLERANCE, PaddingWarning, padding_warning, padding_warnings
from .materialize import EncodeInput, Materialized, materialize, nonfinite_mask
from .model import (
    Evidence,
    OutputOptions,
    Problem,
    Recipe,
    RecipeProblems,
    Rule,
    RuleKind,
    SourceIdentity,
    TransformSpec,
)
from .parse import SCHEMA_VERSION, load_recipe, loads_recipe, parse_recipe
from .patterns import NamePattern, NameTemplate, compile_pattern, compile_template
from .plan import (
    FormatTotal,
    Plan,
    PlanEntry,
    PlanSource,
    RuleRef,
    SkippedTensor,
    TransformStep,
    build_plan,
    identity_problems,
)
from .shipped import (
    ResolvedRecipe,
    ShippedRecipe,
    lookup_shipped,
    matching_recipes,
    resolve_recipe,
    shipped_recipe_dir,
    shipped_recipes,
)
from .tables import CONSTRAINTS, CONVERSIONS, COPY_PATHS, Conversion, CopyPath

__all__ = [
    "CONSTRAINTS",
    "CONVERSIONS",
    "COPY_PATHS",
    "PADDING_TOLERANCE",
    "SCHEMA_VERSION",
    "Conversion",
    "CopyPath",
    "EncodeInput",
    "Evidence",
    "FormatTotal",
    "Materialized",
    "NamePattern",
    "NameTemplate",
    "OutputOptions",
    "PaddingWarning",
    "Plan",
    "PlanEntry",
    "PlanSource",
    "Problem",
    "Recipe",
    "RecipeProblems",
    "ResolvedRecipe",
    "Rule",
    "RuleKind",
    "RuleRef",
    "ShippedRecipe",
    "SkippedTensor",
    "SourceIdentity",
    "TransformSpec",
    "TransformStep",
    "build_plan",
    "compile_pattern",
    "compile_template",
    "identity_problems",
    "load_recipe",
    "loads_recipe",
    "lookup_shipped",
    "matching_recipes",
    "materialize",
    "nonfinite_mask",
    "padding_warning",
    "padding_warnings",
    "parse_recipe",
    "resolve_recipe",
    "shipped_recipe_dir",
    "shipped_recipes",
]
