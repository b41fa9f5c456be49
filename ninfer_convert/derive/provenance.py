"""The provenance convert records for a plan entry (docs/container.md), and verify compares
with the stored one: one definition for both."""

from __future__ import annotations

from typing import Any

from ..importance import vector_digest
from ..recipe import PlanEntry

__all__ = ["provenance_of"]


def provenance_of(entry: PlanEntry) -> dict[str, Any]:
    transforms: list[dict[str, Any]] = []
    for t in entry.transforms:
        if t.op == "concat":
            transforms.append({"op": "concat", "axis": t.axis})
        elif t.op == "reshape":
            transforms.append({"op": "reshape", "shape": list(t.shape or ())})
        else:
            transforms.append({"op": "transpose"})
    if entry.copy is not None:
        transforms.append({"op": "copy-quantized", "scheme": entry.copy})
    prov: dict[str, Any] = {
        "sources": [
            {"name": s.name, "dtype": s.dtype, "shape": list(s.shape), "file": s.file}
            for s in entry.sources
        ],
        "conversion": entry.conversion,
        "transforms": transforms,
        "encoder_profile": entry.encoder_profile,
        "rule": {"index": entry.rule.index, "line": entry.rule.line, "pattern": entry.rule.pattern},
        "constraints": list(entry.constraints),
    }
    if entry.importance is not None:  # only then: other artifacts stay byte-identical
        prov["importance"] = vector_digest(entry.importance)
    return prov
