"""Materialisation: read one plan entry's source tensors and produce what gets stored.

Contract: :func:`materialize` reads exactly the entry's source tensors (one entry at a time;
memory follows that entry), checks they still match the plan, applies the recorded transforms
(concat, transpose, reshape) and the recorded conversion, checks constraints, and returns a
:class:`Materialized` whose ``value`` is either

* a ready :class:`~ninfer_convert.logical.LogicalTensor` for direct formats and the NVFP4 /
  FP8-row copy paths, with every validity rule of spec Sections 3.1, 3.3 and 3.4 checked, or
* an :class:`EncodeInput` (2-D source words plus their dtype) for grouped formats; the convert
  pipeline calls the encoder, not this module.

Rules enforced here (spec Sections 3.1, 3.3, 3.4, 9):

* Same source type as the direct format: the words are copied bitwise (NaN payloads, -0.0).
  A different type only through the entry's named conversion (:mod:`.tables`).  Rounding
  conversions refuse non-finite sources unless ``keep_nonfinite``, and always refuse a finite
  value that would round to infinity.
* ``finite-only`` and every grouped format refuse a non-finite value, naming the tensor and the
  row and column (index, for other ranks) of the first one in the output's logical coordinates.
* Copy paths never requantize: E2M1 codes are unpacked (element 2j from the low nibble), block
  scales must be non-negative finite E4M3FN words, the FP32 divisor finite and positive; a
  ModelOpt ``weight_scale_2`` multiplier is accepted only if its reciprocal is exact in binary32;
  an FP8 row scale must be an exact, non-negative, finite BF16 and a +0-scale row may hold only
  signed-zero codes; FP8 codes must not be NaN.  Every refusal is an
  :class:`~ninfer_convert.errors.EncodeError` that explains why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError, SourceError
from ..formats import lookup_format
from ..logical import DirectWords, FP8RowWords, LogicalTensor, NVFP4Words
from ..source import SourceArray, SourceCheckpoint
from ..words import bf16_to_f32_words, f16_to_f32_words, f32_to_bf16_rne, first_index, int_to_i32
from .plan import PlanEntry
from .tables import DIRECT_SAME_SOURCE, FINITE_ONLY, GROUPED_SOURCES

__all__ = ["EncodeInput", "Materialized", "materialize", "nonfinite_mask"]

GroupedSource = Literal["BF16", "F16", "F32"]


@dataclass(frozen=True, eq=False)
class EncodeInput:
    """Source words of a grouped-format entry, ready for the encoder.

    ``words`` is 2-D [N, K] (uint16 for BF16/F16, uint32 for F32), C-contiguous, possibly a
    read-only view of the source file; finite (checked)."""

    words: npt.NDArray[np.generic]
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
    entry: PlanEntry, words: npt.NDArray[np.generic], dtype: str, why: str, hint: str
) -> None:
    bad = nonfinite_mask(words, dtype)
    if bad.any():
        idx = first_index(bad)
        word = int(words[idx])
        kind = (
            "NaN"
            if (word & ~_EXP_MASK[dtype] & (0x7FFFFF if dtype in ("F32", "FP32") else 0x7FFF))
            else "infinity"
        )
        raise EncodeError(
            f"non-finite value ({kind}, {dtype} word 0x{word:0{words.dtype.itemsize * 2}x}) at "
            f"{_at(idx)} of shape {list(words.shape)}; {why}",
            tensor=entry.output,
            rule=f"at line {entry.rule.line}",
            hint=hint,
        )


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
        value = _copy_nvfp4(entry, parts) if fmt.name == "NVFP4" else _copy_fp8(entry, parts)
        return Materialized(entry, value, digests)

    words = _derive(entry, arrays)
    dtype = entry.source_dtype
    if fmt.is_grouped:
        if dtype not in GROUPED_SOURCES or words.ndim != 2:
            raise SourceError(
                f"plan entry does not fit {fmt.name} ({dtype} {list(words.shape)})",
                tensor=entry.output,
            )
        # Non-finite values are refused by the canonical encoder itself, block by block, with
        # the row, column and group (spec Section 7); checking here too would cost a
        # full-tensor pass and a mask as large as the tensor.
        grouped: GroupedSource = dtype  # type: ignore[assignment]
        return Materialized(entry, EncodeInput(np.ascontiguousarray(words), grouped), digests)

    out = _convert(entry, words, dtype, fmt.name)
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
    words: npt.NDArray[np.generic] = arrays[0].words
    for step in entry.transforms:
        if step.op == "concat":
            by_name = {a.name: a.words for a in arrays}
            words = np.concatenate([by_name[n] for n in step.inputs], axis=step.axis or 0)
        elif step.op == "transpose":
            words = np.ascontiguousarray(words.T)
        else:
            words = np.ascontiguousarray(words).reshape(step.shape or ())
    if tuple(words.shape) != entry.shape:
        raise SourceError(
            f"derived shape {list(words.shape)} differs from the planned {list(entry.shape)}",
            tensor=entry.output,
        )
    return words


def _convert(
    entry: PlanEntry, words: npt.NDArray[np.generic], dtype: str, fmt: str
) -> npt.NDArray[np.generic]:
    conv = entry.conversion
    if conv is None:
        if DIRECT_SAME_SOURCE.get(fmt) != dtype:
            raise SourceError(
                f"{dtype} cannot be stored as {fmt} without a conversion", tensor=entry.output
            )
        return words  # bitwise: the words themselves
    if conv in ("f32-to-bf16-rne", "f16-to-bf16-rne"):
        wide = (
            words
            if conv == "f32-to-bf16-rne"
            else f16_to_f32_words(np.asarray(words, dtype=np.uint16))
        )
        if not entry.keep_nonfinite:
            _check_finite(
                entry,
                np.asarray(words),
                dtype,
                f"{conv} refuses non-finite sources unless keep_nonfinite: true",
                "fix the source checkpoint, or set keep_nonfinite: true on the rule",
            )
        wide32 = np.asarray(wide, dtype=np.uint32)
        out = f32_to_bf16_rne(wide32, keep_nonfinite=True, tensor=entry.output)
        overflow = ~nonfinite_mask(wide32, "F32") & nonfinite_mask(out, "BF16")
        if overflow.any():
            idx = first_index(overflow)
            word = int(wide32[idx])
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
        return int_to_i32(words, tensor=entry.output)
    raise SourceError(f"unknown conversion {conv!r} in the plan", tensor=entry.output)


def _refuse(entry: PlanEntry, message: str, hint: str) -> EncodeError:
    return EncodeError(message, tensor=entry.output, rule=f"at line {entry.rule.line}", hint=hint)


def _copy_nvfp4(entry: PlanEntry, parts: Mapping[str, SourceArray]) -> NVFP4Words:
    packed = np.asarray(parts["packed-codes"].words, dtype=np.uint8)
    scales = np.asarray(parts["block-scales"].words, dtype=np.uint8)
    n, half = packed.shape
    if "global-divisor" in parts:
        g = parts["global-divisor"]
        divisor = int(np.asarray(g.words, dtype=np.uint32).reshape(-1)[0])
        if divisor & 0x80000000 or (divisor & 0x7F800000) == 0x7F800000 or divisor == 0:
            raise _refuse(
                entry,
                f"{g.name} = {_f32(divisor)!r} (word 0x{divisor:08x}); the "
                "NVFP4 weight divisor d_w must be finite and strictly positive",
                "the source global scale is invalid",
            )
    else:
        g = parts["global-multiplier"]
        word = int(np.asarray(g.words, dtype=np.uint32).reshape(-1)[0])
        divisor = _exact_reciprocal(entry, g.name, word)

    # Block scales: sign-zero finite words only (+0 allowed; -0, negatives, NaN refused).
    bad = ((scales & 0x80) != 0) | ((scales & 0x7F) == 0x7F)
    if bad.any():
        r, c = first_index(bad)
        w = int(scales[r, c])
        what = "NaN" if (w & 0x7F) == 0x7F else ("negative zero" if w == 0x80 else "negative")
        raise _refuse(
            entry,
            f"{parts['block-scales'].name}: block scale at row {r}, group {c} "
            f"is E4M3FN word 0x{w:02x} ({what}); NVFP4 block scales must be "
            "non-negative finite words",
            "the source block scales are invalid",
        )
    # E2M1 unpacking: element 2j is the low nibble, 2j+1 the high nibble of byte j.
    codes = np.empty((n, 2 * half), dtype=np.uint8)
    codes[:, 0::2] = packed & np.uint8(0x0F)
    codes[:, 1::2] = packed >> np.uint8(4)
    return NVFP4Words(codes=codes, scales=np.ascontiguousarray(scales), divisor=divisor)


def _exact_reciprocal(entry: PlanEntry, name: str, word: int) -> int:
    """binary32 word of 1/m for the multiplier word m, if that reciprocal is exact."""
    value = _f32(word)
    if word & 0x80000000 or (word & 0x7F800000) == 0x7F800000 or word == 0:
        raise _refuse(
            entry,
            f"{name} = {value!r} (word 0x{word:08x}); the multiplier must be "
            "finite and strictly positive",
            "the source weight_scale_2 is invalid",
        )
    exact = 1 / Fraction(value)
    with np.errstate(over="ignore"):  # overflow to inf is caught by the exactness check
        recip = np.float32(float(exact))  # float() rounds correctly; then checked exactly
    if not np.isfinite(recip) or Fraction(float(recip)) != exact:
        raise _refuse(
            entry,
            f"{name} = {value!r} (word 0x{word:08x}) is a multiplier, and NVFP4 stores a "
            f"divisor d_w = 1/{value!r}, which is not exactly representable in binary32 "
            f"(nearest: {float(recip)!r}); rounding it would change every represented weight, "
            "so the copy is refused",
            "only a power-of-two weight_scale_2 has an exact reciprocal; requantize upstream",
        )
    return int(np.array([recip], dtype=np.float32).view(np.uint32)[0])


def _copy_fp8(entry: PlanEntry, parts: Mapping[str, SourceArray]) -> FP8RowWords:
    codes = np.asarray(parts["codes"].words, dtype=np.uint8)
    src = parts["row-scales"]
    n = codes.shape[0]
    if src.dtype == "BF16":
        scales = np.asarray(src.words, dtype=np.uint16).reshape(n)
    else:
        wide = np.asarray(src.words).reshape(n)
        if src.dtype == "F16":
            wide = f16_to_f32_words(np.asarray(wide, dtype=np.uint16))
        wide = np.asarray(wide, dtype=np.uint32)
        inexact = (wide & np.uint32(0xFFFF)) != 0
        if inexact.any():
            r = int(np.argmax(inexact))
            w = int(wide[r])
            nearest = _f32(int(f32_to_bf16_rne(wide[r : r + 1], keep_nonfinite=True)[0]) << 16)
            raise _refuse(
                entry,
                f"{src.name}: the scale of row {r} is {_f32(w)!r} ({src.dtype} word "
                f"0x{w:0{src.words.dtype.itemsize * 2}x}), which is not exactly representable as "
                f"BF16 (nearest BF16: {nearest!r}); FP8_E4M3FN_ROW_BF16S stores BF16 row "
                "multipliers and rounding would change the represented weights, so the copy "
                "is refused",
                "use a source whose channel scales are exact BF16 values",
            )
        scales = (wide >> np.uint32(16)).astype(np.uint16)
    bad = ((scales & 0x8000) != 0) | ((scales & 0x7F80) == 0x7F80)
    if bad.any():
        r = int(np.argmax(bad))
        w = int(scales[r])
        raise _refuse(
            entry,
            f"{src.name}: the scale of row {r} is BF16 word 0x{w:04x} "
            f"({_f32(w << 16)!r}); a row multiplier must be non-negative and finite "
            "(+0 allowed, -0 not)",
            "the source channel scales are invalid",
        )
    nan = (codes & 0x7F) == 0x7F
    if nan.any():
        r, c = first_index(nan)
        raise _refuse(
            entry,
            f"{parts['codes'].name}: code at row {r}, column {c} is E4M3FN NaN "
            f"(0x{int(codes[r, c]):02x}); FP8 weight codes must be finite",
            "the source weights are invalid",
        )
    zero_rows = scales == 0
    if zero_rows.any():
        nonzero = ((codes & 0x7F) != 0) & zero_rows[:, None]
        if nonzero.any():
            r, c = first_index(nonzero)
            raise _refuse(
                entry,
                f"row {r} has scale +0 but code 0x{int(codes[r, c]):02x} at "
                f"column {c}; a +0-scale row may hold only signed-zero codes",
                "the source weights are inconsistent",
            )
    return FP8RowWords(codes=np.ascontiguousarray(codes), scales=np.ascontiguousarray(scales))
