"""The provenance convert records for a plan entry (docs/container.md section 4.8), and verify
compares with the stored one: one definition for both.

Contract: :func:`provenance_of` builds the typed
:class:`~ninfer_convert.container.schema.Provenance` straight from the plan entry (the writer
stores it as given; its JSON form is the schema's).  The plan's transform steps map one to one
onto the stored transforms (a concat keeps its axis, not its input names: those are the
sources), a copy path adds a final ``copy-quantized`` transform, the plan's rule reference
loses its ``kind``, and the importance digest is present only for an entry that carries an
importance vector (so other artifacts stay byte-identical).
"""

from __future__ import annotations

from ..container.schema import (
    ConcatTransform,
    CopyQuantizedTransform,
    Provenance,
    ReshapeTransform,
    RuleRef,
    SourceRef,
    Transform,
    TransposeTransform,
)
from ..importance import vector_digest
from ..recipe import PlanEntry

__all__ = ["provenance_of"]


def provenance_of(entry: PlanEntry) -> Provenance:
    transforms: list[Transform] = []
    for t in entry.transforms:
        if t.op == "concat":
            assert t.axis is not None  # a plan's concat step always has its axis
            transforms.append(ConcatTransform(t.axis))
        elif t.op == "reshape":
            transforms.append(ReshapeTransform(t.shape or ()))
        else:
            transforms.append(TransposeTransform())
    if entry.copy is not None:
        transforms.append(CopyQuantizedTransform(entry.copy))
    return Provenance(
        sources=tuple(SourceRef(s.name, s.dtype, s.shape, s.file) for s in entry.sources),
        conversion=entry.conversion,
        transforms=tuple(transforms),
        encoder_profile=entry.encoder_profile,
        rule=RuleRef(entry.rule.index, entry.rule.line, entry.rule.pattern),
        constraints=entry.constraints,
        importance=None if entry.importance is None else vector_digest(entry.importance),
        factor=None if entry.factor is None else entry.factor.digest,
        factor_block=None if entry.factor is None else entry.factor.block,
    )
