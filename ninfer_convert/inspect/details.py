"""One tensor's details for ``inspect --tensor``: layout, provenance and value statistics.

Contract: :func:`tensor_details` adds, for one tensor, its full provenance and layout details
(planes with offsets, sizes and digests; physical extents) and value statistics: min / max /
mean of the dequantized values (NaN and infinities counted apart), the histogram of codes and
the count of zero-scale groups (rows for FP8).  Values are decoded from the mapped planes in
row blocks of about :data:`_BLOCK` values, so memory stays near one block, not the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ..container import Artifact, TensorInfo
from ..dequant import dequantize_logical
from ..errors import UsageError
from ..formats import NumericFormat, lookup_format
from ..layouts import LAYOUTS
from ..layouts.base import ceil_div
from ..layouts.blockscale import BlockscaleK16M128x4, unswizzle_scales
from ..layouts.contiguous import ContiguousLE
from ..layouts.row_scale import RowScale
from ..layouts.row_split import RowSplitK128
from ..logical import DirectWords, FP8RowWords, GroupedCodes, LogicalTensor, NVFP4Words
from .report import PlaneDetails, TensorDetails, ValueStats
from .summary import logical_bits, tensor_row

__all__ = ["tensor_details", "value_stats"]

_BLOCK = 1 << 20
"""Elements decoded per block for value statistics: the float values of a block and the
masks and copies of the statistics stay near 16 MiB (at 4 M elements they took 80 MiB)."""


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
        row=tensor_row(info),
        provenance=dict(info.provenance),
        planes=planes,
        padding_bytes=max(0, info.nbytes - needed),
        values=_stats(fmt, _stored_blocks(art, info)),
    )
