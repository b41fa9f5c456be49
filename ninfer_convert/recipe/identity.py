"""Source identity: does a source checkpoint match what a recipe's ``source:`` block expects?

Contract (docs/recipes.md, the ``source:`` block): :func:`identity_problems` compares the
source's config.json (``model_type``, ``architectures``, dotted ``config`` keys with JSON-typed
equality, ``config_absent`` keys), its tensor count and named tensor shapes with the recipe, and
returns one :class:`~.model.Problem` per mismatch, each at the recipe line that states the
expectation.  It reads only metadata and never raises for a mismatch.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..source import SourceCheckpoint
from .model import Problem, Recipe

__all__ = ["identity_problems"]


def identity_problems(recipe: Recipe, source: SourceCheckpoint) -> list[Problem]:
    """The source-identity problems of ``recipe`` against ``source`` (empty: it matches)."""
    ident = recipe.source
    cfg = source.config
    out: list[Problem] = []

    def bad(line: int, msg: str) -> None:
        out.append(Problem(line, "source identity: " + msg))

    keys = ("model_type", "architectures", "config", "config_absent")
    needs_config = any(getattr(ident, k) for k in keys)
    if needs_config and cfg is None:
        first = next(k for k in keys if getattr(ident, k))
        bad(
            ident.line_of(first),
            f"the recipe checks config.json but the source ({source.kind}) has none",
        )
    if cfg is not None:
        if ident.model_type:
            mt = cfg.get("model_type")
            if mt not in ident.model_type:
                bad(
                    ident.line_of("model_type"),
                    f"config.json model_type is {mt!r}, the recipe is for "
                    + " or ".join(repr(m) for m in ident.model_type),
                )
        if ident.architectures:
            archs = cfg.get("architectures")
            have = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
            if not set(have) & set(ident.architectures):
                bad(
                    ident.line_of("architectures"),
                    f"config.json architectures are {have}, the recipe is for "
                    + " or ".join(ident.architectures),
                )
        for key, expected, line in ident.config:
            found, value = _lookup(cfg, key)
            if not found:
                bad(line, f"config.json has no {key!r} (the recipe expects {expected!r})")
            elif not _json_equal(value, expected):
                bad(line, f"config.json {key} is {value!r}, the recipe expects {expected!r}")
        for key, line in ident.config_absent:
            if _lookup(cfg, key)[0]:
                bad(line, f"config.json has {key!r}, the recipe is for sources without it")
    if ident.tensor_count is not None and ident.tensor_count != len(source.tensors):
        bad(
            ident.line_of("tensor_count"),
            f"the source has {len(source.tensors)} tensors, the recipe expects "
            f"{ident.tensor_count}",
        )
    for name, shape, line in ident.shapes:
        info = source.tensors.get(name)
        if info is None:
            bad(line, f"the source has no tensor {name!r}")
        elif info.shape != shape:
            bad(line, f"{name!r} has shape {list(info.shape)}, the recipe expects {list(shape)}")
    return out


def _lookup(cfg: Mapping[str, object], dotted: str) -> tuple[bool, object]:
    cur: object = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def _json_equal(a: object, b: object) -> bool:
    """Equality that keeps JSON types apart (True != 1, 1 == 1.0 only for numbers)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b
