"""The ``inspect`` report: what :func:`~ninfer_convert.inspect.inspect_artifact` returns.

Contract: frozen values whose ``to_json`` methods build the documented, stable JSON object of
``inspect --json`` (docs/cli.md; ``schema_version`` :data:`INSPECT_SCHEMA_VERSION`, fields only
ever added).  Computing them is :mod:`.summary`'s (header only) and :mod:`.details`'s (one
tensor's values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "INSPECT_SCHEMA_VERSION",
    "FormatTotals",
    "InspectReport",
    "PlaneDetails",
    "TensorDetails",
    "TensorRow",
    "ValueStats",
]

INSPECT_SCHEMA_VERSION = 1
"""Version of the ``inspect --json`` object; bumped only for an incompatible change."""


@dataclass(frozen=True)
class TensorRow:
    """One stored tensor, from the header only."""

    name: str
    format: str
    layout: str
    shape: tuple[int, ...]
    physical: tuple[int, ...]
    bytes: int
    role: str
    shard: int
    file: str
    encoder_profile: str | None
    conversion: str | None
    transforms: tuple[str, ...]
    sources: tuple[str, ...]
    logical_bits_per_weight: float | None
    physical_bits_per_weight: float | None
    importance: str | None = None
    """Digest of the importance vector the encoder used (MSE_F16_SEARCH_IW_V1), else None."""
    factor: str | None = None
    """Digest of the compensation factor the encoder used (GPTQ_F16_SEARCH_IW_V1), else None."""
    factor_block: int | None = None
    """That factor's block width B, else None."""

    @property
    def derivation(self) -> str:
        """Encoder profile, conversion and transforms in one short text ('-' when none)."""
        parts = [p for p in (self.encoder_profile, self.conversion) if p]
        if self.importance is not None:
            parts.append(f"importance {self.importance[:12]}")
        if self.factor is not None:
            parts.append(f"factor B={self.factor_block} {self.factor[:12]}")
        parts += list(self.transforms)
        return ", ".join(parts) if parts else "-"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "layout": self.layout,
            "shape": list(self.shape),
            "physical": list(self.physical),
            "bytes": self.bytes,
            "role": self.role,
            "shard": self.shard,
            "file": self.file,
            "encoder_profile": self.encoder_profile,
            "conversion": self.conversion,
            "transforms": list(self.transforms),
            "sources": list(self.sources),
            "logical_bits_per_weight": self.logical_bits_per_weight,
            "physical_bits_per_weight": self.physical_bits_per_weight,
            "importance": self.importance,
            "factor": self.factor,
            "factor_block": self.factor_block,
        }


@dataclass(frozen=True)
class FormatTotals:
    format: str
    tensors: int
    weights: int
    bytes: int
    logical_bits_per_weight: float | None
    physical_bits_per_weight: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "tensors": self.tensors,
            "weights": self.weights,
            "bytes": self.bytes,
            "logical_bits_per_weight": self.logical_bits_per_weight,
            "physical_bits_per_weight": self.physical_bits_per_weight,
        }


@dataclass(frozen=True)
class PlaneDetails:
    name: str
    offset: int
    bytes: int
    digest: str
    extents: tuple[int, ...]
    word: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "offset": self.offset,
            "bytes": self.bytes,
            "digest": self.digest,
            "extents": list(self.extents),
            "word": self.word,
        }


@dataclass(frozen=True)
class ValueStats:
    """Statistics of the dequantized values and of the stored codes of one tensor.

    ``min``/``max``/``mean`` cover finite values only (``None`` when there is none);
    ``code_histogram`` maps a code (signed for grouped formats, the word for NVFP4 / FP8) to its
    count, ``None`` for direct formats; ``zero_scale_groups`` counts +0 scale words (groups,
    NVFP4 blocks, FP8 rows), ``None`` for direct formats.
    """

    count: int
    finite: int
    nan: int
    inf: int
    min: float | None
    max: float | None
    mean: float | None
    code_histogram: dict[int, int] | None
    zero_scale_groups: int | None
    scale_groups: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "finite": self.finite,
            "nan": self.nan,
            "inf": self.inf,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "code_histogram": None
            if self.code_histogram is None
            else {str(k): v for k, v in sorted(self.code_histogram.items())},
            "zero_scale_groups": self.zero_scale_groups,
            "scale_groups": self.scale_groups,
        }


@dataclass(frozen=True)
class TensorDetails:
    row: TensorRow
    provenance: dict[str, Any]
    planes: tuple[PlaneDetails, ...]
    padding_bytes: int
    """Stored plane bytes minus the bytes the logical words need (layout padding)."""
    values: ValueStats

    def to_json(self) -> dict[str, Any]:
        return {
            **self.row.to_json(),
            "provenance": self.provenance,
            "planes": [p.to_json() for p in self.planes],
            "padding_bytes": self.padding_bytes,
            "values": self.values.to_json(),
        }


@dataclass(frozen=True)
class InspectReport:
    """The summary of an artifact (header only), optionally one tensor's details."""

    path: str
    producer: dict[str, Any]
    recipe: dict[str, Any]
    source: dict[str, Any]
    files: tuple[tuple[str, int], ...]
    side_files: tuple[dict[str, Any], ...]
    shard_count: int
    alignment: int
    total_bytes: int
    plane_bytes: int
    header_bytes: int
    gap_bytes: int
    formats: tuple[FormatTotals, ...]
    tensors: tuple[TensorRow, ...]
    tensor_count: int
    filter: str | None
    details: TensorDetails | None = None
    stray_files: tuple[str, ...] = ()
    """Container-like names in the directory that are not part of the artifact."""

    @property
    def weights(self) -> int:
        return sum(f.weights for f in self.formats)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON object of ``inspect --json`` (docs/cli.md)."""
        return {
            "schema_version": INSPECT_SCHEMA_VERSION,
            "kind": "ninfer-inspect",
            "artifact": {
                "path": self.path,
                "files": [{"name": n, "bytes": b} for n, b in self.files],
                "shard_count": self.shard_count,
                "alignment": self.alignment,
                "total_bytes": self.total_bytes,
                "plane_bytes": self.plane_bytes,
                "header_bytes": self.header_bytes,
                "gap_bytes": self.gap_bytes,
                "side_files": list(self.side_files),
                "stray_files": list(self.stray_files),
            },
            "producer": self.producer,
            "recipe": self.recipe,
            "source": self.source,
            "formats": [f.to_json() for f in self.formats],
            "totals": {
                "tensors": self.tensor_count,
                "weights": self.weights,
                "bytes": self.plane_bytes,
            },
            "filter": self.filter,
            "tensors": [t.to_json() for t in self.tensors],
            "tensor": None if self.details is None else self.details.to_json(),
        }
