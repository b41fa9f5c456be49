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

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError, SourceError
from ..formats import lookup_format
from ..ieee import BFLOAT16, BINARY16, BINARY32
from ..logical import DirectWords, LogicalTensor
from ..native import optional_module
from ..source import SourceArray, SourceCheckpoint
from ..words import bf16_to_f32_words, f16_to_f32_words, f32_to_bf16_rne, first_index, int_to_i32
from .copy_paths import COPY_PATHS, PlaneBlocks
from .derivation import DerivedWords, derivation
from .entries import PlanEntry
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
_BINARY = {"BF16": BFLOAT16, "F16": BINARY16, "F32": BINARY32, "FP32": BINARY32}
_EXP_MASK = {dtype: fmt.exp_mask for dtype, fmt in _BINARY.items()}


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
        kind = "NaN" if word & _BINARY[dtype].frac_mask else "infinity"
        raise EncodeError(
            f"non-finite value ({kind}, {dtype} word 0x{word:0{words.dtype.itemsize * 2}x}) at "
            f"{_at(idx)} of shape {list(shape)}; {why}",
            tensor=entry.output,
            kind="non_finite_value",
            where=f"recipe rule at line {entry.rule.line}",
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
        node = derivation(entry, arrays)
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
    node = derivation(entry, arrays)
    mapped = node.mapped()
    if mapped is not None:
        return mapped
    return node.flat(0, node.size).reshape(node.shape)


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
                where=f"recipe rule at line {entry.rule.line}",
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


@functools.cache
def _word_dtype(name: str) -> np.dtype[np.generic]:
    return np.dtype(name)


def stream_direct(
    entry: PlanEntry, source: SourceCheckpoint, block_elements: int = BLOCK_ELEMENTS
) -> DirectStream:
    """Read the entry's sources (digesting them) and return its stored words as a stream."""
    fmt = lookup_format(entry.format)
    if entry.copy is not None or fmt.is_grouped:  # pragma: no cover - see streams_directly
        raise SourceError("not a direct-format entry", tensor=entry.output)
    arrays = [_read(entry, source, s.name, s.dtype, s.shape) for s in entry.sources]
    digests = {a.name: a.digest for a in arrays}
    node = derivation(entry, arrays)
    dtype = entry.source_dtype
    shape = tuple(entry.shape)
    total = math.prod(shape)
    # A transposed output is produced in strips of whole output rows (see derivation._Transpose).
    step = max(block_elements, 64 * shape[-1]) if len(shape) == 2 else block_elements
    step = max(1, min(step, 16 * block_elements))
    finite_only = FINITE_ONLY in entry.constraints and fmt.name in ("BF16", "FP32")
    word_dtype = _word_dtype(fmt.word_dtype)

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
