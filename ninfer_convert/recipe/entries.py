"""The entries of a conversion plan: what one output tensor is made of and how (the data the
planner produces and ``derive`` consumes).  :meth:`PlanEntry.to_dict` / :meth:`PlanEntry.
from_dict` round-trip.  A module of its own so that the recipe modules the planner uses
(copy paths, cost) can name a plan entry without importing the planner."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .model import Rule, SourceField

__all__ = ["PlanEntry", "PlanSource", "RuleRef", "SkippedTensor", "TransformStep"]


@dataclass(frozen=True)
class PlanSource:
    """One source tensor an output is made from, and what it contributes (``field``)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    nbytes: int
    field: SourceField = "input"

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "file": self.file,
            "nbytes": self.nbytes,
            "field": self.field,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PlanSource:
        return PlanSource(
            str(d["name"]),
            str(d["dtype"]),
            tuple(int(x) for x in d["shape"]),
            str(d["file"]),
            int(d["nbytes"]),
            d["field"],
        )


@dataclass(frozen=True)
class TransformStep:
    """One derivation step, in application order (recorded in provenance).

    ``concat`` joins ``inputs`` (source names, in order) along ``axis``; ``transpose`` swaps the
    two axes of a rank-two tensor; ``reshape`` gives ``shape`` (fully resolved, no -1)."""

    op: Literal["concat", "transpose", "reshape"]
    axis: int | None = None
    shape: tuple[int, ...] | None = None
    inputs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"op": self.op}
        if self.op == "concat":
            d["axis"] = self.axis
            d["inputs"] = list(self.inputs)
        elif self.op == "reshape":
            d["shape"] = list(self.shape or ())
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> TransformStep:
        op = d["op"]
        if op == "concat":
            return TransformStep("concat", axis=int(d["axis"]), inputs=tuple(d["inputs"]))
        if op == "reshape":
            return TransformStep("reshape", shape=tuple(int(x) for x in d["shape"]))
        if op == "transpose":
            return TransformStep("transpose")
        raise ValueError(f"unknown transform op {op!r}")


@dataclass(frozen=True)
class RuleRef:
    """Which recipe rule produced an entry: 0-based index, 1-based line, kind and pattern."""

    index: int
    line: int
    kind: str
    pattern: str

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "line": self.line, "kind": self.kind, "pattern": self.pattern}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RuleRef:
        return RuleRef(int(d["index"]), int(d["line"]), str(d["kind"]), str(d["pattern"]))

    @staticmethod
    def of(rule: Rule) -> RuleRef:
        return RuleRef(rule.index, rule.line, rule.kind, rule.pattern_text)


@dataclass(frozen=True)
class PlanEntry:
    """One output tensor: everything convert needs, and everything provenance records."""

    output: str
    format: str
    layout: str
    encoder_profile: str | None
    conversion: str | None
    """The conversion applied to this entry's source dtype (None: same type, bitwise)."""
    keep_nonfinite: bool
    copy: str | None
    """The copy path (NVFP4 / FP8 row), or None."""
    role: str
    constraints: tuple[str, ...]
    shape: tuple[int, ...]
    """Logical shape of the output."""
    sources: tuple[PlanSource, ...]
    transforms: tuple[TransformStep, ...]
    rule: RuleRef
    evidence: tuple[str, ...]
    encoded_bytes: int
    """Bytes of all planes from the layout's ``encoded_size`` (container gaps excluded)."""
    source_bytes: int
    importance: Any = field(default=None, compare=False, repr=False)
    """MSE_F16_SEARCH_IW_V1 only: the [K] binary32 importance words (a read-only numpy
    uint32 array) attached by :func:`ninfer_convert.importance.attach_importance`."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # Python ints: never wraps

    @property
    def source_dtype(self) -> str:
        """dtype of the (first) source tensor; all inputs of a concat share it."""
        return self.sources[0].dtype

    def to_dict(self) -> dict[str, object]:
        return {
            "output": self.output,
            "format": self.format,
            "layout": self.layout,
            "encoder_profile": self.encoder_profile,
            "conversion": self.conversion,
            "keep_nonfinite": self.keep_nonfinite,
            "copy": self.copy,
            "role": self.role,
            "constraints": list(self.constraints),
            "shape": list(self.shape),
            "sources": [s.to_dict() for s in self.sources],
            "transforms": [t.to_dict() for t in self.transforms],
            "rule": self.rule.to_dict(),
            "evidence": list(self.evidence),
            "encoded_bytes": self.encoded_bytes,
            "source_bytes": self.source_bytes,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> PlanEntry:
        return PlanEntry(
            output=str(d["output"]),
            format=str(d["format"]),
            layout=str(d["layout"]),
            encoder_profile=d["encoder_profile"],
            conversion=d["conversion"],
            keep_nonfinite=bool(d["keep_nonfinite"]),
            copy=d["copy"],
            role=str(d["role"]),
            constraints=tuple(d["constraints"]),
            shape=tuple(int(x) for x in d["shape"]),
            sources=tuple(PlanSource.from_dict(s) for s in d["sources"]),
            transforms=tuple(TransformStep.from_dict(t) for t in d["transforms"]),
            rule=RuleRef.from_dict(d["rule"]),
            evidence=tuple(d["evidence"]),
            encoded_bytes=int(d["encoded_bytes"]),
            source_bytes=int(d["source_bytes"]),
        )


@dataclass(frozen=True)
class SkippedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    rule: RuleRef
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "file": self.file,
            "rule": self.rule.to_dict(),
            "reason": self.reason,
        }
