"""``inspect``: what is inside an artifact, from its header, and one tensor's values on request.

Contract:

* :func:`summarize` reads only the header (``open_artifact`` validates it; no payload byte is
  touched): producer, recipe, source identity, files and shards, bytes on disk split into
  plane, header and alignment-gap bytes, per-format totals with logical and physical bits per
  weight, and one :class:`TensorRow` per stored tensor (optionally filtered by a glob).
* :func:`tensor_details` adds, for one tensor, its full provenance and layout details (planes
  with offsets, sizes and digests; physical extents) and value statistics: min / max / mean of
  the dequantized values (NaN and infinities counted apart), the histogram of codes and the
  count of zero-scale groups (rows for FP8).  Values are decoded in row blocks, so memory stays
  near the tensor's stored words plus one block.
* :meth:`InspectReport.to_json` is the documented, stable JSON object of ``inspect --json``
  (``schema_version`` :data:`INSPECT_SCHEMA_VERSION`, docs/cli.md); fields are only ever added.

Bits per weight, per tensor and summed per format (spec Section 6.3 explains why the ideal
``b + 16/G`` is not the stored cost):

* logical: code bits of every element plus the scale bits of every logical group (16 per
  grouped group, 8 per NVFP4 block plus the 32-bit divisor, 16 per FP8 row);
* physical: 8 x the stored plane bytes, padding included, container gaps excluded.
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .container import Artifact, TensorInfo, check_artifact_path, open_artifact
from .container.wire import PRELUDE_SIZE
from .dequant import dequantize_logical
from .errors import UsageError
from .formats import FORMATS, Category, NumericFormat, lookup_format
from .layouts import LAYOUTS
from .layouts.base import ceil_div
from .layouts.blockscale import BlockscaleK16M128x4, unswizzle_scales
from .layouts.contiguous import ContiguousLE
from .layouts.row_scale import RowScale
from .layouts.row_split import RowSplitK128
from .logical import DirectWords, FP8RowWords, GroupedCodes, LogicalTensor, NVFP4Words

__all__ = [
    "INSPECT_SCHEMA_VERSION",
    "FormatTotals",
    "InspectReport",
    "PlaneDetails",
    "TensorDetails",
    "TensorRow",
    "ValueStats",
    "inspect_artifact",
    "logical_bits",
    "summarize",
    "tensor_details",
]

INSPECT_SCHEMA_VERSION = 1
"""Version of the ``inspect --json`` object; bumped only for an incompatible change."""

_BLOCK = 1 << 20
"""Elements decoded per block for value statistics: the float values of a block and the
masks and copies of the statistics stay near 16 MiB (at 4 M elements they took 80 MiB)."""


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

    @property
    def derivation(self) -> str:
        """Encoder profile, conversion and transforms in one short text ('-' when none)."""
        parts = [p for p in (self.encoder_profile, self.conversion) if p]
        if self.importance is not None:
            parts.append(f"importance {self.importance[:12]}")
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


# ---------------------------------------------------------------------------------------------
# Header-only summary


def _row(info: TensorInfo) -> TensorRow:
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
        _row(info)
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


# ---------------------------------------------------------------------------------------------
# One tensor's details (reads its values)


def _value_blocks(fmt: NumericFormat, t: LogicalTensor) -> Iterable[npt.NDArray[np.floating[Any]]]:
    if isinstance(t, DirectWords):
        flat = t.words.reshape(-1)
        for i in range(0, flat.size, _BLOCK):
            if fmt.name == "I32":  # binary64 holds every I32 value exactly; binary32 does not
                yield flat[i : i + _BLOCK].astype(np.float64)
            else:
                yield dequantize_logical(fmt, DirectWords(flat[i : i + _BLOCK]))
        return
    n, k = t.codes.shape
    rows = max(1, _BLOCK // max(k, 1))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        if isinstance(t, GroupedCodes):
            block: LogicalTensor = GroupedCodes(t.codes[r0:r1], t.scales[r0:r1])
        elif isinstance(t, NVFP4Words):
            block = NVFP4Words(t.codes[r0:r1], t.scales[r0:r1], t.divisor)
        else:
            assert isinstance(t, FP8RowWords)
            block = FP8RowWords(t.codes[r0:r1], t.scales[r0:r1])
        yield dequantize_logical(fmt, block)


def _histogram(t: LogicalTensor) -> dict[int, int] | None:
    if isinstance(t, DirectWords):
        return None
    if isinstance(t, GroupedCodes):
        counts = np.bincount(t.codes.reshape(-1).astype(np.int16) + 128, minlength=256)
        return {i - 128: int(c) for i, c in enumerate(counts) if c}
    counts = np.bincount(t.codes.reshape(-1), minlength=256)
    return {i: int(c) for i, c in enumerate(counts) if c}


def value_stats(fmt: NumericFormat, t: LogicalTensor) -> ValueStats:
    """Statistics of one logical tensor (see :class:`ValueStats`)."""
    return _stats(fmt, [t])


def _stats(fmt: NumericFormat, parts: Iterable[LogicalTensor]) -> ValueStats:
    """Statistics of a tensor given as consecutive row blocks (or whole, as one block)."""
    count = finite = nan = inf = 0
    lo, hi, total = math.inf, -math.inf, 0.0
    direct = True
    zero = groups = 0
    hist: dict[int, int] = {}
    for part in parts:
        for block in _value_blocks(fmt, part):
            v = block.reshape(-1)
            count += v.size
            is_nan = np.isnan(v)
            is_inf = np.isinf(v)
            nan += int(is_nan.sum())
            inf += int(is_inf.sum())
            ok = v[~(is_nan | is_inf)]
            finite += ok.size
            if ok.size:
                lo = min(lo, float(ok.min()))
                hi = max(hi, float(ok.max()))
                total += float(ok.sum(dtype=np.float64))
        if not isinstance(part, DirectWords):
            direct = False
            zero += int(np.count_nonzero(part.scales == 0))
            groups += int(part.scales.size)
            for code, c in (_histogram(part) or {}).items():
                hist[code] = hist.get(code, 0) + c
    return ValueStats(
        count=count,
        finite=finite,
        nan=nan,
        inf=inf,
        min=lo if finite else None,
        max=hi if finite else None,
        mean=total / finite if finite else None,
        code_histogram=None if direct else dict(sorted(hist.items())),
        zero_scale_groups=None if direct else zero,
        scale_groups=None if direct else groups,
    )


def _stored_blocks(art: Artifact, info: TensorInfo) -> Iterator[LogicalTensor]:
    """The stored tensor in row blocks of about :data:`_BLOCK` values, decoded one block at a
    time from the mapped planes (direct words as views of the mapping), so ``--tensor``
    holds a block, not the tensor (NVFP4's block scales, 1/16 of its codes, are unswizzled
    whole)."""
    layout = LAYOUTS[info.layout]
    if isinstance(layout, ContiguousLE):
        word = np.dtype(lookup_format(info.format).word_dtype).newbyteorder("<")
        view = art.plane_buffer(info.name, info.planes[0].name)
        try:
            flat = np.frombuffer(view, dtype=word)
            for i in range(0, flat.size, _BLOCK):
                yield DirectWords(flat[i : i + _BLOCK])
            del flat
        finally:
            view.release()
        return
    if isinstance(layout, RowSplitK128):
        n, k = int(info.shape[0]), int(info.shape[1])
        rows = max(1, _BLOCK // max(k, 1))
        for r0 in range(0, n, rows):
            yield art.read_rows(info.name, slice(r0, min(n, r0 + rows)))
        return
    if isinstance(layout, (RowScale, BlockscaleK16M128x4)):
        yield from _scaled_blocks(art, info, isinstance(layout, RowScale))
        return
    yield art.read(info.name)  # pragma: no cover - every layout is handled above


def _scaled_blocks(art: Artifact, info: TensorInfo, row_scaled: bool) -> Iterator[LogicalTensor]:
    """FP8-row or NVFP4 row blocks decoded from the mapped planes (see _stored_blocks)."""
    n, k = int(info.shape[0]), int(info.shape[1])
    rows = max(1, _BLOCK // max(k, 1))
    views = [art.plane_buffer(info.name, p.name) for p in info.planes]
    try:
        planes = [np.frombuffer(v, dtype=np.uint8) for v in views]
        if row_scaled:
            codes, scales = planes[0].reshape(n, k), planes[1].view("<u2")
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                yield FP8RowWords(codes[r0:r1], scales[r0:r1].astype(np.uint16))
        else:
            packed = planes[0].reshape(n, k // 2)
            block_scales = unswizzle_scales(planes[1], n, k // 16)
            divisor = int(planes[2].view("<u4")[0])
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                codes = np.empty((r1 - r0, k), dtype=np.uint8)
                codes[:, 0::2] = packed[r0:r1] & np.uint8(0xF)
                codes[:, 1::2] = packed[r0:r1] >> np.uint8(4)
                yield NVFP4Words(codes, block_scales[r0:r1], divisor)
        del planes
    finally:
        for v in views:
            v.release()


def tensor_details(art: Artifact, name: str) -> TensorDetails:
    """Provenance, layout and value statistics of one tensor; UsageError for an unknown name."""
    info = art.tensors.get(name)
    if info is None:
        import difflib

        close = difflib.get_close_matches(name, list(art.tensors), n=3)
        raise UsageError(
            f"no tensor {name!r} in this artifact ({len(art.tensors)} tensors)",
            path=str(art.path),
            hint=("did you mean " + ", ".join(repr(c) for c in close) + "?")
            if close
            else "list them with 'ninfer inspect ARTIFACT'",
        )
    fmt = lookup_format(info.format)
    layout = LAYOUTS[info.layout]
    specs = {s.name: s for s in layout.planes(info.format, info.shape)}
    planes = tuple(
        PlaneDetails(p.name, p.offset, p.nbytes, p.digest, specs[p.name].extents,
                     specs[p.name].word)
        for p in info.planes
    )  # fmt: skip
    needed = ceil_div(logical_bits(fmt, tuple(info.shape)), 8)
    return TensorDetails(
        row=_row(info),
        provenance=dict(info.provenance),
        planes=planes,
        padding_bytes=max(0, info.nbytes - needed),
        values=_stats(fmt, _stored_blocks(art, info)),
    )


def inspect_artifact(
    path: str | os.PathLike[str], *, filter: str | None = None, tensor: str | None = None
) -> InspectReport:
    """Open ``path``, summarise it (header only) and, with ``tensor``, add that tensor's
    details (which reads its values)."""
    p = check_artifact_path(path)
    with open_artifact(p) as art:
        report = summarize(art, filter=filter)
        if tensor is None:
            return report
        details = tensor_details(art, tensor)
    return InspectReport(**{**report.__dict__, "details": details})
