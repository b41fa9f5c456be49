"""The header-only listing of ``inspect``: per-format totals and one row per tensor.

Contract: :func:`summarize` reads only the header (``open_artifact`` validated it; no payload
byte is touched): producer, recipe, source identity, files and shards, bytes on disk split into
plane, header and alignment-gap bytes, per-format totals with logical and physical bits per
weight, and one :class:`~.report.TensorRow` per stored tensor (optionally filtered by a glob).

Bits per weight, per tensor and summed per format (spec Section 6.3 explains why the ideal
``b + 16/G`` is not the stored cost):

* logical: code bits of every element plus the scale bits of every logical group (16 per
  grouped group, 8 per NVFP4 block plus the 32-bit divisor, 16 per FP8 row);
* physical: 8 x the stored plane bytes, padding included, container gaps excluded.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from pathlib import Path

from ..container import Artifact, TensorInfo
from ..container.wire import PRELUDE_SIZE
from ..formats import FORMATS, Category, NumericFormat, lookup_format
from ..layouts.base import ceil_div
from .report import FormatTotals, InspectReport, TensorRow

__all__ = ["logical_bits", "summarize", "tensor_row"]


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def logical_bits(fmt: NumericFormat, shape: tuple[int, ...]) -> int:
    """Logical bits of one tensor: codes plus scale words (see the module docstring)."""
    n = _numel(shape)
    bits = n * fmt.code_bits
    if fmt.category is Category.GROUPED and fmt.group_size is not None and len(shape) == 2:
        bits += shape[0] * ceil_div(shape[1], fmt.group_size) * 16
    elif fmt.category is Category.BLOCK_SCALED and len(shape) == 2:
        bits += shape[0] * (shape[1] // 16) * 8 + 32
    elif fmt.category is Category.ROW_SCALED and len(shape) == 2:
        bits += shape[0] * 16
    return bits


def _bpw(bits: int, weights: int) -> float | None:
    return bits / weights if weights else None


def tensor_row(info: TensorInfo) -> TensorRow:
    fmt = lookup_format(info.format)
    prov = info.entry.provenance
    n = _numel(info.shape)
    transforms = []
    for t in prov.transforms:
        d = t.to_json()
        op = str(d.pop("op"))
        args = ",".join(f"{k}={v}" for k, v in sorted(d.items()))
        transforms.append(f"{op}({args})" if args else op)
    return TensorRow(
        name=info.name,
        format=info.format,
        layout=info.layout,
        shape=tuple(info.shape),
        physical=tuple(info.physical),
        bytes=info.nbytes,
        role=info.role,
        shard=info.shard,
        file=info.file.name,
        encoder_profile=prov.encoder_profile,
        conversion=prov.conversion,
        transforms=tuple(transforms),
        sources=tuple(s.name for s in prov.sources),
        logical_bits_per_weight=_bpw(logical_bits(fmt, tuple(info.shape)), n),
        physical_bits_per_weight=_bpw(8 * info.nbytes, n),
        importance=prov.importance,
        factor=prov.factor,
        factor_block=prov.factor_block,
    )


def summarize(art: Artifact, *, filter: str | None = None) -> InspectReport:
    """Header-only summary of an open artifact; ``filter`` is a case-sensitive glob on names
    that selects the listed tensors (the per-format totals always cover every tensor)."""
    meta = art.meta
    per_format: dict[str, list[int]] = {}
    plane_end: dict[Path, int] = {}
    gaps: dict[Path, int] = {}
    for info in art.tensors.values():
        fmt = lookup_format(info.format)
        t = per_format.setdefault(info.format, [0, 0, 0, 0])
        t[0] += 1
        t[1] += _numel(info.shape)
        t[2] += info.nbytes
        t[3] += logical_bits(fmt, tuple(info.shape))
        for p in info.planes:
            cursor = plane_end.get(info.file, PRELUDE_SIZE)
            gaps[info.file] = gaps.get(info.file, 0) + max(0, p.offset - cursor)
            plane_end[info.file] = max(cursor, p.offset + p.nbytes)
    files: list[tuple[str, int]] = []
    header_bytes = 0
    # Sizes of the files as opened (the snapshot), not whatever the names hold now.
    for f, size in zip(art.files, art.file_sizes, strict=True):
        files.append((f.name, size))
        header_bytes += size - plane_end.get(f, PRELUDE_SIZE)
    plane_bytes = sum(t[2] for t in per_format.values())
    formats = tuple(
        FormatTotals(
            format=name,
            tensors=per_format[name][0],
            weights=per_format[name][1],
            bytes=per_format[name][2],
            logical_bits_per_weight=_bpw(per_format[name][3], per_format[name][1]),
            physical_bits_per_weight=_bpw(8 * per_format[name][2], per_format[name][1]),
        )
        for name in FORMATS
        if name in per_format
    )
    rows = tuple(
        tensor_row(info)
        for info in art.tensors.values()
        if filter is None or fnmatch.fnmatchcase(info.name, filter)
    )
    source = meta.source
    return InspectReport(
        path=str(art.path),
        producer=meta.producer.to_json(),
        recipe={
            "name": meta.recipe.name,
            "digest": meta.recipe.digest,
            "evidence": list(meta.recipe.evidence),
            "text_bytes": len(meta.recipe.text.encode("utf-8")),
        },
        source={
            "kind": source.kind,
            "path": source.path,
            "files": [f.to_json() for f in source.files],
            "tensor_count": len(source.tensors),
            "model_type": (source.config or {}).get("model_type"),
            "architectures": (source.config or {}).get("architectures"),
            "repo": None if source.repo is None else source.repo.to_json(),
        },
        files=tuple(files),
        side_files=tuple(f.to_json() for f in art.side_files.values()),
        stray_files=art.stray_files,
        shard_count=art.shard_count,
        alignment=meta.alignment,
        total_bytes=sum(s for _, s in files),
        plane_bytes=plane_bytes,
        header_bytes=header_bytes,
        gap_bytes=sum(gaps.values()),
        formats=formats,
        tensors=rows,
        tensor_count=len(art.tensors),
        filter=filter,
    )
