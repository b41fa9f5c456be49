"""Schema validation of one recipe rule (docs/recipes.md Section 4 is the contract).

Contract: :func:`parse_rule` validates one element of ``rules`` against the schema of its kind
(``match``, ``copy``, ``derive``, ``skip``) and the closed tables (formats, encoder profiles,
conversions, copy paths, constraints), recording every problem with its line on the
:class:`~.parse_nodes.NodeReader`.  It returns the :class:`~.model.Rule` whenever the rule is
usable for matching, even when other keys had problems, so the planner can still claim its
tensors and report plan-time problems beside the load-time ones.  One function per concern
(kind and keys, names, format, copy path, encoder profile, conversions, constraints,
transforms, evidence); they run in that order, which is the order problems are reported in.
"""

from __future__ import annotations

from typing import Any, cast

from ..errors import FormatError
from ..formats import (
    ENCODER_PROFILES,
    Category,
    NumericFormat,
    check_profile_fits,
    lookup_format,
    lookup_profile,
)
from .model import Rule, RuleKind, TransformSpec
from .parse_nodes import NodeReader, optional_key, shape_value
from .patterns import NamePattern, NameTemplate, compile_pattern, compile_template
from .tables import CONSTRAINTS, CONVERSIONS, COPY_PATHS, FINITE_ONLY
from .yamlnodes import YNode

__all__ = ["parse_rule"]

_COMMON = {"format", "role", "evidence", "optional"}
_ENCODED = {
    "encoder_profile",
    "fallback_profile",
    "conversion",
    "keep_nonfinite",
    "constraints",
    "transforms",
}
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


def parse_rule(ctx: NodeReader, node: YNode, index: int, known_ids: set[str]) -> Rule | None:
    """Validate one rule; return it when it is usable for matching (even with other problems)."""
    head = _kind_and_keys(ctx, node, f"rule {index + 1}")
    if head is None:
        return None
    kind, where, m = head
    optional = bool(optional_key(m, "optional", lambda n: ctx.boolean(n, f"{where}: optional")))
    inputs: list[NameTemplate] = []
    if kind == "derive":
        pattern = None
        output, usable = _derive_names(ctx, m, where, inputs)
    else:
        pattern, output = _pattern(ctx, m[kind if kind != "copy" else "match"], where), None
        usable = pattern is not None
    if kind == "skip":
        reason = optional_key(m, "reason", lambda n: ctx.text(n, f"{where}: reason"))
        if not usable or pattern is None:
            return None
        return Rule(
            index, node.line, "skip", pattern, None, (), None, None, None, (), False, None,
            None, (), (), (), reason, optional,
        )  # fmt: skip

    concat_axis = _concat_axis(ctx, node, m, where) if kind == "derive" else None
    role = optional_key(m, "role", lambda n: ctx.text(n, f"{where}: role"))
    fmt_name, fmt = _format(ctx, m, where)
    copy = _copy_path(ctx, m, where, fmt) if kind == "copy" else None
    profile = _encoder_profile(ctx, m, where, fmt)
    fallback = _fallback_profile(ctx, m, where, fmt, profile)
    if fmt is not None and kind != "copy":
        _copy_only_format(ctx, m, where, fmt)
    conversions = _conversions(ctx, m, where, fmt)
    keep_nonfinite = _keep_nonfinite(ctx, m, where, conversions)
    constraints = _constraints(ctx, m, where, fmt, keep_nonfinite)
    transforms = _transforms(ctx, m["transforms"], where) if "transforms" in m else ()
    evidence = _evidence(ctx, node, m, where, known_ids, fmt, conversions)
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
        fallback_profile=fallback,
    )


def _kind_and_keys(
    ctx: NodeReader, node: YNode, where: str
) -> tuple[str, str, dict[str, YNode]] | None:
    """(kind, the rule's name in messages, its known keys) after the key checks; None when the
    rule is not a mapping with exactly one head key."""
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
    return kind, where, {k: v for k, v in m.items() if k in _RULE_KEYS[kind]}  # unknown: once


def _pattern(ctx: NodeReader, node: YNode, where: str) -> NamePattern | None:
    """The name pattern of a match, copy or skip rule."""
    text = ctx.text(node, f"{where}: pattern")
    if text is None:
        return None
    try:
        return compile_pattern(text)
    except ValueError as exc:
        ctx.err(node.line, f"{where}: {exc}")
        return None


def _derive_names(
    ctx: NodeReader, m: dict[str, YNode], where: str, inputs: list[NameTemplate]
) -> tuple[NameTemplate | None, bool]:
    """(the output template, usable) of a derive rule; fills ``inputs``.  Every input template
    must use the output's placeholders."""
    usable = _derive_inputs(ctx, m, where, inputs)
    output: NameTemplate | None = None
    try:
        out_text = ctx.text(m["derive"], f"{where}: output template")
        output = compile_template(out_text) if out_text is not None else None
    except ValueError as exc:
        ctx.err(m["derive"].line, f"{where}: {exc}")
    if output is None:
        return None, False
    for t in inputs:
        if t.variables != output.variables:
            ctx.err(
                m["inputs"].line,
                f"{where}: input template {t.text!r} uses placeholders "
                f"{sorted(t.variables)} but the output {output.text!r} uses "
                f"{sorted(output.variables)}; they must be the same",
            )
            usable = False
    return output, usable


def _derive_inputs(
    ctx: NodeReader, m: dict[str, YNode], where: str, inputs: list[NameTemplate]
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


def _concat_axis(ctx: NodeReader, node: YNode, m: dict[str, YNode], where: str) -> int | None:
    raw_inputs = m["inputs"].value if "inputs" in m else []
    n_inputs = len(raw_inputs) if isinstance(raw_inputs, list) else 0
    if "concat_axis" in m:
        axis = ctx.integer(m["concat_axis"], f"{where}: concat_axis", 0)
        if n_inputs == 1:
            ctx.err(m["concat_axis"].line, f"{where}: concat_axis needs two or more inputs")
        return axis
    if n_inputs > 1:
        ctx.err(node.line, f"{where}: {n_inputs} inputs need a concat_axis")
    return None


def _format(
    ctx: NodeReader, m: dict[str, YNode], where: str
) -> tuple[str | None, NumericFormat | None]:
    """(the format name as written, its registry entry: None when unknown)."""
    fmt_name = optional_key(m, "format", lambda n: ctx.text(n, f"{where}: format"))
    if fmt_name is None:
        return None, None
    try:
        return fmt_name, lookup_format(fmt_name)
    except FormatError as exc:
        ctx.err(m["format"].line, f"{where}: {exc.message} ({exc.hint})")
        return fmt_name, None


def _copy_path(
    ctx: NodeReader, m: dict[str, YNode], where: str, fmt: NumericFormat | None
) -> str | None:
    """The copy path of a copy rule: a name in the COPY_PATHS table that makes ``fmt``."""
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
    return copy


def _copy_only_format(ctx: NodeReader, m: dict[str, YNode], where: str, fmt: NumericFormat) -> None:
    """NVFP4 and FP8 row have no encoder: a rule other than a copy rule cannot make them."""
    if fmt.category in (Category.BLOCK_SCALED, Category.ROW_SCALED):
        paths = [c.name for c in COPY_PATHS.values() if c.format == fmt.name]
        ctx.err(
            m["format"].line,
            f"{where}: NInfer has no encoder into {fmt.name}; a recipe "
            "can only copy already-quantized words with copy: " + " or ".join(paths),
        )


def _encoder_profile(
    ctx: NodeReader, m: dict[str, YNode], where: str, fmt: NumericFormat | None
) -> str | None:
    """The encoder profile: required by a grouped format, refused by every other."""
    if "encoder_profile" not in m:
        if fmt is not None and fmt.is_grouped:
            ctx.err(
                m["format"].line,
                f"{where}: {fmt.name} needs an encoder_profile (e.g. MAXABS_F16_RECIP_RNE_V1)",
            )
        return None
    profile = ctx.text(m["encoder_profile"], f"{where}: encoder_profile")
    pline = m["encoder_profile"].line
    if profile is None:
        return None
    try:
        lookup_profile(profile)
    except FormatError as exc:
        ctx.err(pline, f"{where}: {exc.message} ({exc.hint})")
        return profile
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
    return profile


def _fallback_profile(
    ctx: NodeReader,
    m: dict[str, YNode],
    where: str,
    fmt: NumericFormat | None,
    profile: str | None,
) -> str | None:
    """``fallback_profile``: only beside an importance-weighted ``encoder_profile``; a known
    profile that needs no calibration data and can produce the format."""
    if "fallback_profile" not in m:
        return None
    name = ctx.text(m["fallback_profile"], f"{where}: fallback_profile")
    line = m["fallback_profile"].line
    if name is None:
        return None
    main = ENCODER_PROFILES.get(profile or "")
    if main is None or not main.importance:
        ctx.err(
            line,
            f"{where}: fallback_profile is only allowed with an importance-weighted "
            f"encoder_profile (MSE_F16_SEARCH_IW_V1 or GPTQ_F16_SEARCH_IW_V1), not {profile!r}",
        )
        return None
    try:
        fb = lookup_profile(name)
    except FormatError as exc:
        ctx.err(line, f"{where}: fallback_profile: {exc.message} ({exc.hint})")
        return None
    if fb.importance or fb.factor:
        ctx.err(
            line,
            f"{where}: fallback_profile {name} needs calibration data itself; name one that "
            "does not (MSE_F16_SEARCH_V1 or MAXABS_F16_RECIP_RNE_V1)",
        )
        return None
    if fmt is not None:
        try:
            check_profile_fits(name, fmt.name)
        except FormatError as exc:
            ctx.err(line, f"{where}: fallback_profile: {exc.message} ({exc.hint})")
            return None
    return name


def _conversions(
    ctx: NodeReader, m: dict[str, YNode], where: str, fmt: NumericFormat | None
) -> tuple[str, ...]:
    """The named conversions: known, into ``fmt`` (a direct format), one per source dtype."""
    if "conversion" not in m:
        return ()
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
    return conversions


def _keep_nonfinite(
    ctx: NodeReader, m: dict[str, YNode], where: str, conversions: tuple[str, ...]
) -> bool:
    keep = bool(
        optional_key(m, "keep_nonfinite", lambda n: ctx.boolean(n, f"{where}: keep_nonfinite"))
    )
    if keep and not any(c in CONVERSIONS and CONVERSIONS[c].rounds_to_bf16 for c in conversions):
        ctx.err(
            m["keep_nonfinite"].line,
            f"{where}: keep_nonfinite applies only with a "
            "rounding conversion (f32-to-bf16-rne, f16-to-bf16-rne)",
        )
    return keep


def _constraints(
    ctx: NodeReader,
    m: dict[str, YNode],
    where: str,
    fmt: NumericFormat | None,
    keep_nonfinite: bool,
) -> tuple[str, ...]:
    if "constraints" not in m:
        return ()
    constraints = ctx.text_list(m["constraints"], f"{where}: constraints", single_ok=False) or ()
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
    return constraints


def _transforms(ctx: NodeReader, node: YNode, where: str) -> tuple[TransformSpec, ...]:
    if not isinstance(node.value, list) or not node.value:
        ctx.err(node.line, f"{where}: transforms must be a non-empty list")
        return ()
    out: list[TransformSpec] = []
    for item in node.value:
        if item.value == "transpose":
            out.append(TransformSpec("transpose", None, item.line))
        elif isinstance(item.value, dict) and set(item.value) == {"reshape"}:
            shape = shape_value(
                ctx, item.value["reshape"], f"{where}: reshape", allow_minus_one=True
            )
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


def _evidence(
    ctx: NodeReader,
    node: YNode,
    m: dict[str, YNode],
    where: str,
    known_ids: set[str],
    fmt: NumericFormat | None,
    conversions: tuple[str, ...],
) -> tuple[str, ...]:
    """The cited evidence ids: each defined in the recipe, and present for a lossy choice."""
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
    return evidence
