"""Loading and schema validation of recipe files (docs/recipes.md is the contract).

Contract: :func:`load_recipe` reads a YAML recipe, validates it against the schema and the
closed registries (formats, encoder profiles, conversions, copy paths, constraints) and either
returns a frozen :class:`~.model.Recipe` or raises one :class:`~.model.RecipeProblems` listing
*every* problem found, each with its line.  Unknown keys, duplicate keys, wrong types and
unknown names are all problems; names are never parsed apart.

:func:`parse_recipe` is the non-raising form: it returns the recipe built from every
structurally usable rule (``None`` when the document itself is unusable) plus the problems, so
that :func:`~.plan.build_plan` can report load-time and plan-time problems together.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from ..errors import FormatError, RecipeError
from ..formats import Category, check_profile_fits, lookup_format, lookup_profile
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
from .patterns import NamePattern, NameTemplate, compile_pattern, compile_template
from .tables import CONSTRAINTS, CONVERSIONS, COPY_PATHS, FINITE_ONLY
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

_COMMON = {"format", "role", "evidence", "optional"}
_ENCODED = {"encoder_profile", "conversion", "keep_nonfinite", "constraints", "transforms"}
_RULE_KEYS: dict[str, set[str]] = {
    "match": {"match"} | _COMMON | _ENCODED,
    "copy": {"match", "copy"} | _COMMON,
    "derive": {"derive", "inputs", "concat_axis"} | _COMMON | _ENCODED,
    "skip": {"skip", "reason", "optional"},
}
_RULE_REQUIRED: dict[str, set[str]] = {
    "match": {"match", "format", "role"},
    "copy": {"match", "copy", "format", "role"},
    "derive": {"derive", "inputs", "format", "role"},
    "skip": {"skip", "reason"},
}

T = TypeVar("T")


class _Ctx:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def err(self, line: int | None, message: str) -> None:
        self.problems.append(Problem(line, message))

    def keys(self, node: YNode, where: str, required: set[str], allowed: set[str]) -> bool:
        """Report missing and unknown keys of a mapping node; True when it is a mapping."""
        if not isinstance(node.value, dict):
            self.err(node.line, f"{where} must be a mapping, not a {node.kind}")
            return False
        for key in sorted(set(node.value) - allowed):
            self.err(
                node.value[key].line,
                f"{where}: unknown key {key!r} (allowed: " + ", ".join(sorted(allowed)) + ")",
            )
        for key in sorted(required - set(node.value)):
            self.err(node.line, f"{where}: missing required key {key!r}")
        return True

    def text(self, node: YNode, where: str) -> str | None:
        if not isinstance(node.value, str) or not node.value.strip():
            self.err(node.line, f"{where} must be a non-empty string, not {node.value!r}")
            return None
        return node.value

    def integer(self, node: YNode, where: str, minimum: int | None = None) -> int | None:
        v = node.value
        if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and v < minimum):
            bound = f" >= {minimum}" if minimum is not None else ""
            self.err(node.line, f"{where} must be an integer{bound}, not {v!r}")
            return None
        return v

    def boolean(self, node: YNode, where: str) -> bool | None:
        if not isinstance(node.value, bool):
            self.err(node.line, f"{where} must be true or false, not {node.value!r}")
            return None
        return node.value

    def text_list(self, node: YNode, where: str, *, single_ok: bool) -> tuple[str, ...] | None:
        if single_ok and isinstance(node.value, str):
            items = [node]
        elif isinstance(node.value, list) and node.value:
            items = node.value
        else:
            shape = (
                "a string or a non-empty list of strings"
                if single_ok
                else "a non-empty list of strings"
            )
            self.err(node.line, f"{where} must be {shape}")
            return None
        out: list[str] = []
        for item in items:
            t = self.text(item, f"{where} entry")
            if t is None:
                return None
            out.append(t)
        return tuple(out)

    def json_value(self, node: YNode, where: str) -> object:
        if isinstance(node.value, dict):
            return {k: self.json_value(v, where) for k, v in node.value.items()}
        if isinstance(node.value, list):
            return [self.json_value(v, where) for v in node.value]
        return node.value


def _opt(node: dict[str, YNode], key: str, fn: Callable[[YNode], T | None]) -> T | None:
    return fn(node[key]) if key in node else None


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
    ctx = _Ctx()
    try:
        root, yaml_problems = load_nodes(text)
    except YamlProblem as exc:
        return None, [Problem(exc.line, exc.message)]
    for yp in yaml_problems:
        ctx.err(yp.line, yp.message)
    if not ctx.keys(root, "the recipe", _TOP_REQUIRED, _TOP_REQUIRED | _TOP_OPTIONAL):
        return None, ctx.problems
    top: dict[str, YNode] = root.value

    schema = _opt(top, "ninfer_recipe", lambda n: ctx.integer(n, "ninfer_recipe"))
    if schema is not None and schema != SCHEMA_VERSION:
        ctx.err(
            top["ninfer_recipe"].line,
            f"ninfer_recipe: {schema} is not a recipe-language version this tool knows "
            f"(it knows {SCHEMA_VERSION})",
        )
    name = _opt(top, "name", lambda n: ctx.text(n, "name"))
    version: str | None = None
    if "version" in top:
        v = top["version"].value
        if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip():
            version = str(v)
        else:
            ctx.err(top["version"].line, f"version must be a string, not {v!r}")
    description = _opt(top, "description", lambda n: ctx.text(n, "description"))
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
                rule = _parse_rule(ctx, rnode, index, known_ids)
                if rule is not None:
                    rules.append(rule)

    if name is None or version is None or identity is None:
        return None, ctx.problems
    digest = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()
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


def _parse_source(ctx: _Ctx, node: YNode) -> SourceIdentity | None:
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
        _opt(m, "model_type", lambda n: ctx.text_list(n, "source.model_type", single_ok=True)) or ()
    )
    archs = (
        _opt(m, "architectures", lambda n: ctx.text_list(n, "source.architectures", single_ok=True))
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
    count = _opt(m, "tensor_count", lambda n: ctx.integer(n, "source.tensor_count", 0))
    shapes: list[tuple[str, tuple[int, ...], int]] = []
    if "shapes" in m:
        snode = m["shapes"]
        if not isinstance(snode.value, dict) or not snode.value:
            ctx.err(snode.line, "source.shapes must be a non-empty mapping of tensor name to shape")
        else:
            for tname, vnode in snode.value.items():
                shape = _shape(ctx, vnode, f"source.shapes[{tname!r}]", allow_minus_one=False)
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


def _parse_output(ctx: _Ctx, node: YNode) -> OutputOptions:
    if not ctx.keys(node, "output", set(), _OUTPUT_KEYS):
        return OutputOptions(line=node.line)
    m: dict[str, YNode] = node.value
    readme = _opt(m, "readme", lambda n: ctx.boolean(n, "output.readme"))
    return OutputOptions(readme=True if readme is None else readme, line=node.line)


def _shape(ctx: _Ctx, node: YNode, where: str, *, allow_minus_one: bool) -> tuple[int, ...] | None:
    v = node.value
    ok = isinstance(v, list) and all(
        isinstance(d.value, int)
        and not isinstance(d.value, bool)
        and (d.value >= 0 or (allow_minus_one and d.value == -1))
        for d in v
    )
    if not ok:
        what = "non-negative integers or -1" if allow_minus_one else "non-negative integers"
        ctx.err(node.line, f"{where} must be a list of {what}")
        return None
    return tuple(int(d.value) for d in v)


def _parse_evidence(ctx: _Ctx, node: YNode) -> tuple[Evidence, ...]:
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
        ident = _opt(m, "id", lambda n: ctx.text(n, "evidence id"))
        citation = _opt(m, "citation", lambda n: ctx.text(n, "evidence citation"))
        summary = _opt(m, "summary", lambda n: ctx.text(n, "evidence summary"))
        url = _opt(m, "url", lambda n: ctx.text(n, "evidence url"))
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


def _parse_rule(ctx: _Ctx, node: YNode, index: int, known_ids: set[str]) -> Rule | None:
    """Validate one rule; return it when it is usable for matching (even with other problems)."""
    where = f"rule {index + 1}"
    if not isinstance(node.value, dict):
        ctx.err(node.line, f"{where} must be a mapping, not a {node.kind}")
        return None
    m: dict[str, YNode] = node.value
    heads = [k for k in ("match", "derive", "skip") if k in m]
    if len(heads) != 1:
        ctx.err(
            node.line,
            f"{where} must have exactly one of 'match', 'derive' or 'skip' (has "
            + (", ".join(heads) or "none")
            + ")",
        )
        return None
    kind: str = "copy" if heads[0] == "match" and "copy" in m else heads[0]
    where = f"{where} ({kind})"
    ctx.keys(node, where, _RULE_REQUIRED[kind], _RULE_KEYS[kind])
    m = {k: v for k, v in m.items() if k in _RULE_KEYS[kind]}  # unknown keys: reported once
    optional = bool(_opt(m, "optional", lambda n: ctx.boolean(n, f"{where}: optional")))

    pattern: NamePattern | None = None
    output: NameTemplate | None = None
    inputs: list[NameTemplate] = []
    usable = True
    if kind in ("match", "copy", "skip"):
        text = ctx.text(m[kind if kind != "copy" else "match"], f"{where}: pattern")
        if text is None:
            usable = False
        else:
            try:
                pattern = compile_pattern(text)
            except ValueError as exc:
                ctx.err(m[kind if kind != "copy" else "match"].line, f"{where}: {exc}")
                usable = False
    else:
        usable = _parse_derive_names(ctx, m, where, inputs) and usable
        try:
            out_text = ctx.text(m["derive"], f"{where}: output template")
            output = compile_template(out_text) if out_text is not None else None
        except ValueError as exc:
            ctx.err(m["derive"].line, f"{where}: {exc}")
        if output is None:
            usable = False
        elif inputs:
            for t in inputs:
                if t.variables != output.variables:
                    ctx.err(
                        m["inputs"].line,
                        f"{where}: input template {t.text!r} uses placeholders "
                        f"{sorted(t.variables)} but the output {output.text!r} uses "
                        f"{sorted(output.variables)}; they must be the same",
                    )
                    usable = False

    if kind == "skip":
        reason = _opt(m, "reason", lambda n: ctx.text(n, f"{where}: reason"))
        if not usable or pattern is None:
            return None
        return Rule(
            index,
            node.line,
            "skip",
            pattern,
            None,
            (),
            None,
            None,
            None,
            (),
            False,
            None,
            None,
            (),
            (),
            (),
            reason,
            optional,
        )

    concat_axis: int | None = None
    if kind == "derive":
        raw_inputs = m["inputs"].value if "inputs" in m else []
        n_inputs = len(raw_inputs) if isinstance(raw_inputs, list) else 0
        if "concat_axis" in m:
            concat_axis = ctx.integer(m["concat_axis"], f"{where}: concat_axis", 0)
            if n_inputs == 1:
                ctx.err(m["concat_axis"].line, f"{where}: concat_axis needs two or more inputs")
        elif n_inputs > 1:
            ctx.err(node.line, f"{where}: {n_inputs} inputs need a concat_axis")

    role = _opt(m, "role", lambda n: ctx.text(n, f"{where}: role"))
    fmt_name = _opt(m, "format", lambda n: ctx.text(n, f"{where}: format"))
    fmt = None
    if fmt_name is not None:
        try:
            fmt = lookup_format(fmt_name)
        except FormatError as exc:
            ctx.err(m["format"].line, f"{where}: {exc.message} ({exc.hint})")

    copy: str | None = None
    if kind == "copy":
        copy = ctx.text(m["copy"], f"{where}: copy")
        if copy is not None and copy not in COPY_PATHS:
            ctx.err(
                m["copy"].line,
                f"{where}: unknown copy path {copy!r} (known: " + ", ".join(COPY_PATHS) + ")",
            )
        elif copy is not None and fmt is not None and COPY_PATHS[copy].format != fmt.name:
            ctx.err(
                m["format"].line,
                f"{where}: copy path {copy} produces {COPY_PATHS[copy].format}, not {fmt.name}",
            )

    profile: str | None = None
    if "encoder_profile" in m:
        profile = ctx.text(m["encoder_profile"], f"{where}: encoder_profile")
        pline = m["encoder_profile"].line
        if profile is not None:
            try:
                lookup_profile(profile)
            except FormatError as exc:
                ctx.err(pline, f"{where}: {exc.message} ({exc.hint})")
            else:
                if fmt is not None and not fmt.is_grouped:
                    ctx.err(
                        pline,
                        f"{where}: {fmt.name} takes no encoder_profile (only the "
                        "grouped formats are encoded; direct formats store words, NVFP4 "
                        "and FP8 row are copied)",
                    )
                elif fmt is not None:
                    try:
                        check_profile_fits(profile, fmt.name)
                    except FormatError as exc:
                        ctx.err(pline, f"{where}: {exc.message} ({exc.hint})")
    elif fmt is not None and fmt.is_grouped:
        ctx.err(
            m["format"].line,
            f"{where}: {fmt.name} needs an encoder_profile (e.g. MAXABS_F16_RECIP_RNE_V1)",
        )
    if (
        fmt is not None
        and kind != "copy"
        and fmt.category in (Category.BLOCK_SCALED, Category.ROW_SCALED)
    ):
        paths = [c.name for c in COPY_PATHS.values() if c.format == fmt.name]
        ctx.err(
            m["format"].line,
            f"{where}: NInfer has no encoder into {fmt.name}; a recipe "
            "can only copy already-quantized words with copy: " + " or ".join(paths),
        )

    conversions: tuple[str, ...] = ()
    if "conversion" in m:
        conversions = ctx.text_list(m["conversion"], f"{where}: conversion", single_ok=True) or ()
        cline = m["conversion"].line
        seen: dict[str, str] = {}
        for name in conversions:
            conv = CONVERSIONS.get(name)
            if conv is None:
                ctx.err(
                    cline,
                    f"{where}: unknown conversion {name!r} (known: " + ", ".join(CONVERSIONS) + ")",
                )
                continue
            if fmt is not None and not fmt.is_direct:
                ctx.err(
                    cline,
                    f"{where}: {fmt.name} takes no conversion (conversions apply to "
                    "direct formats; grouped encoders widen BF16/F16/F32 exactly)",
                )
                break
            if fmt is not None and conv.target != fmt.name:
                ctx.err(cline, f"{where}: conversion {name} produces {conv.target}, not {fmt.name}")
            for dt in sorted(conv.sources):
                if dt in seen:
                    ctx.err(cline, f"{where}: conversions {seen[dt]} and {name} both take {dt}")
                seen[dt] = name
    keep_nonfinite = bool(
        _opt(m, "keep_nonfinite", lambda n: ctx.boolean(n, f"{where}: keep_nonfinite"))
    )
    if keep_nonfinite and not any(
        c in CONVERSIONS and CONVERSIONS[c].rounds_to_bf16 for c in conversions
    ):
        ctx.err(
            m["keep_nonfinite"].line,
            f"{where}: keep_nonfinite applies only with a "
            "rounding conversion (f32-to-bf16-rne, f16-to-bf16-rne)",
        )

    constraints: tuple[str, ...] = ()
    if "constraints" in m:
        constraints = (
            ctx.text_list(m["constraints"], f"{where}: constraints", single_ok=False) or ()
        )
        kline = m["constraints"].line
        for c in constraints:
            if c not in CONSTRAINTS:
                ctx.err(
                    kline,
                    f"{where}: unknown constraint {c!r} (known: " + ", ".join(CONSTRAINTS) + ")",
                )
            elif c == FINITE_ONLY and fmt is not None and fmt.name == "I32":
                ctx.err(
                    kline,
                    f"{where}: {FINITE_ONLY} does not apply to I32 (integers are always finite)",
                )
        if len(set(constraints)) != len(constraints):
            ctx.err(kline, f"{where}: a constraint is listed twice")
        if FINITE_ONLY in constraints and keep_nonfinite:
            ctx.err(kline, f"{where}: {FINITE_ONLY} contradicts keep_nonfinite: true")

    transforms = _parse_transforms(ctx, m["transforms"], where) if "transforms" in m else ()

    evidence: tuple[str, ...] = ()
    if "evidence" in m:
        evidence = ctx.text_list(m["evidence"], f"{where}: evidence", single_ok=True) or ()
        for ident in evidence:
            if ident not in known_ids:
                ctx.err(
                    m["evidence"].line,
                    f"{where}: evidence {ident!r} is not defined in the recipe's evidence list",
                )
    lossy = (fmt is not None and fmt.is_grouped) or any(
        c in CONVERSIONS and CONVERSIONS[c].lossy for c in conversions
    )
    if lossy and not evidence:
        choice = (
            "a grouped format" if fmt is not None and fmt.is_grouped else "a rounding conversion"
        )
        ctx.err(
            node.line,
            f"{where}: a lossy choice ({choice}) needs cited evidence: evidence: [id, ...]",
        )

    if not usable:
        return None
    return Rule(
        index=index,
        line=node.line,
        kind=cast(RuleKind, kind),
        pattern=pattern,
        output=output,
        inputs=tuple(inputs),
        concat_axis=concat_axis,
        format=fmt_name,
        encoder_profile=profile,
        conversions=conversions,
        keep_nonfinite=keep_nonfinite,
        copy=copy,
        role=role,
        constraints=constraints,
        transforms=transforms,
        evidence=evidence,
        reason=None,
        optional=optional,
    )


def _parse_derive_names(
    ctx: _Ctx, m: dict[str, YNode], where: str, inputs: list[NameTemplate]
) -> bool:
    if "inputs" not in m:
        return False
    node = m["inputs"]
    if not isinstance(node.value, list) or not node.value:
        ctx.err(node.line, f"{where}: inputs must be a non-empty list of name templates")
        return False
    ok = True
    seen: set[str] = set()
    for item in node.value:
        text = ctx.text(item, f"{where}: input template")
        if text is None:
            ok = False
            continue
        if text in seen:
            ctx.err(item.line, f"{where}: input {text!r} is listed twice")
            ok = False
            continue
        seen.add(text)
        try:
            inputs.append(compile_template(text))
        except ValueError as exc:
            ctx.err(item.line, f"{where}: {exc}")
            ok = False
    return ok


def _parse_transforms(ctx: _Ctx, node: YNode, where: str) -> tuple[TransformSpec, ...]:
    if not isinstance(node.value, list) or not node.value:
        ctx.err(node.line, f"{where}: transforms must be a non-empty list")
        return ()
    out: list[TransformSpec] = []
    for item in node.value:
        if item.value == "transpose":
            out.append(TransformSpec("transpose", None, item.line))
        elif isinstance(item.value, dict) and set(item.value) == {"reshape"}:
            shape = _shape(ctx, item.value["reshape"], f"{where}: reshape", allow_minus_one=True)
            if shape is None:
                continue
            if len(shape) != 2:
                ctx.err(
                    item.line,
                    f"{where}: reshape must give rank two [rows, cols], not {list(shape)}",
                )
            elif list(shape).count(-1) > 1:
                ctx.err(item.line, f"{where}: reshape may infer at most one dimension (-1)")
            else:
                out.append(TransformSpec("reshape", shape, item.line))
        else:
            ctx.err(
                item.line,
                f"{where}: unknown transform {_brief(item)} (known: transpose, "
                "{reshape: [rows, cols]})",
            )
    return tuple(out)


def _brief(node: YNode) -> str:
    v: Any = node.value
    if isinstance(v, dict):
        return "{" + ", ".join(v) + "}"
    return repr(v)
