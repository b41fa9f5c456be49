"""Bit-exact comparison of logical tensors, the oracle group sample, and error statistics.

Contract:

* :func:`compare_logical` compares an expected and a found logical tensor of one format field
  by field ('words'; 'codes', 'scales'; 'divisor') as unsigned words, so NaN payloads and signed
  zeros count, and returns one :class:`~.report.Mismatch` per differing field: the first
  differing word (row-major) with its row / group / column, and the total count.
* :func:`oracle_sample` picks ``count`` groups of a grouped tensor with a generator seeded from
  (``seed``, the tensor name), always including the last group of the last row (the partial
  group when K is not a multiple of G), re-encodes each from the binary32 source words with the
  bit-level oracle of spec Section 7 and compares it with the stored scale and codes.  The
  choice depends only on the seed, the name and the shape, never on thread scheduling.
* :func:`error_stats` streams over row blocks (bounded memory) and returns max |x - x_hat|,
  the RMS error and the SQNR in dB (binary32 blocks accumulated in binary64).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import xxhash

from ..dequant import dequantize_logical
from ..encoder.common import to_f32
from ..encoder.host import ErrorSums
from ..encoder.oracle import OracleFailure, encode_group_oracle
from ..formats import NumericFormat
from ..layouts.base import ceil_div
from ..logical import DirectWords, FP8RowWords, GroupedCodes, LogicalTensor, NVFP4Words
from ..words import f16_to_f32_words
from .report import Mismatch, TensorErrorStats

__all__ = ["BlockStats", "compare_logical", "error_stats", "oracle_sample", "sample_groups"]

_STATS_BLOCK = 1 << 18
"""Elements per block of the error statistics (1 MiB of float32 per temporary: in cache)."""


def _unsigned(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    """The same bits as an unsigned integer array (NaN payloads and -0 compare exactly)."""
    arr = np.ascontiguousarray(a)
    kind = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[arr.dtype.itemsize]
    return arr.view(kind)


def _text(value: int, width: int, signed: bool) -> str:
    if signed:
        return f"{value:+d} (0x{value & ((1 << (8 * width)) - 1):0{2 * width}x})"
    return f"0x{value:0{2 * width}x}"


def _field_mismatch(
    tensor: str,
    plane: str,
    expected: npt.NDArray[np.generic],
    found: npt.NDArray[np.generic],
    *,
    group_size: int | None = None,
    group_axis_is_column: bool = False,
    signed: bool = False,
) -> Mismatch | None:
    if expected.shape != found.shape or expected.dtype.itemsize != found.dtype.itemsize:
        return Mismatch(
            tensor,
            plane,
            (),
            None,
            None,
            None,
            0,
            0,
            f"{expected.dtype} {list(expected.shape)}",
            f"{found.dtype} {list(found.shape)}",
            int(expected.size),
            int(expected.size),
        )
    diff = _unsigned(expected) != _unsigned(found)
    count = int(np.count_nonzero(diff))
    if not count:
        return None
    flat = int(np.argmax(diff.reshape(-1)))
    index = tuple(int(i) for i in np.unravel_index(flat, diff.shape)) if diff.ndim else ()
    width = expected.dtype.itemsize
    e = int(expected[index])
    f = int(found[index])
    row = column = group = None
    if len(index) == 2:
        row = index[0]
        if group_axis_is_column:
            group = index[1]
        else:
            column = index[1]
            if group_size is not None:
                group = index[1] // group_size
    elif len(index) == 1 and plane in ("scales", "codes") and group_size is None:
        row = index[0]
    return Mismatch(
        tensor=tensor,
        plane=plane,
        index=index,
        row=row,
        group=group,
        column=column,
        expected=e,
        found=f,
        expected_text=_text(e, width, signed),
        found_text=_text(f, width, signed),
        count=count,
        total=int(diff.size),
    )


def compare_logical(
    fmt: NumericFormat, tensor: str, expected: LogicalTensor, found: LogicalTensor
) -> list[Mismatch]:
    """Every differing field of ``found`` against ``expected`` (see the module contract)."""
    if type(expected) is not type(found):
        return [
            Mismatch(
                tensor, "representation", (), None, None, None, 0, 0,
                type(expected).__name__, type(found).__name__, 1, 1,
            )
        ]  # fmt: skip
    out: list[Mismatch | None] = []
    if isinstance(expected, DirectWords) and isinstance(found, DirectWords):
        out.append(_field_mismatch(tensor, "words", expected.words, found.words))
    elif isinstance(expected, GroupedCodes) and isinstance(found, GroupedCodes):
        out.append(
            _field_mismatch(
                tensor, "codes", expected.codes, found.codes, group_size=fmt.group_size, signed=True
            )
        )
        out.append(
            _field_mismatch(
                tensor, "scales", expected.scales, found.scales, group_axis_is_column=True
            )
        )
    elif isinstance(expected, NVFP4Words) and isinstance(found, NVFP4Words):
        out.append(_field_mismatch(tensor, "codes", expected.codes, found.codes, group_size=16))
        out.append(
            _field_mismatch(
                tensor, "scales", expected.scales, found.scales, group_axis_is_column=True
            )
        )
        if (expected.divisor & 0xFFFFFFFF) != (found.divisor & 0xFFFFFFFF):
            e, f = expected.divisor & 0xFFFFFFFF, found.divisor & 0xFFFFFFFF
            out.append(
                Mismatch(
                    tensor, "divisor", (), None, None, None, e, f,
                    f"0x{e:08x}", f"0x{f:08x}", 1, 1,
                )
            )  # fmt: skip
    elif isinstance(expected, FP8RowWords) and isinstance(found, FP8RowWords):
        out.append(_field_mismatch(tensor, "codes", expected.codes, found.codes))
        out.append(_field_mismatch(tensor, "scales", expected.scales, found.scales))
    return [m for m in out if m is not None]


def sample_groups(
    tensor: str, n_rows: int, n_groups: int, count: int, seed: int
) -> list[tuple[int, int]]:
    """Deterministic, distinct (row, group) pairs: the last group of the last row first."""
    total = n_rows * n_groups
    if total == 0 or count <= 0:
        return []
    name_key = xxhash.xxh64_intdigest(tensor.encode("utf-8"))
    rng = np.random.default_rng([seed & 0xFFFFFFFF, name_key & 0xFFFFFFFF, name_key >> 32])
    last = total - 1
    picks = [last]
    if count > 1 and total > 1:
        extra = min(count - 1, total - 1)
        # Sampling without replacement from [0, last) keeps memory O(count) for huge tensors.
        chosen: set[int] = set()
        while len(chosen) < extra:
            for v in rng.integers(0, last, size=extra - len(chosen)):
                chosen.add(int(v))
        picks += sorted(chosen)
    return [(p // n_groups, p % n_groups) for p in picks]


def oracle_sample(
    fmt: NumericFormat,
    tensor: str,
    source_words: npt.NDArray[np.generic],
    source_dtype: str,
    found: GroupedCodes | Callable[[list[int]], GroupedCodes],
    count: int,
    seed: int,
    shape: tuple[int, int] | None = None,
    group_encoder: Callable[..., tuple[int, list[int]]] = encode_group_oracle,
    weights: npt.NDArray[np.uint32] | None = None,
) -> tuple[int, list[Mismatch]]:
    """Re-encode sampled groups with the Section 7 oracle; (groups checked, mismatches).

    ``group_encoder`` is the exact reference of the tensor's encoder profile (the Section 7
    oracle, or :func:`~..encoder.mse_reference.encode_group_mse_reference`); with ``weights``
    (the tensor's [K] importance words, MSE_F16_SEARCH_IW_V1) it is also given the group's
    slice of them.

    ``source_words`` are the encoder's input words [N, K] of ``source_dtype`` (BF16, F16 or
    F32); each sampled group is widened exactly to binary32 before the oracle sees it.

    A group the oracle refuses (non-finite value, overflowing scale) is reported as a mismatch
    of plane 'scales' with expected text 'encoder refuses this group'.

    ``found`` is the stored tensor, or a function returning the stored rows it is given (e.g.
    ``Artifact.read_rows``) together with ``shape``, so only the sampled rows are decoded.
    """
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    if isinstance(found, GroupedCodes):
        n_rows, k = found.codes.shape
    else:
        assert shape is not None
        n_rows, k = shape
    n_groups = ceil_div(k, g)
    mismatches: list[Mismatch] = []
    picks = sample_groups(tensor, n_rows, n_groups, count, seed)
    wanted = sorted({row for row, _ in picks})
    if isinstance(found, GroupedCodes):
        stored_rows = GroupedCodes(found.codes[wanted], found.scales[wanted])
    else:
        stored_rows = found(wanted)
    position = {row: i for i, row in enumerate(wanted)}
    for row, group in picks:
        lo, hi = group * g, min(k, (group + 1) * g)
        x = to_f32(np.ascontiguousarray(source_words[row : row + 1, lo:hi]), source_dtype)
        x_words = [int(w) for w in x.view(np.uint32).reshape(-1)]
        w = None if weights is None else [int(v) for v in weights[lo:hi]]
        mismatches += _group_mismatches(
            fmt, tensor, (row, group), (lo, hi), x_words, w, group_encoder,
            int(stored_rows.scales[position[row], group]), stored_rows.codes[position[row], lo:hi],
            len(picks),
        )  # fmt: skip
    mismatches.sort(key=lambda m: (m.row or 0, m.group or 0, m.plane))
    return len(picks), mismatches


def oracle_sample_rows(
    fmt: NumericFormat,
    tensor: str,
    source_words: npt.NDArray[np.generic],
    source_dtype: str,
    found: GroupedCodes | Callable[[list[int]], GroupedCodes],
    count: int,
    seed: int,
    weights: npt.NDArray[np.uint32],
    factor: npt.NDArray[np.uint32],
    shape: tuple[int, int] | None = None,
) -> tuple[int, list[Mismatch]]:
    """GPTQ_F16_SEARCH_IW_V1's oracle sample: whole sampled ROWS re-encoded with the exact
    reference (:func:`~..encoder.gptq_reference.encode_compensated_reference`; a row is the
    unit, since its columns depend on each other); (groups checked, mismatches).  ``count``
    groups ask for ``ceil(count / groups per row)`` rows (at least one), drawn as
    :func:`sample_groups` draws (the last row first); every group of a sampled row is compared
    as :func:`oracle_sample` compares one.  A refused row is a mismatch of plane 'scales' at
    the group of its refused column ('encoder refuses this group')."""
    from ..encoder.gptq_reference import CompensationFailure, encode_compensated_reference

    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    if isinstance(found, GroupedCodes):
        n_rows, k = found.codes.shape
    else:
        assert shape is not None
        n_rows, k = shape
    n_groups = ceil_div(k, g)
    want = max(1, ceil_div(count, n_groups)) if count > 0 else 0
    rows = sorted({r for r, _ in sample_groups(tensor, n_rows, 1, want, seed)})
    if not rows:
        return 0, []
    stored_rows = (
        GroupedCodes(found.codes[rows], found.scales[rows])
        if isinstance(found, GroupedCodes)
        else found(rows)
    )
    picked = len(rows) * n_groups
    mismatches: list[Mismatch] = []
    for i, row in enumerate(rows):
        x = to_f32(np.ascontiguousarray(source_words[row : row + 1]), source_dtype)
        try:
            codes, scales = encode_compensated_reference(
                x.view(np.uint32), factor, g, fmt.qmin, fmt.qmax, weights=weights
            )
        except CompensationFailure as exc:
            group = exc.column // g
            stored_scale = int(stored_rows.scales[i, group])
            mismatches.append(
                Mismatch(
                    tensor, "scales", (row, group), row, group, None, -1, stored_scale,
                    "encoder refuses this group", f"0x{stored_scale:04x}", 1, picked,
                )
            )  # fmt: skip
            continue
        for group in range(n_groups):
            lo, hi = group * g, min(k, (group + 1) * g)
            want_scale, want_codes = int(scales[0, group]), [int(c) for c in codes[0, lo:hi]]
            mismatches += _group_mismatches(
                fmt, tensor, (row, group), (lo, hi), [], None,
                lambda _x, _qmin, _qmax, s=want_scale, c=want_codes: (s, c),
                int(stored_rows.scales[i, group]), stored_rows.codes[i, lo:hi], picked,
            )  # fmt: skip
    mismatches.sort(key=lambda m: (m.row or 0, m.group or 0, m.plane))
    return picked, mismatches


def _group_mismatches(
    fmt: NumericFormat,
    tensor: str,
    at: tuple[int, int],
    columns: tuple[int, int],
    x_words: list[int],
    weights: list[int] | None,
    group_encoder: Callable[..., tuple[int, list[int]]],
    stored_scale: int,
    stored_codes: npt.NDArray[np.int8],
    picked: int,
) -> list[Mismatch]:
    """The sampled group ``at`` = (row, group), ``columns`` [lo, hi), re-encoded from its
    binary32 words against its stored scale and codes: its scale and codes mismatches, or the
    refusal."""
    assert fmt.qmin is not None and fmt.qmax is not None
    (row, group), (lo, hi) = at, columns
    try:
        if weights is None:
            scale, codes = group_encoder(x_words, fmt.qmin, fmt.qmax)
        else:
            scale, codes = group_encoder(x_words, fmt.qmin, fmt.qmax, weights)
    except OracleFailure:
        return [
            Mismatch(
                tensor, "scales", (row, group), row, group, None, -1, stored_scale,
                "encoder refuses this group", f"0x{stored_scale:04x}", 1, picked,
            )
        ]  # fmt: skip
    out: list[Mismatch] = []
    if stored_scale != scale:
        out.append(
            Mismatch(
                tensor, "scales", (row, group), row, group, None, scale, stored_scale,
                f"0x{scale:04x}", f"0x{stored_scale:04x}", 1, picked,
            )
        )  # fmt: skip
    stored = stored_codes.astype(np.int64)
    expect = np.asarray(codes, dtype=np.int64)
    diff = np.flatnonzero(stored != expect)
    if diff.size:
        col = lo + int(diff[0])
        e, f = int(expect[diff[0]]), int(stored[diff[0]])
        out.append(
            Mismatch(
                tensor, "codes", (row, col), row, group, col, e, f,
                _text(e, 1, True), _text(f, 1, True), int(diff.size), hi - lo,
            )
        )  # fmt: skip
    return out


def error_stats(
    fmt: NumericFormat,
    tensor: str,
    source_words: npt.NDArray[np.generic],
    source_dtype: str,
    found: LogicalTensor,
) -> TensorErrorStats:
    """Max abs error, RMS error and SQNR of ``found`` against the source values (row blocks).

    ``source_words`` [N, K] of ``source_dtype`` (BF16, F16, F32) are widened exactly to
    binary32 one block of about :data:`_STATS_BLOCK` elements at a time.  Per block, the error
    ``x - x_hat`` is a binary32 subtraction (exact whenever x_hat lies within a factor of two of
    x, by Sterbenz's lemma, and otherwise correctly rounded) and the sums of squares are binary32
    dot products; the blocks are accumulated in binary64.  These are statistics, not checks: a
    relative error of about 1e-6 in the sums is immaterial, and it is what keeps this pass as
    fast as the encoder.
    """
    shape = source_words.shape
    numel = int(source_words.size)
    if isinstance(found, DirectWords) or len(shape) != 2 or numel == 0:
        x_hat = dequantize_logical(fmt, found).reshape(-1)
        x = to_f32(source_words, source_dtype).reshape(-1)
        return _finish(fmt, tensor, numel, *_accumulate(x, x_hat))
    n, k = shape
    rows = max(1, _STATS_BLOCK // max(k, 1))
    max_err = 0.0
    sum_e2 = 0.0
    sum_x2 = 0.0
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        x_hat = _dequantize_block(fmt, found, r0, r1)
        x = to_f32(np.ascontiguousarray(source_words[r0:r1]), source_dtype).reshape(-1)
        m, e2, x2 = _accumulate(x, x_hat)
        max_err = m if math.isnan(m) or math.isnan(max_err) else max(max_err, m)
        sum_e2 += e2
        sum_x2 += x2
    return _finish(fmt, tensor, numel, max_err, sum_e2, sum_x2)


class BlockStats:
    """Error statistics accumulated from encoded row blocks (a ``derive.fused.BlockHook``).

    Blocks may arrive from several threads in any order; each block's sums are kept by its
    first row and added in row order at the end, so the result does not depend on scheduling.
    """

    def __init__(self, fmt: NumericFormat, tensor: str, source_dtype: str) -> None:
        self.fmt, self.tensor, self.dtype = fmt, tensor, source_dtype
        self.parts: dict[int, tuple[float, float, float, int]] = {}

    def __call__(
        self,
        r0: int,
        r1: int,
        words: npt.NDArray[np.generic],
        codes: npt.NDArray[np.int8],
        scales: npt.NDArray[np.uint16],
        sums: ErrorSums | None,
    ) -> None:
        if sums is None:  # the numpy kernel ran: the same sums with numpy passes
            x_hat = _dequantize_block(self.fmt, GroupedCodes(codes, scales), 0, r1 - r0)
            x = to_f32(np.ascontiguousarray(words), self.dtype).reshape(-1)
            sums = _accumulate(x, x_hat)
        self.parts[r0] = (*sums, int(words.size))

    def finish(self) -> TensorErrorStats:
        max_err, sum_e2, sum_x2, numel = 0.0, 0.0, 0.0, 0
        for r0 in sorted(self.parts):
            m, e2, x2, n = self.parts[r0]
            max_err = m if math.isnan(m) or math.isnan(max_err) else max(max_err, m)
            sum_e2 += e2
            sum_x2 += x2
            numel += n
        return _finish(self.fmt, self.tensor, numel, max_err, sum_e2, sum_x2)


def _dequantize_block(
    fmt: NumericFormat, t: LogicalTensor, r0: int, r1: int
) -> npt.NDArray[np.float32]:
    """Rows r0..r1 of the represented values, flattened.  For grouped tensors with K a multiple
    of G this broadcasts the scales instead of repeating them; the products are the same single
    binary32 multiplications as :func:`~ninfer_convert.dequant.dequantize_grouped`."""
    if isinstance(t, GroupedCodes) and fmt.group_size is not None:
        g = fmt.group_size
        codes = t.codes[r0:r1]
        k = codes.shape[1]
        if k % g == 0:
            s32 = f16_to_f32_words(np.ascontiguousarray(t.scales[r0:r1])).view(np.float32)
            q = codes.reshape(r1 - r0, k // g, g)
            # One pass: the int8 -> binary32 cast is exact and happens inside the multiply.
            return np.multiply(q, s32[:, :, None], dtype=np.float32).reshape(-1)
    if isinstance(t, GroupedCodes):
        block: LogicalTensor = GroupedCodes(t.codes[r0:r1], t.scales[r0:r1])
    elif isinstance(t, NVFP4Words):
        block = NVFP4Words(t.codes[r0:r1], t.scales[r0:r1], t.divisor)
    elif isinstance(t, FP8RowWords):
        block = FP8RowWords(t.codes[r0:r1], t.scales[r0:r1])
    else:
        block = t
    return dequantize_logical(fmt, block).reshape(-1)


def _accumulate(
    x: npt.NDArray[np.float32], x_hat: npt.NDArray[np.float32]
) -> tuple[float, float, float]:
    """(max |x - x_hat|, sum (x - x_hat)^2, sum x^2) of one block; NaN when a value is NaN.

    The error is the binary32 difference (what the C kernel computes); the squares are taken
    in binary64, where they are exact and cannot underflow, as in the kernel."""
    if not x.size:
        return 0.0, 0.0, 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.subtract(x, x_hat, dtype=np.float32)
        lo, hi = float(e.min()), float(e.max())
        max_err = math.nan if math.isnan(lo) or math.isnan(hi) else max(hi, -lo)
        e64, x64 = e.astype(np.float64), x.astype(np.float64)
        return max_err, float(np.dot(e64, e64)), float(np.dot(x64, x64))


def _finish(
    fmt: NumericFormat, tensor: str, numel: int, max_err: float, sum_e2: float, sum_x2: float
) -> TensorErrorStats:
    rms = math.sqrt(sum_e2 / numel) if numel and math.isfinite(sum_e2) else math.nan
    exact = max_err == 0.0  # the maximum is exact; sums of squares are rounded
    sqnr: float | None
    if exact or sum_e2 == 0.0 or sum_x2 == 0.0 or not math.isfinite(sum_e2):
        sqnr = None
    else:
        sqnr = 10.0 * math.log10(sum_x2 / sum_e2)
    return TensorErrorStats(
        tensor=tensor,
        format=fmt.name,
        numel=numel,
        max_abs_error=max_err,
        rms_error=rms if numel else 0.0,
        sqnr_db=sqnr,
        exact=exact,
    )
