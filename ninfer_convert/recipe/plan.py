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

import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import NinferError
from ..formats import FORMATS, NumericFormat
from ..names import tensor_name_problem
from ..source import SourceCheckpoint, SourceTensorInfo
from .copy_paths import COPY_PATHS
from .cost import padding_warnings
from .entries import PlanEntry, PlanSource, RuleRef, SkippedTensor, TransformStep
from .model import Problem, Recipe, RecipeProblems, Rule, SourceField
from .parse import parse_recipe_file
from .tables import CONVERSIONS, DIRECT_SAME_SOURCE, GROUPED_SOURCES

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

_MAX_UNCLAIMED_SHOWN = 50


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
            "totals": {
                "per_format": [t.to_dict() for t in self.totals],
                "tensors": len(self.entries),
                "weights": self.total_weights,
                "encoded_bytes": self.total_encoded_bytes,
                "source_bytes": self.total_source_bytes,
                "bits_per_weight": self.bits_per_weight,
            },
            "evidence": [e.to_dict() for e in r.evidence],
            "warnings": [w.to_dict() for w in padding_warnings(self.entries)],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# planning


@dataclass
class _Candidate:
    rule: Rule
    output: str
    sources: list[tuple[SourceTensorInfo, SourceField]]


class _Planner:
    def __init__(self, recipe: Recipe, source: SourceCheckpoint) -> None:
        self.recipe = recipe
        self.source = source
        self.names = list(source.tensors)  # sorted by name
        self.problems: list[Problem] = []
        self.claimed: dict[str, Rule] = {}
        self.candidates: list[_Candidate] = []
        self.skipped: list[SkippedTensor] = []

    def err(self, rule: Rule | None, message: str, line: int | None = None) -> None:
        where = rule.describe() + ": " if rule is not None else ""
        self.problems.append(
            Problem(line if line is not None else (rule.line if rule else None), where + message)
        )

    # -- identity ------------------------------------------------------------------------------

    def identity(self) -> list[Problem]:
        ident = self.recipe.source
        cfg = self.source.config
        out: list[Problem] = []

        def bad(line: int, msg: str) -> None:
            out.append(Problem(line, "source identity: " + msg))

        keys = ("model_type", "architectures", "config", "config_absent")
        needs_config = any(getattr(ident, k) for k in keys)
        if needs_config and cfg is None:
            first = next(k for k in keys if getattr(ident, k))
            bad(
                ident.line_of(first),
                f"the recipe checks config.json but the source ({self.source.kind}) has none",
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
        if ident.tensor_count is not None and ident.tensor_count != len(self.names):
            bad(
                ident.line_of("tensor_count"),
                f"the source has {len(self.names)} tensors, the recipe expects "
                f"{ident.tensor_count}",
            )
        for name, shape, line in ident.shapes:
            info = self.source.tensors.get(name)
            if info is None:
                bad(line, f"the source has no tensor {name!r}")
            elif info.shape != shape:
                bad(
                    line, f"{name!r} has shape {list(info.shape)}, the recipe expects {list(shape)}"
                )
        return out

    # -- claiming ------------------------------------------------------------------------------

    def claim_all(self) -> None:
        for rule in self.recipe.rules:
            if rule.kind in ("match", "skip"):
                self._claim_matching(rule)
            elif rule.kind == "copy":
                self._claim_copy(rule)
            else:
                self._claim_derive(rule)

    def unclaimed(self) -> None:
        unclaimed = [n for n in self.names if n not in self.claimed]
        if unclaimed:
            shown = unclaimed[:_MAX_UNCLAIMED_SHOWN]
            more = len(unclaimed) - len(shown)
            self.problems.append(
                Problem(
                    None,
                    f"{len(unclaimed)} source tensor"
                    f"{'s are' if len(unclaimed) != 1 else ' is'} claimed by no "
                    "rule or skip: " + ", ".join(shown) + (f" ... and {more} more" if more else ""),
                )
            )

    def _nothing(self, rule: Rule, shadowed: list[str], hint: str = "") -> None:
        if rule.optional:
            return
        if shadowed:
            lines = sorted({self.claimed[n].line for n in shadowed})
            self.err(
                rule,
                f"claims nothing: every tensor it matches ({len(shadowed)}, e.g. "
                f"{shadowed[0]!r}) is already claimed by the rule(s) at line(s) "
                + ", ".join(map(str, lines))
                + "; reorder the rules or mark it "
                "optional: true",
            )
        else:
            self.err(
                rule,
                "matches no source tensor"
                + (f" ({hint})" if hint else "")
                + "; fix the pattern or mark the rule optional: true",
            )

    def _claim_matching(self, rule: Rule) -> None:
        assert rule.pattern is not None  # parse guarantees it for match/skip rules
        hits = [n for n in self.names if rule.pattern.matches(n)]
        free = [n for n in hits if n not in self.claimed]
        if not free:
            self._nothing(rule, hits)
            return
        for n in free:
            self.claimed[n] = rule
            info = self.source.tensors[n]
            if rule.kind == "skip":
                self.skipped.append(
                    SkippedTensor(
                        n, info.dtype, info.shape, info.file, RuleRef.of(rule), rule.reason or ""
                    )
                )
            else:
                self.candidates.append(_Candidate(rule, n, [(info, "input")]))

    def _claim_copy(self, rule: Rule) -> None:
        assert rule.pattern is not None and rule.copy is not None
        tensors = self.source.tensors
        units = COPY_PATHS[rule.copy].units(self.names, tensors)
        matched = [u for u in units if rule.pattern.matches(u.output)]
        free = [u for u in matched if u.primary not in self.claimed]
        if not free:
            if matched:
                self._nothing(rule, [u.primary for u in matched])
            else:
                direct = sum(1 for n in self.names if rule.pattern.matches(n))
                hint = (
                    f"the pattern matches output names such as X.weight built from "
                    f"{rule.copy} tensors; it matches {direct} source tensor names but no "
                    "complete set of them"
                )
                self._nothing(rule, [], hint)
            return
        for unit in free:
            out, parts = unit.output, unit.parts
            ok = True
            for name, _f in parts:
                if name not in tensors:
                    self.err(
                        rule, f"{out!r}: the {rule.copy} tensor {name!r} is missing from the source"
                    )
                    ok = False
                elif name in self.claimed:
                    self.err(
                        rule,
                        f"{out!r}: {name!r} is already claimed by the rule at line "
                        f"{self.claimed[name].line}",
                    )
                    ok = False
            for name, _f in parts:  # a failed unit still owns its tensors: no follow-on noise
                if name in tensors:
                    self.claimed.setdefault(name, rule)
            if ok:
                self.candidates.append(_Candidate(rule, out, [(tensors[n], f) for n, f in parts]))

    def _claim_derive(self, rule: Rule) -> None:
        assert rule.output is not None and rule.inputs
        bindings: list[dict[str, str]] = []
        seen: set[tuple[tuple[str, str], ...]] = set()
        for n in self.names:
            b = rule.inputs[0].match(n)
            if b is None:
                continue
            key = tuple(sorted(b.items()))
            if key not in seen:
                seen.add(key)
                bindings.append(b)
        first = rule.inputs[0]
        free = [b for b in bindings if first.format(b) not in self.claimed]
        if not free:
            if bindings:
                self._nothing(rule, [first.format(b) for b in bindings])
            else:
                self._nothing(rule, [], f"no tensor matches the first input {first.text!r}")
            return
        for b in free:
            names = [t.format(b) for t in rule.inputs]
            out = rule.output.format(b)
            ok = True
            for name in names:
                if name not in self.source.tensors:
                    self.err(rule, f"{out!r}: input {name!r} is missing from the source")
                    ok = False
                elif name in self.claimed:
                    self.err(
                        rule,
                        f"{out!r}: input {name!r} is already claimed by the rule at "
                        f"line {self.claimed[name].line}",
                    )
                    ok = False
            for name in names:  # a failed unit still owns its inputs: no follow-on noise
                if name in self.source.tensors:
                    self.claimed.setdefault(name, rule)
            if ok:
                self.candidates.append(
                    _Candidate(rule, out, [(self.source.tensors[n], "input") for n in names])
                )

    # -- entries -------------------------------------------------------------------------------

    def entries(self) -> list[PlanEntry]:
        out: list[PlanEntry] = []
        owner: dict[str, Rule] = {}
        for cand in self.candidates:
            prev = owner.get(cand.output)
            if prev is not None:
                self.err(
                    cand.rule,
                    f"output {cand.output!r} is also produced by the rule at line {prev.line}",
                )
                continue
            owner[cand.output] = cand.rule
            bad_name = _output_name_problem(cand.output)
            if bad_name is not None:
                self.err(cand.rule, bad_name)
                continue
            fmt = FORMATS.get(cand.rule.format or "")
            if fmt is None:
                continue  # an unknown format was reported at load time
            opaque = [i for i, _f in cand.sources if not i.convertible]
            if opaque:
                # F4, F6_*, F8_*FNUZ, C64: the source reader only digests them.
                for i in opaque:
                    self.err(
                        cand.rule,
                        f"{cand.output!r}: source tensor {i.name!r} is {i.dtype}, a dtype the "
                        "converter cannot read as values; name it in a skip rule instead",
                    )
                continue
            entry = (
                self._copy_entry(cand, fmt)
                if cand.rule.kind == "copy"
                else self._encoded_entry(cand, fmt)
            )
            if entry is not None:
                out.append(entry)
        out.sort(key=lambda e: e.output)
        return out

    def _finish(
        self,
        cand: _Candidate,
        fmt: NumericFormat,
        shape: tuple[int, ...],
        conversion: str | None,
        transforms: list[TransformStep],
    ) -> PlanEntry | None:
        rule = cand.rule
        size = _encoded_size(fmt, shape)
        if isinstance(size, str):
            self.err(
                rule, f"{cand.output!r}: {fmt.layout} cannot store shape {list(shape)}: " + size
            )
            return None
        return PlanEntry(
            output=cand.output,
            format=fmt.name,
            layout=fmt.layout,
            encoder_profile=rule.encoder_profile if fmt.is_grouped else None,
            conversion=conversion,
            keep_nonfinite=rule.keep_nonfinite
            and conversion is not None
            and CONVERSIONS[conversion].rounds_to_bf16,
            copy=rule.copy,
            role=rule.role or "",
            constraints=rule.constraints,
            shape=shape,
            sources=tuple(
                PlanSource(i.name, i.dtype, i.shape, i.file, i.nbytes, f) for i, f in cand.sources
            ),
            transforms=tuple(transforms),
            rule=RuleRef.of(rule),
            evidence=rule.evidence,
            encoded_bytes=size,
            source_bytes=sum(i.nbytes for i, _f in cand.sources),
        )

    def _encoded_entry(self, cand: _Candidate, fmt: NumericFormat) -> PlanEntry | None:
        rule = cand.rule
        infos = [i for i, _f in cand.sources]
        first = infos[0]
        what = f"{cand.output!r}"
        dtypes = sorted({i.dtype for i in infos})
        if len(dtypes) > 1:
            self.err(
                rule,
                f"{what}: inputs have different dtypes ("
                + ", ".join(f"{i.name} {i.dtype}" for i in infos)
                + ")",
            )
            return None
        dtype = first.dtype
        transforms: list[TransformStep] = []
        shape = first.shape
        if len(infos) > 1:
            axis = rule.concat_axis if rule.concat_axis is not None else 0
            shape_or_err = _concat_shape([i.shape for i in infos], axis)
            if isinstance(shape_or_err, str):
                self.err(
                    rule,
                    f"{what}: cannot concatenate on axis {axis}: {shape_or_err} ("
                    + ", ".join(f"{i.name} {list(i.shape)}" for i in infos)
                    + ")",
                )
                return None
            shape = shape_or_err
            transforms.append(
                TransformStep("concat", axis=axis, inputs=tuple(i.name for i in infos))
            )
        for t in rule.transforms:
            if t.op == "transpose":
                if len(shape) != 2:
                    self.err(
                        rule,
                        f"{what}: transpose needs rank two, the tensor has shape {list(shape)}",
                        t.line,
                    )
                    return None
                shape = (shape[1], shape[0])
                transforms.append(TransformStep("transpose"))
            else:
                assert t.shape is not None
                new = _reshape(shape, t.shape)
                if new is None:
                    self.err(
                        rule, f"{what}: cannot reshape {list(shape)} to {list(t.shape)}", t.line
                    )
                    return None
                shape = new
                transforms.append(TransformStep("reshape", shape=shape))

        conversion: str | None = None
        if fmt.is_direct:
            if dtype != DIRECT_SAME_SOURCE[fmt.name]:
                usable = [
                    c
                    for c in rule.conversions
                    if c in CONVERSIONS and dtype in CONVERSIONS[c].sources
                ]
                if not usable:
                    fits = [
                        c.name
                        for c in CONVERSIONS.values()
                        if dtype in c.sources and c.target == fmt.name
                    ]
                    hint = (
                        f"add conversion: {fits[0]}"
                        if fits
                        else f"no conversion from {dtype} to {fmt.name} exists; choose another "
                        "format"
                    )
                    self.err(
                        rule,
                        f"{what} is {dtype}; storing it as {fmt.name} needs an "
                        f"explicit conversion ({hint})",
                    )
                    return None
                conversion = usable[0]
        elif fmt.is_grouped:
            if dtype not in GROUPED_SOURCES:
                self.err(
                    rule, f"{what} is {dtype}; {fmt.name} encodes only BF16, F16 or F32 sources"
                )
                return None
            if len(shape) != 2 or shape[0] == 0 or shape[1] == 0:
                self.err(
                    rule,
                    f"{what} has shape {list(shape)}; {fmt.name} ({fmt.layout}) "
                    "takes positive rank-two matrices [N, K] (add a reshape or transpose "
                    "transform, or choose a direct format)",
                )
                return None
        return self._finish(cand, fmt, shape, conversion, transforms)

    def _copy_entry(self, cand: _Candidate, fmt: NumericFormat) -> PlanEntry | None:
        assert cand.rule.copy is not None
        shape, bad = COPY_PATHS[cand.rule.copy].check({f: i for i, f in cand.sources})
        if bad:
            for msg in bad:
                self.err(cand.rule, f"{cand.output!r}: {msg}")
            return None
        return self._finish(cand, fmt, shape, None, [])


def identity_problems(recipe: Recipe, source: SourceCheckpoint) -> list[Problem]:
    """The source-identity problems of ``recipe`` against ``source`` (empty: it matches)."""
    return _Planner(recipe, source).identity()


def _output_name_problem(name: str) -> str | None:
    """Why the container could not store an output name (a derive template can make any)."""
    # Recipe strings never hold a lone surrogate (recipe/yamlnodes.py refuses them).
    problem = tensor_name_problem(name)
    return None if problem is None else f"output {name!r}: {problem}"


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

    planner = _Planner(loaded, source)
    identity = planner.identity()
    planner.claim_all()
    entries = planner.entries()
    planner.unclaimed()
    problems = list(load_problems)
    if check_identity:
        problems += identity
    problems += planner.problems
    if problems:
        applied = planner.problems or (identity if check_identity else [])
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
        skipped=tuple(sorted(planner.skipped, key=lambda s: s.name)),
        totals=tuple(FormatTotal(f, *totals[f]) for f in FORMATS if f in totals),
    )


# ---------------------------------------------------------------------------------------------
# helpers


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


def _concat_shape(shapes: Sequence[tuple[int, ...]], axis: int) -> tuple[int, ...] | str:
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        return "ranks differ"
    if axis >= rank:
        return f"the inputs have rank {rank}"
    for s in shapes[1:]:
        for d in range(rank):
            if d != axis and s[d] != shapes[0][d]:
                return f"dimension {d} differs"
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    return tuple(out)


def _reshape(shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...] | None:
    numel = 1
    for d in shape:
        numel *= d
    known = 1
    for d in target:
        if d != -1:
            known *= d
    if -1 in target:
        if known == 0 or numel % known:
            return None
        new = tuple(numel // known if d == -1 else d for d in target)
    else:
        new = target
    prod = 1
    for d in new:
        prod *= d
    return new if prod == numel else None


@functools.lru_cache(maxsize=4096)
def _encoded_size(fmt: NumericFormat, shape: tuple[int, ...]) -> int | str:
    """Bytes from the layout registry, or the layout's reason for refusing the shape.  Cached
    per (format, shape): a MoE checkpoint repeats a few shapes tens of thousands of times."""
    from ..layouts import lookup_layout  # lazy: layouts import numpy-heavy modules

    try:
        return int(lookup_layout(fmt.layout).encoded_size(fmt.name, shape))
    except NinferError as exc:
        return exc.message
