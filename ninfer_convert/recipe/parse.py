"""Loading and schema validation of recipe files (docs/recipes.md is the contract).

Contract: :func:`load_recipe` reads a YAML recipe, validates it against the schema and the
closed registries (formats, encoder profiles, conversions, copy paths, constraints) and either
returns a frozen :class:`~.model.Recipe` or raises one :class:`~.model.RecipeProblems` listing
*every* problem found, each with its line.  Unknown keys, duplicate keys, wrong types and
unknown names are all problems; names are never parsed apart.  Each rule is validated by
:func:`.parse_rule.parse_rule`; :mod:`.parse_nodes` holds the problem-collecting node reader.

:func:`parse_recipe` is the non-raising form: it returns the recipe built from every
structurally usable rule (``None`` when the document itself is unusable) plus the problems, so
that :func:`~.plan.build_plan` can report load-time and plan-time problems together.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..container.wire import recipe_digest
from ..errors import RecipeError
from .model import (
    Evidence,
    OutputOptions,
    Problem,
    Recipe,
    RecipeProblems,
    Rule,
    SourceIdentity,
)
from .parse_nodes import NodeReader, optional_key, shape_value
from .parse_rule import parse_rule
from .yamlnodes import YamlProblem, YNode, load_nodes

__all__ = ["SCHEMA_VERSION", "load_recipe", "loads_recipe", "parse_recipe"]

SCHEMA_VERSION = 1
"""The value of the required top-level ``ninfer_recipe`` key this loader understands."""

_TOP_REQUIRED = {"ninfer_recipe", "name", "version", "source", "rules"}
_TOP_OPTIONAL = {"description", "evidence", "output"}
_OUTPUT_KEYS = {"readme"}
_SOURCE_KEYS = {"model_type", "architectures", "config", "config_absent", "tensor_count", "shapes"}
_EVIDENCE_REQUIRED = {"id", "citation", "summary"}
_EVIDENCE_OPTIONAL = {"url"}
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

# ---------------------------------------------------------------------------------------------
# public entry points


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Load and validate a recipe file; raise :class:`RecipeProblems` listing every problem."""
    recipe, problems = parse_recipe_file(path)
    if problems or recipe is None:
        raise RecipeProblems(problems, path=os.fspath(path), stage="in the recipe")
    return recipe


def loads_recipe(text: str, *, path: str | None = None) -> Recipe:
    """Like :func:`load_recipe` for text already in memory."""
    recipe, problems = parse_recipe(text, path=path)
    if problems or recipe is None:
        raise RecipeProblems(problems, path=path, stage="in the recipe")
    return recipe


def parse_recipe_file(path: str | os.PathLike[str]) -> tuple[Recipe | None, list[Problem]]:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise RecipeError(f"cannot read the recipe: {exc.strerror or exc}", path=str(p)) from exc
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"the recipe is not UTF-8 ({exc.reason} at byte {exc.start})", path=str(p)
        ) from exc
    return parse_recipe(text, path=str(p))


def parse_recipe(text: str, *, path: str | None = None) -> tuple[Recipe | None, list[Problem]]:
    """Validate ``text``; return the recipe of every usable part and all problems found."""
    ctx = NodeReader()
    try:
        root, yaml_problems = load_nodes(text)
    except YamlProblem as exc:
        return None, [Problem(exc.line, exc.message)]
    for yp in yaml_problems:
        ctx.err(yp.line, yp.message)
    if not ctx.keys(root, "the recipe", _TOP_REQUIRED, _TOP_REQUIRED | _TOP_OPTIONAL):
        return None, ctx.problems
    top: dict[str, YNode] = root.value

    schema = optional_key(top, "ninfer_recipe", lambda n: ctx.integer(n, "ninfer_recipe"))
    if schema is not None and schema != SCHEMA_VERSION:
        ctx.err(
            top["ninfer_recipe"].line,
            f"ninfer_recipe: {schema} is not a recipe-language version this tool knows "
            f"(it knows {SCHEMA_VERSION})",
        )
    name = optional_key(top, "name", lambda n: ctx.text(n, "name"))
    version: str | None = None
    if "version" in top:
        v = top["version"].value
        if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip():
            version = str(v)
        else:
            ctx.err(top["version"].line, f"version must be a string, not {v!r}")
    description = optional_key(top, "description", lambda n: ctx.text(n, "description"))
    identity = _parse_source(ctx, top["source"]) if "source" in top else None
    evidence = _parse_evidence(ctx, top["evidence"]) if "evidence" in top else ()
    known_ids = {e.id for e in evidence}
    output = _parse_output(ctx, top["output"]) if "output" in top else OutputOptions()

    rules: list[Rule] = []
    if "rules" in top:
        node = top["rules"]
        if not isinstance(node.value, list) or not node.value:
            ctx.err(node.line, "rules must be a non-empty list")
        else:
            for index, rnode in enumerate(node.value):
                rule = parse_rule(ctx, rnode, index, known_ids)
                if rule is not None:
                    rules.append(rule)

    if name is None or version is None or identity is None:
        return None, ctx.problems
    digest = recipe_digest(text)
    recipe = Recipe(
        path=path,
        text=text,
        digest=digest,
        schema=schema if schema is not None else SCHEMA_VERSION,
        name=name,
        version=version,
        description=description,
        source=identity,
        evidence=evidence,
        rules=tuple(rules),
        output=output,
    )
    return recipe, ctx.problems


# ---------------------------------------------------------------------------------------------
# sections


def _parse_source(ctx: NodeReader, node: YNode) -> SourceIdentity | None:
    if not ctx.keys(node, "source", set(), _SOURCE_KEYS):
        return None
    m: dict[str, YNode] = node.value
    if not set(m) & _SOURCE_KEYS:
        ctx.err(
            node.line,
            "source must name at least one identity check ("
            + ", ".join(sorted(_SOURCE_KEYS))
            + ")",
        )
    model_type = (
        optional_key(
            m, "model_type", lambda n: ctx.text_list(n, "source.model_type", single_ok=True)
        )
        or ()
    )
    archs = (
        optional_key(
            m, "architectures", lambda n: ctx.text_list(n, "source.architectures", single_ok=True)
        )
        or ()
    )
    config: list[tuple[str, object, int]] = []
    if "config" in m:
        cnode = m["config"]
        if not isinstance(cnode.value, dict) or not cnode.value:
            ctx.err(
                cnode.line,
                "source.config must be a non-empty mapping of config.json keys "
                "(dotted for nested keys) to expected values",
            )
        else:
            for key, vnode in cnode.value.items():
                if not all(key.split(".")):
                    ctx.err(vnode.line, f"source.config: {key!r} is not a dotted key")
                    continue
                config.append((key, ctx.json_value(vnode, "source.config"), vnode.line))
    absent: list[tuple[str, int]] = []
    if "config_absent" in m:
        anode = m["config_absent"]
        for key in ctx.text_list(anode, "source.config_absent", single_ok=True) or ():
            if not all(key.split(".")):
                ctx.err(anode.line, f"source.config_absent: {key!r} is not a dotted key")
            elif any(key == k for k, _, _ in config):
                ctx.err(anode.line, f"source.config_absent: {key!r} is also under source.config")
            else:
                absent.append((key, anode.line))
    count = optional_key(m, "tensor_count", lambda n: ctx.integer(n, "source.tensor_count", 0))
    shapes: list[tuple[str, tuple[int, ...], int]] = []
    if "shapes" in m:
        snode = m["shapes"]
        if not isinstance(snode.value, dict) or not snode.value:
            ctx.err(snode.line, "source.shapes must be a non-empty mapping of tensor name to shape")
        else:
            for tname, vnode in snode.value.items():
                shape = shape_value(ctx, vnode, f"source.shapes[{tname!r}]", allow_minus_one=False)
                if shape is not None:
                    shapes.append((tname, shape, vnode.line))
    return SourceIdentity(
        tuple(model_type),
        tuple(archs),
        tuple(config),
        count,
        tuple(shapes),
        node.line,
        tuple((k, v.line) for k, v in m.items()),
        tuple(absent),
    )


def _parse_output(ctx: NodeReader, node: YNode) -> OutputOptions:
    if not ctx.keys(node, "output", set(), _OUTPUT_KEYS):
        return OutputOptions(line=node.line)
    m: dict[str, YNode] = node.value
    readme = optional_key(m, "readme", lambda n: ctx.boolean(n, "output.readme"))
    return OutputOptions(readme=True if readme is None else readme, line=node.line)


def _parse_evidence(ctx: NodeReader, node: YNode) -> tuple[Evidence, ...]:
    if not isinstance(node.value, list):
        ctx.err(node.line, "evidence must be a list of entries")
        return ()
    out: list[Evidence] = []
    seen: dict[str, int] = {}
    for item in node.value:
        if not ctx.keys(
            item, "evidence entry", _EVIDENCE_REQUIRED, _EVIDENCE_REQUIRED | _EVIDENCE_OPTIONAL
        ):
            continue
        m: dict[str, YNode] = item.value
        ident = optional_key(m, "id", lambda n: ctx.text(n, "evidence id"))
        citation = optional_key(m, "citation", lambda n: ctx.text(n, "evidence citation"))
        summary = optional_key(m, "summary", lambda n: ctx.text(n, "evidence summary"))
        url = optional_key(m, "url", lambda n: ctx.text(n, "evidence url"))
        if ident is not None and not _ID.fullmatch(ident):
            ctx.err(m["id"].line, f"evidence id {ident!r} must match {_ID.pattern}")
            continue
        if ident is not None and ident in seen:
            ctx.err(
                m["id"].line,
                f"evidence id {ident!r} is defined twice (first at line {seen[ident]})",
            )
            continue
        if ident is None or citation is None or summary is None:
            continue
        seen[ident] = item.line
        out.append(Evidence(ident, citation, summary, url, item.line))
    return tuple(out)
