"""The provenance convert records for a plan entry (docs/container.md section 4.8), and verify
compares with the stored one: one definition for both.

Contract: :func:`provenance_of` builds the typed
:class:`~ninfer_convert.container.schema.Provenance` straight from the plan entry (the writer
stores it as given; its JSON form is the schema's).  The plan's transform steps map one to one
onto the stored transforms (a concat keeps its axis, not its input names: those are the
sources), a copy path adds a final ``copy-quantized`` transform, the plan's rule reference
loses its ``kind``, and the importance digest is present only for an entry that carries an
importance vector (so other artifacts stay byte-identical).
:func:`provenance_matches` is ``provenance_of(entry) == stored`` without building the expected
value for the common entry (one or more sources, no transform, copy path, importance or
factor); any other entry is compared with :func:`provenance_of` itself.
:func:`provenances` is ``{e.output: provenance_of(e) for e in entries}``, the common entry's
built with the compiled slot fillers (the frozen ``__init__`` cost more than the rest) and one
rule reference per plan rule.
"""

from __future__ import annotations

from collections.abc import Iterable

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
from ..jsonfields.objects import _maker
from ..recipe import PlanEntry

__all__ = ["provenance_matches", "provenance_of", "provenances"]

# What the compiled decoders build these with: instances equal to the classes' own (see
# _maker), without the frozen __init__'s object.__setattr__ per field.
_make_provenance = _maker(Provenance)
_make_source = _maker(SourceRef)


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


def provenances(entries: Iterable[PlanEntry]) -> dict[str, Provenance]:
    """Every entry's :func:`provenance_of`, by output name (see the module contract)."""
    # id(plan rule) -> (plan rule, its reference): holding the rule keeps its id its own.
    rules: dict[int, tuple[object, RuleRef]] = {}
    out: dict[str, Provenance] = {}
    for e in entries:
        if e.transforms or e.copy is not None or e.importance is not None or e.factor is not None:
            out[e.output] = provenance_of(e)
            continue
        rule = e.rule
        known = rules.get(id(rule))
        if known is None:
            known = rules[id(rule)] = (rule, RuleRef(rule.index, rule.line, rule.pattern))
        refs = tuple([_make_source(s.name, s.dtype, s.shape, s.file) for s in e.sources])
        out[e.output] = _make_provenance(refs, e.conversion, (), e.encoder_profile, known[1],
                                         e.constraints, None, None, None)  # fmt: skip
    return out


def provenance_matches(entry: PlanEntry, stored: Provenance) -> bool:
    """``provenance_of(entry) == stored``, field by field with the same ``==`` the typed
    values' equality applies (verify compares every stored tensor's provenance; building the
    typed value cost more than the comparison).  Exact types are required, as the dataclass
    equality requires them; an entry with transforms, a copy path, an importance vector or a
    factor is compared with :func:`provenance_of` itself."""
    if entry.transforms or entry.copy is not None or entry.importance is not None:
        return provenance_of(entry) == stored
    if entry.factor is not None or type(stored) is not Provenance:
        return provenance_of(entry) == stored
    rule, planned = stored.rule, entry.rule
    if not (
        stored.transforms == ()
        and stored.conversion == entry.conversion
        and stored.encoder_profile == entry.encoder_profile
        and stored.constraints == entry.constraints
        and stored.importance is None
        and stored.factor is None
        and stored.factor_block is None
        and type(rule) is RuleRef
        and type(stored.sources) is tuple  # provenance_of builds a tuple
        and rule.index == planned.index
        and rule.line == planned.line
        and rule.pattern == planned.pattern
        and len(stored.sources) == len(entry.sources)
    ):
        return False
    for ref, src in zip(stored.sources, entry.sources, strict=True):
        if not (
            type(ref) is SourceRef
            and ref.name == src.name
            and ref.dtype == src.dtype
            and ref.shape == src.shape
            and ref.file == src.file
        ):
            return False
    return True
