"""Plan entries: the logical shape, format, layout, conversion and encoded size of each claimed
output, checked against its format before any tensor byte is read.

Contract (docs/recipes.md): an output name is made once and must be storable by the container;
an output made from a tensor of an opaque dtype (F4, F6_*, F8_*FNUZ, C64:
``source.header.OPAQUE_DTYPES``) is an error; the inputs of one output share a dtype; ``concat``
(axis ``concat_axis``, default 0), ``transpose`` (rank two) and ``reshape`` (one ``-1`` at most)
apply in order; a direct format takes its own source dtype or an explicit ``conversion``; a
grouped format takes BF16, F16 or F32 positive rank-two matrices; copy-path outputs are checked
by their copy path; the layout registry gives the encoded size or its reason to refuse the
shape.  Every problem is appended to the caller's list; :meth:`EntryBuilder.entries` returns
the entries sorted by output name.

A one-input output is planned the whole way once per (rule, source dtype, source shape); the
others of that key are copies of its entry with their own output, source and source bytes
(``_from_template``: nothing else in an entry depends on the name), and a key whose first
output had a problem is planned anew for each output, so each reports its own
(tests/test_plan_reuse.py compares with planning each output alone).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

from ..errors import NinferError
from ..formats import FORMATS, NumericFormat
from ..jsonfields.makers import instance_maker
from ..names import tensor_name_problem, tensor_names_problem_free
from ..source import SourceTensorInfo
from .claiming import Candidate, rule_problem
from .copy_paths import COPY_PATHS
from .entries import PlanEntry, PlanSource, RuleRef, TransformStep
from .model import Problem, Rule, SourceField
from .tables import CONVERSIONS, DIRECT_SAME_SOURCE, GROUPED_SOURCES

__all__ = ["EntryBuilder"]


class EntryBuilder:
    """Turns the claimed candidates into plan entries; problems go to ``problems``."""

    def __init__(self, candidates: Sequence[Candidate], problems: list[Problem]) -> None:
        self.candidates = candidates
        self.problems = problems
        # One RuleRef per rule, shared by its entries (frozen: equal either way).
        self._refs: dict[int, tuple[Rule, RuleRef]] = {}

    def err(self, rule: Rule | None, message: str, line: int | None = None) -> None:
        self.problems.append(rule_problem(rule, message, line))

    def entries(self) -> list[PlanEntry]:
        out: list[PlanEntry] = []
        owner: dict[str, Rule] = {}
        # A planned one-input entry per (rule, dtype, shape): the entry of another input of
        # that rule, dtype and shape differs only in its output, its source and its source
        # bytes (see _from_template).  Only an entry that was planned without a problem is
        # kept: an input whose key has none takes the whole path (and reports its own).
        templates: dict[tuple[int, str, tuple[int, ...]], tuple[Rule, PlanEntry]] = {}
        # Every output name storable (the usual case): no name check per output finds one.
        names_ok = tensor_names_problem_free(c.output for c in self.candidates)
        for cand in self.candidates:
            rule = cand.rule
            prev = owner.get(cand.output)
            if prev is not None:
                self.err(
                    rule, f"output {cand.output!r} is also produced by the rule at line {prev.line}"
                )
                continue
            owner[cand.output] = rule
            if not names_ok:
                bad_name = _output_name_problem(cand.output)
                if bad_name is not None:
                    self.err(rule, bad_name)
                    continue
            key = None
            if len(cand.sources) == 1 and rule.kind != "copy":
                info, fld = cand.sources[0]
                key = (id(rule), info.dtype, info.shape)
                known = templates.get(key)
                # A template exists only for a rule whose format is known (it was planned).
                if known is not None and known[0] is rule:
                    out.append(_from_template(known[1], cand.output, info, fld))
                    continue
            fmt = FORMATS.get(rule.format or "")
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
                if key is not None:
                    templates[key] = (cand.rule, entry)
        out.sort(key=_output)
        return out

    def _finish(
        self,
        cand: Candidate,
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
            rule=self._rule_ref(rule),
            evidence=rule.evidence,
            encoded_bytes=size,
            source_bytes=sum(i.nbytes for i, _f in cand.sources),
        )

    def _rule_ref(self, rule: Rule) -> RuleRef:
        known = self._refs.get(id(rule))
        if known is None or known[0] is not rule:
            known = self._refs[id(rule)] = (rule, RuleRef.of(rule))
        return known[1]

    def _encoded_entry(self, cand: Candidate, fmt: NumericFormat) -> PlanEntry | None:
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
        shaped = self._shaped(cand, what)
        if shaped is None:
            return None
        shape, transforms = shaped

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

    def _shaped(
        self, cand: Candidate, what: str
    ) -> tuple[tuple[int, ...], list[TransformStep]] | None:
        """The logical shape after concatenating the inputs and applying the rule's transforms
        in order, with the transform steps to record (None: a problem was reported)."""
        rule = cand.rule
        infos = [i for i, _f in cand.sources]
        first = infos[0]
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
        return shape, transforms

    def _copy_entry(self, cand: Candidate, fmt: NumericFormat) -> PlanEntry | None:
        assert cand.rule.copy is not None
        shape, bad = COPY_PATHS[cand.rule.copy].check({f: i for i, f in cand.sources})
        if bad:
            for msg in bad:
                self.err(cand.rule, f"{cand.output!r}: {msg}")
            return None
        return self._finish(cand, fmt, shape, None, [])


_make_entry = instance_maker(PlanEntry)
_make_source = instance_maker(PlanSource)
_output = operator.attrgetter("output")


def _from_template(
    t: PlanEntry, output: str, info: SourceTensorInfo, fld: SourceField
) -> PlanEntry:
    """The entry of the one-input candidate ``output`` (from ``info``) whose rule, dtype and
    shape are those of the planned entry ``t``: what _encoded_entry and _finish would build
    (every field but the output, the source and the source bytes follows from the rule, the
    dtype and the shape), built positionally (PlanEntry's field order)."""
    return _make_entry(
        output,
        t.format,
        t.layout,
        t.encoder_profile,
        t.conversion,
        t.keep_nonfinite,
        t.copy,
        t.role,
        t.constraints,
        t.shape,
        (_make_source(info.name, info.dtype, info.shape, info.file, info.nbytes, fld),),
        t.transforms,
        t.rule,
        t.evidence,
        t.encoded_bytes,
        info.nbytes,
        None,
        None,
    )


def _output_name_problem(name: str) -> str | None:
    """Why the container could not store an output name (a derive template can make any)."""
    # Recipe strings never hold a lone surrogate (recipe/yamlnodes.py refuses them).
    problem = tensor_name_problem(name)
    return None if problem is None else f"output {name!r}: {problem}"


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
