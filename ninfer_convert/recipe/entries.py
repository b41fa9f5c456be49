"""The entries of a conversion plan: what one output tensor is made of and how (the data the
planner produces and ``derive`` consumes).  A module of its own so that the recipe modules the
planner uses (copy paths, cost) can name a plan entry without importing the planner.

Contract: each class is a frozen dataclass whose JSON form (the plan's ``entries`` and
``skipped`` in ``--dry-run --json``, docs/recipes.md section 7) is generated from its fields by
:mod:`ninfer_convert.jsonfields`, the machinery of the container header's schema.
``to_dict()`` is that form (keys in field order); ``from_dict()`` validates it strictly (a
:class:`~ninfer_convert.errors.SchemaError` naming the field) and round-trips:
``PlanEntry.from_dict(e.to_dict()) == e``.  ``PlanEntry.importance`` and ``PlanEntry.factor`` are
not part of the JSON form (convert attaches them from the importance and factor files).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

from ..jsonfields import Bool, Int, Obj, Opt, SchemaObject, Seq, Str, js, not_json, schema
from .model import Rule, RuleKind, SourceField

__all__ = ["PlanEntry", "PlanSource", "RuleRef", "SkippedTensor", "TransformStep"]

TransformOp = Literal["concat", "transpose", "reshape"]


def _one_of(what: str, values: tuple[str, ...]) -> Str:
    """A string that is one of ``values`` (a closed set: any other name is refused)."""
    allowed = ", ".join(values)
    return Str(
        pattern=re.compile("|".join(re.escape(v) for v in values)),
        mismatch=lambda text: f"unknown {what} {text[:80]!r}; allowed: {allowed}",
    )


_NAME = Str(nonempty=True)
_INTS = Seq(Int())
_STRS = Seq(Str())


_P = TypeVar("_P", bound="_PlanJSON")


class _PlanJSON(SchemaObject):
    """The plan's names for the generated JSON form."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (plain values, keys in field order)."""
        return self.to_json()

    @classmethod
    def from_dict(cls: type[_P], d: Mapping[str, Any]) -> _P:
        """Validate the JSON form strictly and build the value (``to_dict``'s inverse)."""
        return cls.from_json(d)


@schema("source")
@dataclass(frozen=True, slots=True)
class PlanSource(_PlanJSON):
    """One source tensor an output is made from, and what it contributes (``field``)."""

    name: str = field(metadata=js(_NAME))
    dtype: str = field(metadata=js(_NAME))
    shape: tuple[int, ...] = field(metadata=js(_INTS))
    file: str = field(metadata=js(_NAME))
    nbytes: int = field(metadata=js(Int()))
    field: SourceField = field(
        default="input", metadata=js(_one_of("source field", get_args(SourceField)))
    )


def _step_problem(step: TransformStep) -> str | None:
    """Which keys a step's ``op`` takes: each op has its own fixed key set."""
    if step.op == "concat" and (
        step.axis is None or len(step.inputs) < 2 or step.shape is not None
    ):
        return "a concat step has the keys op, axis and inputs (two or more names)"
    if step.op == "reshape" and (step.shape is None or step.axis is not None or step.inputs):
        return "a reshape step has the keys op and shape"
    if step.op == "transpose" and (step.shape is not None or step.axis is not None or step.inputs):
        return "a transpose step has the key op alone"
    return None


@schema("transform", check=_step_problem)
@dataclass(frozen=True, slots=True)
class TransformStep(_PlanJSON):
    """One derivation step, in application order (recorded in provenance).

    ``concat`` joins ``inputs`` (source names, in order) along ``axis``; ``transpose`` swaps the
    two axes of a rank-two tensor; ``reshape`` gives ``shape`` (fully resolved, no -1).  The JSON
    form holds the keys of its op only."""

    op: TransformOp = field(metadata=js(_one_of("transform op", get_args(TransformOp))))
    axis: int | None = field(default=None, metadata=js(Int(), omit_none=True))
    shape: tuple[int, ...] | None = field(default=None, metadata=js(_INTS, omit_none=True))
    inputs: tuple[str, ...] = field(default=(), metadata=js(Seq(_NAME), omit_none=True))


@schema("rule")
@dataclass(frozen=True, slots=True)
class RuleRef(_PlanJSON):
    """Which recipe rule produced an entry: 0-based index, 1-based line, kind and pattern.

    Not the container's :class:`~ninfer_convert.container.schema.RuleRef` (index, line,
    pattern): that one is the stored provenance (docs/container.md), frozen with the format;
    this one is the plan's report (docs/recipes.md) and also names the rule's ``kind``.
    Provenance is made from this one by dropping ``kind``."""

    index: int = field(metadata=js(Int()))
    line: int = field(metadata=js(Int()))
    kind: RuleKind = field(metadata=js(_one_of("rule kind", get_args(RuleKind))))
    pattern: str = field(metadata=js(Str()))

    @staticmethod
    def of(rule: Rule) -> RuleRef:
        return RuleRef(rule.index, rule.line, rule.kind, rule.pattern_text)


@schema("entry")
@dataclass(frozen=True, slots=True)
class PlanEntry(_PlanJSON):
    """One output tensor: everything convert needs, and everything provenance records."""

    output: str = field(metadata=js(_NAME))
    format: str = field(metadata=js(_NAME))
    layout: str = field(metadata=js(_NAME))
    encoder_profile: str | None = field(metadata=js(Opt(_NAME)))
    conversion: str | None = field(metadata=js(Opt(_NAME)))
    """The conversion applied to this entry's source dtype (None: same type, bitwise)."""
    keep_nonfinite: bool = field(metadata=js(Bool()))
    copy: str | None = field(metadata=js(Opt(_NAME)))
    """The copy path (NVFP4 / FP8 row), or None."""
    role: str = field(metadata=js(Str()))
    constraints: tuple[str, ...] = field(metadata=js(_STRS))
    shape: tuple[int, ...] = field(metadata=js(_INTS))
    """Logical shape of the output."""
    sources: tuple[PlanSource, ...] = field(metadata=js(Seq(Obj(PlanSource))))
    transforms: tuple[TransformStep, ...] = field(metadata=js(Seq(Obj(TransformStep))))
    rule: RuleRef = field(metadata=js(Obj(RuleRef)))
    evidence: tuple[str, ...] = field(metadata=js(_STRS))
    encoded_bytes: int = field(metadata=js(Int()))
    """Bytes of all planes from the layout's ``encoded_size`` (container gaps excluded)."""
    source_bytes: int = field(metadata=js(Int()))
    importance: Any = field(default=None, compare=False, repr=False, metadata=not_json())
    """MSE_F16_SEARCH_IW_V1 only: the [K] binary32 importance words (a read-only numpy
    uint32 array) attached by :func:`ninfer_convert.importance.attach_importance`."""
    factor: Any = field(default=None, compare=False, repr=False, metadata=not_json())
    """GPTQ_F16_SEARCH_IW_V1 only: a :class:`ninfer_convert.factors.FactorRef` to the checked
    [K, B] compensation factor (its shape and digest; never the words, so a plan holds no
    factor), attached by :func:`ninfer_convert.factors.attach_factors`; its ``words()`` reads
    the factor for the tensor being encoded."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # Python ints: never wraps

    @property
    def source_dtype(self) -> str:
        """dtype of the (first) source tensor; all inputs of a concat share it."""
        return self.sources[0].dtype


@schema("skipped")
@dataclass(frozen=True, slots=True)
class SkippedTensor(_PlanJSON):
    """A source tensor a ``skip`` rule claimed: it is not converted."""

    name: str = field(metadata=js(_NAME))
    dtype: str = field(metadata=js(_NAME))
    shape: tuple[int, ...] = field(metadata=js(_INTS))
    file: str = field(metadata=js(_NAME))
    rule: RuleRef = field(metadata=js(Obj(RuleRef)))
    reason: str = field(metadata=js(Str()))
