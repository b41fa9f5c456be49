"""Materialisation: read one plan entry's source tensors and produce what gets stored.

Contract: :func:`materialize` reads exactly the entry's source tensors (one entry at a time;
memory follows that entry), checks they still match the plan, applies the recorded transforms
(concat, transpose, reshape) and the recorded conversion, checks constraints, and returns a
:class:`Materialized` whose ``value`` is either

* a ready :class:`~ninfer_convert.logical.LogicalTensor` for direct formats and the NVFP4 /
  FP8-row copy paths, with every validity rule of spec Sections 3.1, 3.3 and 3.4 checked, or
* an :class:`EncodeInput` (2-D source words plus their dtype) for grouped formats; the convert
  pipeline calls the encoder, not this module.

The streaming forms produce the same words without holding the tensor: :func:`stream_direct`
(direct formats: copies, conversions, derivations) and :func:`stream_copy` (the NVFP4 and
FP8-row copy paths) yield blocks of the stored bytes, and a derived grouped input is a
:class:`DerivedWords` that derives the row blocks the encoder asks for (a transpose in strips
of output rows read from the mapped source).  Tests compare them with :func:`materialize`
for block sizes that do not divide the tensor; their errors are the same, in the same order.

Rules enforced here (spec Sections 3.1, 3.3, 3.4, 9):

* Same source type as the direct format: the words are copied bitwise (NaN payloads, -0.0).
  A different type only through the entry's named conversion (:mod:`.tables`).  Rounding
  conversions refuse non-finite sources unless ``keep_nonfinite``, and always refuse a finite
  value that would round to infinity.
* ``finite-only`` and every grouped format refuse a non-finite value, naming the tensor and the
  row and column (index, for other ranks) of the first one in the output's logical coordinates.
* Copy paths never requantize: the NVFP4 and FP8-row entries are read by their copy path
  object (:mod:`.copy_paths`, which holds those rules and checks them through
  :mod:`ninfer_convert.validate`).  Every refusal is an
  :class:`~ninfer_convert.errors.EncodeError` that explains why.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError, SourceError
from ..formats import lookup_format
from ..logical import DirectWords, LogicalTensor
from ..native import optional_module
from ..source import SourceArray, SourceCheckpoint
from ..words import bf16_to_f32_words, f16_to_f32_words, f32_to_bf16_rne, first_index, int_to_i32
from .copy_paths import COPY_PATHS, PlaneBlocks
from .plan import PlanEntry
from .tables import DIRECT_SAME_SOURCE, FINITE_ONLY, GROUPED_SOURCES

__all__ = [
    "BLOCK_ELEMENTS",
    "DerivedWords",
    "DirectStream",
    "EncodeInput",
    "Materialized",
    "PlaneBlocks",
    "materialize",
    "nonfinite_mask",
    "stream_copy",
    "stream_direct",
    "streams_directly",
]

BLOCK_ELEMENTS = 1 << 18
"""Output words per block of a streamed direct entry (a derivation, a conversion, a copy):
1 MiB of F32 source, so a block and the conversion's temporaries stay within a few MiB."""

GroupedSource = Literal["BF16", "F16", "F32"]

_native: Any = optional_module("_hostkernel")  # None when the build skipped it
_NATIVE_OPS = {"f16-to-f32": 0, "bf16-to-f32": 1, "f32-to-bf16-rne": 2, "f16-to-bf16-rne": 3}
"""Conversions the C kernel runs on streamed blocks (``convert_words``; words.py is the
reference, tests compare every binary16 and BF16 word); integers stay in numpy."""


@dataclass(frozen=True, eq=False)
class EncodeInput:
    """Source words of a grouped-format entry, ready for the encoder.

    ``words`` is 2-D [N, K] (uint16 for BF16/F16, uint32 for F32): a C-contiguous, read-only
    view of the source file, or, for a derived entry (concat, transpose), a
    :class:`DerivedWords` that derives the rows asked for, so no path builds the whole derived
    tensor.  Finiteness is checked by the encoder, block by block."""

    words: npt.NDArray[np.generic] | DerivedWords
    source_dtype: GroupedSource


@dataclass(frozen=True, eq=False)
class Materialized:
    entry: PlanEntry
    value: LogicalTensor | EncodeInput
    source_digests: Mapping[str, str]
    """Source tensor name -> ``"xxh3-128:<hex>"`` of its raw bytes, computed while reading."""

    @property
    def output(self) -> str:
        return self.entry.output

    @property
    def needs_encoding(self) -> bool:
        return isinstance(self.value, EncodeInput)


# Non-finite words: exponent field all ones (spec Section 3.1 value classes).
_EXP_MASK = {"BF16": 0x7F80, "F16": 0x7C00, "F32": 0x7F800000, "FP32": 0x7F800000}


def nonfinite_mask(words: npt.NDArray[np.generic], dtype: str) -> npt.NDArray[np.bool_]:
    """True where a BF16/F16/F32 word (``dtype``: safetensors or format name) is inf or NaN."""
    w = np.asarray(words)
    mask = w.dtype.type(_EXP_MASK[dtype])  # at the words' own width: no widened copy
    return np.asarray((w & mask) == mask)


def _at(idx: tuple[int, ...]) -> str:
    if len(idx) == 2:
        return f"row {idx[0]}, column {idx[1]}"
    if len(idx) == 1:
        return f"index {idx[0]}"
    return f"index {list(idx)}"


def _f32(word: int) -> float:
    return float(np.array([word], dtype=np.uint32).view(np.float32)[0])


def _check_finite(
    entry: PlanEntry,
    words: npt.NDArray[np.generic],
    dtype: str,
    why: str,
    hint: str,
    where: tuple[int, tuple[int, ...]] | None = None,
) -> None:
    """Refuse the first non-finite word; ``where`` = (flat index of ``words[0]``, the whole
    tensor's shape) when ``words`` is a flat block of a larger tensor."""
    bad = nonfinite_mask(words, dtype)
    if bad.any():
        local = first_index(bad)
        word = int(words[local])
        idx, shape = _locate(local, words.shape, where)
        kind = (
            "NaN"
            if (word & ~_EXP_MASK[dtype] & (0x7FFFFF if dtype in ("F32", "FP32") else 0x7FFF))
            else "infinity"
        )
        raise EncodeError(
            f"non-finite value ({kind}, {dtype} word 0x{word:0{words.dtype.itemsize * 2}x}) at "
            f"{_at(idx)} of shape {list(shape)}; {why}",
            tensor=entry.output,
            rule=f"at line {entry.rule.line}",
            hint=hint,
        )


def _locate(
    local: tuple[int, ...], shape: tuple[int, ...], where: tuple[int, tuple[int, ...]] | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(index in the whole tensor, its shape) of ``local`` in a block (see _check_finite)."""
    if where is None:
        return local, shape
    start, whole = where
    flat = start + int(np.ravel_multi_index(local, shape)) if shape else start
    return tuple(int(i) for i in np.unravel_index(flat, whole)) if whole else (), whole


def materialize(entry: PlanEntry, source: SourceCheckpoint) -> Materialized:
    """Read, derive, convert and check one entry (see the module contract)."""
    arrays = [_read(entry, source, s.name, s.dtype, s.shape) for s in entry.sources]
    digests = {a.name: a.digest for a in arrays}
    fmt = lookup_format(entry.format)
    value: LogicalTensor | EncodeInput
    if entry.copy is not None:
        parts: dict[str, SourceArray] = {
            s.field: a for s, a in zip(entry.sources, arrays, strict=True)
        }
        value = COPY_PATHS[entry.copy].logical(entry, parts)
        return Materialized(entry, value, digests)

    dtype = entry.source_dtype
    if fmt.is_grouped:
        node = _derivation(entry, arrays)
        if dtype not in GROUPED_SOURCES or len(node.shape) != 2:
            raise SourceError(
                f"plan entry does not fit {fmt.name} ({dtype} {list(node.shape)})",
                tensor=entry.output,
            )
        # Non-finite values are refused by the canonical encoder itself, block by block, with
        # the row, column and group (spec Section 7); checking here too would cost a
        # full-tensor pass and a mask as large as the tensor.
        grouped: GroupedSource = dtype  # type: ignore[assignment]
        mapped = node.mapped()
        words: npt.NDArray[np.generic] | DerivedWords = (
            np.ascontiguousarray(mapped) if mapped is not None else DerivedWords(node)
        )
        return Materialized(entry, EncodeInput(words, grouped), digests)

    out = _convert(entry, _derive(entry, arrays), dtype, fmt.name)
    if FINITE_ONLY in entry.constraints and fmt.name in ("BF16", "FP32"):
        _check_finite(
            entry,
            out,
            fmt.name,
            "the recipe requires finite values only (finite-only)",
            "fix the source checkpoint, or drop the finite-only constraint",
        )
    # np.require keeps 0-d tensors 0-d (np.ascontiguousarray would make them 1-d).
    return Materialized(entry, DirectWords(np.require(out, requirements="C")), digests)


# ---------------------------------------------------------------------------------------------


def _read(
    entry: PlanEntry, source: SourceCheckpoint, name: str, dtype: str, shape: tuple[int, ...]
) -> SourceArray:
    info = source.tensors.get(name)
    if info is None or info.dtype != dtype or info.shape != shape:
        now = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
        raise SourceError(
            f"source tensor {name!r} was {dtype} {list(shape)} when planned, now {now}",
            tensor=entry.output,
            hint="the source changed after planning; plan again",
        )
    return source.read(name)


def _derive(entry: PlanEntry, arrays: list[SourceArray]) -> npt.NDArray[np.generic]:
    """The whole derived tensor (a view of the source when no copy is needed)."""
    node = _derivation(entry, arrays)
    mapped = node.mapped()
    if mapped is not None:
        return mapped
    return node.flat(0, node.size).reshape(node.shape)


# ---------------------------------------------------------------------------------------------
# Derivation in blocks: every node yields any flat range of its row-major words, so a derived
# tensor is produced block by block and never held whole.


class _Node:
    shape: tuple[int, ...]
    dtype: np.dtype[np.generic]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        """Words [a, b) of the row-major order, 1-D and C-contiguous (a view when possible)."""
        raise NotImplementedError

    def mapped(self) -> npt.NDArray[np.generic] | None:
        """The whole tensor as a view of the mapped source, when it is one."""
        return None


class _Source(_Node):
    def __init__(self, words: npt.NDArray[np.generic]) -> None:
        self.words, self.shape, self.dtype = words, tuple(words.shape), words.dtype

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        return self.words.reshape(-1)[a:b]

    def mapped(self) -> npt.NDArray[np.generic] | None:
        return self.words


class _Reshape(_Node):
    def __init__(self, child: _Node, shape: tuple[int, ...]) -> None:
        self.child, self.shape, self.dtype = child, shape, child.dtype

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        return self.child.flat(a, b)  # row-major reshape keeps the word order

    def mapped(self) -> npt.NDArray[np.generic] | None:
        m = self.child.mapped()
        return None if m is None else m.reshape(self.shape)


class _Concat(_Node):
    def __init__(self, parts: list[_Node], axis: int) -> None:
        first = parts[0].shape
        self.parts, self.dtype = parts, parts[0].dtype
        self.axis = axis % len(first) if first else 0
        self.shape = (
            *first[: self.axis],
            sum(p.shape[self.axis] for p in parts),
            *first[self.axis + 1 :],
        )
        # Rows of the concatenation: the dimensions before the axis; each part contributes
        # a run of ``width`` consecutive words to every row.
        self.widths = [math.prod(p.shape[self.axis :]) for p in parts]
        self.row = sum(self.widths)

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        if b <= a or self.row == 0:
            return np.empty(0, dtype=self.dtype)
        # Only the words of [a, b): the partial rows at either end piece by piece, the whole
        # rows between them part by part.  A row can be far larger than a block (along axis 0
        # it is the whole tensor), so a block never reads whole rows it only touches.
        row = self.row
        r0, r1 = -(-a // row), b // row  # whole rows [r0, r1)
        pieces: list[npt.NDArray[np.generic]] = []
        if r1 < r0:  # inside one row
            self._partial(pieces, a // row, a % row, a % row + (b - a))
        else:
            if a % row:
                self._partial(pieces, r0 - 1, a % row, row)
            if r1 > r0:
                whole = [
                    p.flat(r0 * w, r1 * w).reshape(r1 - r0, w)
                    for p, w in zip(self.parts, self.widths, strict=True)
                ]
                pieces.append(np.concatenate(whole, axis=1).reshape(-1))
            if b % row:
                self._partial(pieces, r1, 0, b % row)
        if len(pieces) == 1:
            return np.ascontiguousarray(pieces[0])
        return np.concatenate(pieces)

    def _partial(self, pieces: list[npt.NDArray[np.generic]], r: int, lo: int, hi: int) -> None:
        """Append words [lo, hi) of row ``r`` (offsets within the row)."""
        start = 0
        for p, w in zip(self.parts, self.widths, strict=True):
            s, e = max(lo, start), min(hi, start + w)
            if s < e:
                pieces.append(p.flat(r * w + s - start, r * w + e - start))
            start += w


class _ConcatTiles:
    """A rank-two concatenation of mapped parts read as ``[i0:i1, c0:c1]`` tiles, each copied
    from the parts' rows and columns it covers only (a transpose of a concat then reads strips
    the way it reads a mapped source, instead of building the concatenation whole)."""

    ndim = 2

    def __init__(
        self, parts: list[npt.NDArray[np.generic]], axis: int, shape: tuple[int, ...]
    ) -> None:
        self.parts, self.axis, self.shape = parts, axis, shape

    def __getitem__(self, key: tuple[slice, slice]) -> npt.NDArray[np.generic]:
        rows, cols = key
        span = (rows, cols)[self.axis].indices(self.shape[self.axis])[:2]
        pieces, start = [], 0
        for part in self.parts:
            n = part.shape[self.axis]
            lo, hi = max(span[0], start) - start, min(span[1], start + n) - start
            if lo < hi:
                cut = slice(lo, hi)
                pieces.append(part[cut, cols] if self.axis == 0 else part[rows, cut])
            start += n
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:  # pragma: no cover - strips ask for non-empty tiles
            return np.empty((0, 0), dtype=self.parts[0].dtype)
        return np.concatenate(pieces, axis=self.axis)


TRANSPOSE_TILE = 1024
"""Source rows per tile of a transposed strip: a tile of 1024 source rows x 64 columns of F32
(256 KiB) stays in L2 while numpy transposes it, where a whole strip of a [65536, K] source
(its columns 8 KiB apart) did not: 0.07 GB/s before tiling."""
TRANSPOSE_STRIP = 64
"""Output rows (source columns) per strip at least: each source row then gives the strip
64 adjacent words (two cache lines of BF16)."""


class _Transpose(_Node):
    """Rank two: output row i is source column i.  Strips of at least
    :data:`TRANSPOSE_STRIP` output rows are copied from the mapped source (or the mapped parts
    of a concat, :class:`_ConcatTiles`) in cache-sized tiles (:data:`TRANSPOSE_TILE` source
    rows) and kept per thread for the next request, since the encoder asks for consecutive row
    blocks smaller than a strip."""

    def __init__(self, child: _Node) -> None:
        self.child, self.dtype = child, child.dtype
        self.shape = tuple(reversed(child.shape))
        self._whole: npt.NDArray[np.generic] | None = None
        self._cache = threading.local()

    def _source(self) -> npt.NDArray[np.generic] | _ConcatTiles:
        m = self.child.mapped()
        if m is not None:
            return m
        child = self.child
        if isinstance(child, _Concat) and len(child.shape) == 2:
            parts = [p.mapped() for p in child.parts]
            if all(p is not None for p in parts):  # tiles read from the mapped parts
                return _ConcatTiles(parts, child.axis, child.shape)  # type: ignore[arg-type]
        if self._whole is None:  # no mapped source to read strips of (e.g. a double transpose)
            self._whole = self.child.flat(0, self.child.size).reshape(self.child.shape)
        return self._whole

    def _strip(
        self, src: npt.NDArray[np.generic] | _ConcatTiles, r0: int, r1: int
    ) -> tuple[int, npt.NDArray[np.generic]]:
        """(first output row, strip) holding output rows [r0, r1)."""
        cached = getattr(self._cache, "strip", None)
        if cached is not None and cached[0] <= r0 and r1 <= cached[0] + cached[1].shape[0]:
            return cached  # type: ignore[no-any-return]
        rows = src.shape[0]
        # At least the rows asked for; up to TRANSPOSE_STRIP while the strip stays <= 8 MiB.
        width = min(TRANSPOSE_STRIP, max(1, (8 << 20) // max(1, rows * self.dtype.itemsize)))
        end = min(self.shape[0], max(r1, r0 + width))
        strip = np.empty((end - r0, rows), dtype=self.dtype)
        for i0 in range(0, rows, TRANSPOSE_TILE):
            i1 = min(rows, i0 + TRANSPOSE_TILE)
            strip[:, i0:i1] = src[i0:i1, r0:end].T
        self._cache.strip = (r0, strip)
        return r0, strip

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        src = self._source()
        if isinstance(src, np.ndarray) and src.ndim != 2:
            whole = np.ascontiguousarray(src.T).reshape(-1)
            return whole[a:b]
        n = self.shape[1]
        if b <= a or n == 0:
            return np.empty(0, dtype=self.dtype)
        r0, r1 = a // n, -(-b // n)
        first, strip = self._strip(src, r0, r1)
        flat = strip[r0 - first : r1 - first].reshape(-1)
        return flat[a - r0 * n : b - r0 * n]


def _derivation(entry: PlanEntry, arrays: list[SourceArray]) -> _Node:
    node: _Node = _Source(arrays[0].words)
    for step in entry.transforms:
        if step.op == "concat":
            by_name = {a.name: a.words for a in arrays}
            node = _Concat([_Source(by_name[n]) for n in step.inputs], step.axis or 0)
        elif step.op == "transpose":
            node = _Transpose(node)
        else:
            node = _Reshape(node, tuple(step.shape or ()))
    if tuple(node.shape) != entry.shape:
        raise SourceError(
            f"derived shape {list(node.shape)} differs from the planned {list(entry.shape)}",
            tensor=entry.output,
        )
    return node


class DerivedWords:
    """The encoder input of a derived grouped entry: [N, K] words derived on request, a block
    of rows at a time (``words[r0:r1]``, ``words[r0:r1, c0:c1]``); never built whole unless
    :meth:`whole` is called."""

    def __init__(self, node: _Node) -> None:
        self._node = node
        self.shape = (int(node.shape[0]), int(node.shape[1]))
        self.dtype = node.dtype
        self.ndim = 2

    def rows(self, r0: int, r1: int) -> npt.NDArray[np.generic]:
        k = self.shape[1]
        return self._node.flat(r0 * k, r1 * k).reshape(-1, k)

    def __getitem__(self, key: slice | tuple[slice, slice]) -> npt.NDArray[np.generic]:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        r0, r1, step = rows.indices(self.shape[0])
        if step != 1:
            raise IndexError("DerivedWords takes contiguous row ranges")
        block = self.rows(r0, max(r0, r1))
        return block if cols == slice(None) else block[:, cols]

    def whole(self) -> npt.NDArray[np.generic]:
        return self.rows(0, self.shape[0])


def _convert(
    entry: PlanEntry,
    words: npt.NDArray[np.generic],
    dtype: str,
    fmt: str,
    where: tuple[int, tuple[int, ...]] | None = None,
) -> npt.NDArray[np.generic]:
    """The stored words of ``words`` (a whole tensor, or a flat block of one: see
    :func:`_check_finite` for ``where``)."""
    conv = entry.conversion
    if conv is None:
        if DIRECT_SAME_SOURCE.get(fmt) != dtype:
            raise SourceError(
                f"{dtype} cannot be stored as {fmt} without a conversion", tensor=entry.output
            )
        return words  # bitwise: the words themselves
    if conv in ("f32-to-bf16-rne", "f16-to-bf16-rne"):
        if not entry.keep_nonfinite:
            _check_rounding_sources(entry, words, dtype, where)
        wide32 = (
            np.asarray(words, dtype=np.uint32)
            if conv == "f32-to-bf16-rne"
            else f16_to_f32_words(np.asarray(words, dtype=np.uint16))
        )
        out = f32_to_bf16_rne(wide32, keep_nonfinite=True, tensor=entry.output)
        overflow = ~nonfinite_mask(wide32, "F32") & nonfinite_mask(out, "BF16")
        if overflow.any():
            local = first_index(overflow)
            word = int(wide32[local])
            idx, _ = _locate(local, wide32.shape, where)
            raise EncodeError(
                f"finite value {_f32(word)!r} (F32 word 0x{word:08x}) at {_at(idx)} rounds to "
                f"infinity in BF16; {conv} never turns a finite value into infinity",
                tensor=entry.output,
                rule=f"at line {entry.rule.line}",
                hint="store this tensor as FP32, or fix the source",
            )
        return out
    if conv == "bf16-to-f32":
        return bf16_to_f32_words(np.asarray(words, dtype=np.uint16))
    if conv == "f16-to-f32":
        return f16_to_f32_words(np.asarray(words, dtype=np.uint16))
    if conv == "int-to-i32":
        return _int_to_i32(entry, words, where)
    raise SourceError(f"unknown conversion {conv!r} in the plan", tensor=entry.output)


def _check_rounding_sources(
    entry: PlanEntry,
    words: npt.NDArray[np.generic],
    dtype: str,
    where: tuple[int, tuple[int, ...]] | None,
) -> None:
    conv = entry.conversion
    _check_finite(
        entry,
        np.asarray(words),
        dtype,
        f"{conv} refuses non-finite sources unless keep_nonfinite: true",
        "fix the source checkpoint, or set keep_nonfinite: true on the rule",
        where,
    )


def _int_to_i32(
    entry: PlanEntry, words: npt.NDArray[np.generic], where: tuple[int, tuple[int, ...]] | None
) -> npt.NDArray[np.int32]:
    try:
        return int_to_i32(words, tensor=entry.output)
    except EncodeError:
        arr = np.asarray(words)
        if where is None or arr.dtype.kind not in "iu":
            raise
        # Name the index in the whole tensor: the block is flat.
        bad = (arr < -(2**31)) | (arr > 2**31 - 1) if arr.dtype.kind == "i" else arr > 2**31 - 1
        local = first_index(np.asarray(bad))
        idx, _ = _locate(local, arr.shape, where)
        raise EncodeError(
            f"value {int(arr[local])} at index {list(idx)} is outside the I32 range "
            f"[{-(2**31)}, {2**31 - 1}]",
            tensor=entry.output,
            hint="I32 never wraps; keep this tensor out of I32 or fix the source",
        ) from None


# ---------------------------------------------------------------------------------------------
# Direct entries in blocks


@dataclass(frozen=True, eq=False)
class DirectStream:
    """A direct-format entry (no copy path, not grouped) as a stream of its stored words:
    ``blocks()`` yields 1-D blocks of at most :data:`BLOCK_ELEMENTS` words (each valid until
    the next one is asked for: a converted block reuses one buffer), in row-major order,
    exactly the words :func:`materialize` returns (tests compare them), checked the
    same way; it raises the same errors, naming the index in the whole tensor.  Memory: one
    block and its conversion temporaries, whatever the tensor size."""

    entry: PlanEntry
    source_digests: Mapping[str, str]
    word_dtype: np.dtype[np.generic]
    blocks: Callable[[], Iterator[npt.NDArray[np.generic]]]

    @property
    def numel(self) -> int:
        return math.prod(self.entry.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.word_dtype.itemsize


def streams_directly(entry: PlanEntry) -> bool:
    """Whether ``entry`` is a direct-format entry (see :class:`DirectStream`)."""
    return entry.copy is None and not lookup_format(entry.format).is_grouped


def stream_direct(
    entry: PlanEntry, source: SourceCheckpoint, block_elements: int = BLOCK_ELEMENTS
) -> DirectStream:
    """Read the entry's sources (digesting them) and return its stored words as a stream."""
    fmt = lookup_format(entry.format)
    if not streams_directly(entry):  # pragma: no cover - callers check streams_directly
        raise SourceError("not a direct-format entry", tensor=entry.output)
    arrays = [_read(entry, source, s.name, s.dtype, s.shape) for s in entry.sources]
    digests = {a.name: a.digest for a in arrays}
    node = _derivation(entry, arrays)
    dtype = entry.source_dtype
    shape = tuple(entry.shape)
    total = math.prod(shape)
    # A transposed output is produced in strips of whole output rows (see _Transpose).
    step = max(block_elements, 64 * shape[-1]) if len(shape) == 2 else block_elements
    step = max(1, min(step, 16 * block_elements))
    finite_only = FINITE_ONLY in entry.constraints and fmt.name in ("BF16", "FP32")
    word_dtype = np.dtype(fmt.word_dtype)

    op = _NATIVE_OPS.get(entry.conversion or "") if _native is not None else None
    rounding = entry.conversion in ("f32-to-bf16-rne", "f16-to-bf16-rne")

    def blocks() -> Iterator[npt.NDArray[np.generic]]:
        # Errors in the whole tensor's order: a non-finite source refused by a rounding
        # conversion is raised at once (no earlier block had one); a rounding overflow, then a
        # finite-only refusal, only after every block has been checked for the former.
        overflow: EncodeError | None = None
        nonfinite_out: EncodeError | None = None
        buf = np.empty(min(step, total), dtype=word_dtype) if op is not None else None
        for a in range(0, total, step):
            b = min(total, a + step)
            words = node.flat(a, b)
            where = (a, shape)
            clean = False  # the output block is known to hold finite words only
            out: npt.NDArray[np.generic]
            if op is not None and buf is not None:
                out = buf[: b - a]
                bad_in, bad_over = _native.convert_words(op, np.ascontiguousarray(words), out)
                if rounding and not entry.keep_nonfinite and bad_in >= 0:
                    _check_rounding_sources(entry, words, dtype, where)  # raises, worded
                if bad_over >= 0 and overflow is None:
                    try:  # the reference path words the refusal
                        _convert(entry, words, dtype, fmt.name, where)
                    except EncodeError as exc:
                        overflow = exc
                clean = bad_in < 0 and bad_over < 0
            else:
                if rounding and not entry.keep_nonfinite:
                    _check_rounding_sources(entry, words, dtype, where)
                try:
                    out = _convert(entry, words, dtype, fmt.name, where)
                except EncodeError as exc:
                    if not rounding:
                        raise
                    overflow = overflow or exc
                    continue
            if finite_only and not clean and nonfinite_out is None:
                try:
                    _check_finite(
                        entry,
                        out,
                        fmt.name,
                        "the recipe requires finite values only (finite-only)",
                        "fix the source checkpoint, or drop the finite-only constraint",
                        where,
                    )
                except EncodeError as exc:
                    nonfinite_out = exc
            yield np.ascontiguousarray(out)
        if overflow is not None:
            raise overflow
        if nonfinite_out is not None:
            raise nonfinite_out

    return DirectStream(entry, digests, word_dtype, blocks)


def stream_copy(
    entry: PlanEntry, source: SourceCheckpoint, block_bytes: int = 4 * BLOCK_ELEMENTS
) -> tuple[Mapping[str, str], Callable[[], PlaneBlocks]]:
    """An NVFP4 or FP8-row copy entry as the bytes of its stored planes, the codes plane
    streamed a row block at a time from the mapped source (the stored codes are the source
    bytes: NVFP4 keeps the packed nibbles, FP8 the code bytes); the scales are checked and
    laid out whole (1/16 and 2/K of the codes).  Same checks and errors as
    :func:`materialize` (see :mod:`.copy_paths`).  Returns (source digests, blocks)."""
    assert entry.copy is not None
    arrays = [_read(entry, source, s.name, s.dtype, s.shape) for s in entry.sources]
    parts: dict[str, SourceArray] = {s.field: a for s, a in zip(entry.sources, arrays, strict=True)}
    digests = {a.name: a.digest for a in arrays}
    return digests, COPY_PATHS[entry.copy].planes(entry, parts, block_bytes)
