"""Copy paths: already-quantized words copied from a known producer's tensors, never requantized
(spec Sections 3.3 and 3.4; docs/recipes.md Section 4.6).

Contract: each copy path is one :class:`CopyPath` object holding all of its knowledge:

* its **units** (:meth:`CopyPath.units`): which source tensors form an output ``X.weight``,
  found by fixed name suffixes, each with the field it contributes (``packed-codes``,
  ``block-scales``, ...); the planner matches the copy rule's pattern against the output name
  and claims every tensor of a unit together;
* its **plan-time checks** (:meth:`CopyPath.check`): the dtypes and shapes of a unit's tensors,
  and the output shape they give;
* how it **reads the values**: whole (:meth:`CopyPath.logical`, the logical words) or as the
  stored planes, the codes a row block at a time from the mapped source
  (:meth:`CopyPath.planes`).  Both check every value rule through the predicates of
  :mod:`ninfer_convert.validate` (the rules are written there once) and word each refusal as
  an :class:`~ninfer_convert.errors.EncodeError` naming the source tensor, row and word.  The
  two readers refuse the same sources with the same message; the planes reader checks each row
  block cheaply and lets the whole-tensor check word a refusal, so the first problem reported is
  the same.

:data:`COPY_PATHS` is the one registry (name -> object); ``recipe/tables.py`` re-exports it,
the recipe parser rejects any other name, and the planner and materialisation dispatch through
it.  Copy paths never convert or round a value: a source whose words cannot be stored exactly
(an inexact reciprocal, a scale that is not an exact BF16) is refused.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError
from ..logical import FP8RowWords, NVFP4Words
from ..validate import (
    bf16_row_scale_invalid,
    fp8_code_invalid,
    nvfp4_divisor_ok,
    nvfp4_scale_invalid,
    zero_row_nonzero,
)
from ..words import f16_to_f32_words, f32_to_bf16_rne, first_index
from .model import SourceField

if TYPE_CHECKING:
    from ..source import SourceArray, SourceTensorInfo
    from .entries import PlanEntry

__all__ = [
    "COPY_PATHS",
    "CompressedTensorsFP8Channel",
    "CompressedTensorsNVFP4",
    "CopyPath",
    "CopyUnit",
    "ModelOptNVFP4",
    "PlaneBlocks",
    "SourceField",
]


PlaneBlocks = Iterator[tuple[int, npt.NDArray[np.uint8]]]
"""(plane index, bytes): every plane's bytes in order, the planes one after another."""


@dataclass(frozen=True)
class CopyUnit:
    """The source tensors of one copied output, in plan order (the first is the codes)."""

    output: str
    parts: tuple[tuple[str, SourceField], ...]

    @property
    def primary(self) -> str:
        """The tensor whose claim decides whether the unit is still free."""
        return self.parts[0][0]


def _f32(word: int) -> float:
    return float(np.array([word], dtype=np.uint32).view(np.float32)[0])


def _refuse(entry: PlanEntry, message: str, hint: str) -> EncodeError:
    return EncodeError(
        message, tensor=entry.output, where=f"recipe rule at line {entry.rule.line}", hint=hint
    )


def _desc(info: SourceTensorInfo) -> str:
    return f"{info.name} is {info.dtype} {list(info.shape)}"


class CopyPath(ABC):
    """One copy path: its name, the format it produces, and its units, checks and readers."""

    name: str
    format: str
    description: str
    """What it copies, for readers of the table (docs/recipes.md has the full rules)."""

    @abstractmethod
    def unit_of(self, name: str, present: Collection[str]) -> CopyUnit | None:
        """The unit whose codes tensor is ``name`` (``present``: every source tensor name)."""

    def units(self, names: Sequence[str], present: Collection[str]) -> list[CopyUnit]:
        """Every unit of the source, in the order of ``names``."""
        return [u for u in (self.unit_of(n, present) for n in names) if u is not None]

    @abstractmethod
    def check(
        self, parts: Mapping[SourceField, SourceTensorInfo]
    ) -> tuple[tuple[int, ...], list[str]]:
        """(the output shape, the dtype/shape problems of a unit's tensors: empty when fit)."""

    @abstractmethod
    def logical(
        self, entry: PlanEntry, parts: Mapping[str, SourceArray]
    ) -> NVFP4Words | FP8RowWords:
        """The checked logical words of the whole output (``parts``: field -> source array)."""

    @abstractmethod
    def planes(
        self, entry: PlanEntry, parts: Mapping[str, SourceArray], block_bytes: int
    ) -> Callable[[], PlaneBlocks]:
        """The stored planes' bytes, the codes plane in row blocks of about ``block_bytes``."""


def _rows_per_block(codes: npt.NDArray[np.uint8], block_bytes: int) -> int:
    row = codes.shape[1] if codes.ndim == 2 else 0
    return max(1, block_bytes // max(row, 1))


# ---------------------------------------------------------------------------------------------
# NVFP4


class _NVFP4Copy(CopyPath):
    """The NVFP4 producers: packed E2M1 codes (element 2j in the low nibble), E4M3FN block
    scales over 16 elements, and one F32 global scale (a divisor or a multiplier)."""

    format = "NVFP4"
    global_field: SourceField

    def check(
        self, parts: Mapping[SourceField, SourceTensorInfo]
    ) -> tuple[tuple[int, ...], list[str]]:
        p, s, g = parts["packed-codes"], parts["block-scales"], parts[self.global_field]
        bad: list[str] = []
        shape: tuple[int, ...] = ()
        if not (p.dtype == "U8" and len(p.shape) == 2 and min(p.shape) > 0):
            bad.append(f"{_desc(p)}; packed E2M1 codes must be U8 [N, K/2] with N, K > 0")
        else:
            n, k = p.shape[0], 2 * p.shape[1]
            shape = (n, k)
            if k % 16:
                bad.append(
                    f"{_desc(p)} gives K = {k}, which NVFP4 cannot take (K must be "
                    "a multiple of 16)"
                )
            elif not (s.dtype == "F8_E4M3" and s.shape == (n, k // 16)):
                bad.append(f"{_desc(s)}; block scales must be F8_E4M3 [{n}, {k // 16}]")
        if not (g.dtype == "F32" and g.shape in ((), (1,))):
            bad.append(f"{_desc(g)}; the global scale must be one F32 value ([1] or [])")
        return shape, bad

    @abstractmethod
    def divisor(self, entry: PlanEntry, g: SourceArray) -> int:
        """The checked binary32 word of d_w from the global-scale tensor ``g``."""

    def divisor_and_scales(
        self, entry: PlanEntry, parts: Mapping[str, SourceArray]
    ) -> tuple[int, npt.NDArray[np.uint8]]:
        """The checked divisor word and block scales (every E2M1 code is valid)."""
        scales = np.asarray(parts["block-scales"].words, dtype=np.uint8)
        divisor = self.divisor(entry, parts[self.global_field])
        bad = nvfp4_scale_invalid(scales)
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
        return divisor, scales

    def logical(self, entry: PlanEntry, parts: Mapping[str, SourceArray]) -> NVFP4Words:
        packed = np.asarray(parts["packed-codes"].words, dtype=np.uint8)
        n, half = packed.shape
        divisor, scales = self.divisor_and_scales(entry, parts)
        # E2M1 unpacking: element 2j is the low nibble, 2j+1 the high nibble of byte j.
        codes = np.empty((n, 2 * half), dtype=np.uint8)
        codes[:, 0::2] = packed & np.uint8(0x0F)
        codes[:, 1::2] = packed >> np.uint8(4)
        return NVFP4Words(codes=codes, scales=np.ascontiguousarray(scales), divisor=divisor)

    def planes(
        self, entry: PlanEntry, parts: Mapping[str, SourceArray], block_bytes: int
    ) -> Callable[[], PlaneBlocks]:
        from ..layouts.blockscale import swizzle_scales

        # The stored codes plane is the packed source bytes, row by row.
        codes = np.asarray(parts["packed-codes"].words, dtype=np.uint8)
        rows = _rows_per_block(codes, block_bytes)

        def blocks() -> PlaneBlocks:
            divisor, scales = self.divisor_and_scales(entry, parts)
            for r0 in range(0, codes.shape[0], rows):
                yield 0, codes[r0 : r0 + rows].reshape(-1)
            yield 1, swizzle_scales(scales)
            yield 2, np.array([divisor], dtype="<u4").view(np.uint8)

        return blocks


def _global_word(g: SourceArray) -> int:
    return int(np.asarray(g.words, dtype=np.uint32).reshape(-1)[0])


class CompressedTensorsNVFP4(_NVFP4Copy):
    name = "compressed-tensors-nvfp4"
    description = (
        "compressed-tensors nvfp4-pack-quantized: X.weight_packed U8 [N, K/2] (element "
        "2j in the low nibble), X.weight_scale F8_E4M3 [N, K/16], X.weight_global_scale "
        "F32 [1] (already a divisor) -> output X.weight"
    )
    global_field = "global-divisor"

    def unit_of(self, name: str, present: Collection[str]) -> CopyUnit | None:
        if not name.endswith(".weight_packed"):
            return None
        x = name[: -len("_packed")]
        return CopyUnit(
            x,
            (
                (name, "packed-codes"),
                (x + "_scale", "block-scales"),
                (x + "_global_scale", "global-divisor"),
            ),
        )

    def divisor(self, entry: PlanEntry, g: SourceArray) -> int:
        word = _global_word(g)
        if not nvfp4_divisor_ok(word):
            raise _refuse(
                entry,
                f"{g.name} = {_f32(word)!r} (word 0x{word:08x}); the "
                "NVFP4 weight divisor d_w must be finite and strictly positive",
                "the source global scale is invalid",
            )
        return word


class ModelOptNVFP4(_NVFP4Copy):
    name = "modelopt-nvfp4"
    description = (
        "ModelOpt NVFP4: X.weight U8 [N, K/2] (element 2j in the low nibble), "
        "X.weight_scale F8_E4M3 [N, K/16], X.weight_scale_2 F32 scalar multiplier whose "
        "reciprocal must be exact in binary32 -> output X.weight"
    )
    global_field = "global-multiplier"

    def unit_of(self, name: str, present: Collection[str]) -> CopyUnit | None:
        if not (name.endswith(".weight") and name + "_scale_2" in present):
            return None
        return CopyUnit(
            name,
            (
                (name, "packed-codes"),
                (name + "_scale", "block-scales"),
                (name + "_scale_2", "global-multiplier"),
            ),
        )

    def divisor(self, entry: PlanEntry, g: SourceArray) -> int:
        """binary32 word of 1/m for the multiplier word m, if that reciprocal is exact."""
        word = _global_word(g)
        value = _f32(word)
        if not nvfp4_divisor_ok(word):
            raise _refuse(
                entry,
                f"{g.name} = {value!r} (word 0x{word:08x}); the multiplier must be "
                "finite and strictly positive",
                "the source weight_scale_2 is invalid",
            )
        exact = 1 / Fraction(value)
        with np.errstate(over="ignore"):  # overflow to inf is caught by the exactness check
            recip = np.float32(float(exact))  # float() rounds correctly; then checked exactly
        if not np.isfinite(recip) or Fraction(float(recip)) != exact:
            raise _refuse(
                entry,
                f"{g.name} = {value!r} (word 0x{word:08x}) is a multiplier, and NVFP4 stores a "
                f"divisor d_w = 1/{value!r}, which is not exactly representable in binary32 "
                f"(nearest: {float(recip)!r}); rounding it would change every represented "
                "weight, so the copy is refused",
                "only a power-of-two weight_scale_2 has an exact reciprocal; requantize upstream",
            )
        return int(np.array([recip], dtype=np.float32).view(np.uint32)[0])


# ---------------------------------------------------------------------------------------------
# FP8 row


class CompressedTensorsFP8Channel(CopyPath):
    name = "compressed-tensors-fp8-channel"
    format = "FP8_E4M3FN_ROW_BF16S"
    description = (
        "compressed-tensors channel-wise FP8: X.weight F8_E4M3 [N, K], X.weight_scale "
        "F32/BF16/F16 [N, 1] multiplier that must be an exact BF16 -> output X.weight"
    )

    def unit_of(self, name: str, present: Collection[str]) -> CopyUnit | None:
        if not (name.endswith(".weight") and name + "_scale" in present):
            return None
        return CopyUnit(name, ((name, "codes"), (name + "_scale", "row-scales")))

    def check(
        self, parts: Mapping[SourceField, SourceTensorInfo]
    ) -> tuple[tuple[int, ...], list[str]]:
        c, s = parts["codes"], parts["row-scales"]
        bad: list[str] = []
        shape: tuple[int, ...] = ()
        if not (c.dtype == "F8_E4M3" and len(c.shape) == 2 and min(c.shape) > 0):
            bad.append(f"{_desc(c)}; FP8 codes must be F8_E4M3 [N, K] with N, K > 0")
        if len(c.shape) == 2:
            shape = c.shape
            if not (s.dtype in ("F32", "BF16", "F16") and s.shape == (c.shape[0], 1)):
                bad.append(f"{_desc(s)}; channel scales must be F32, BF16 or F16 [{c.shape[0]}, 1]")
        return shape, bad

    def scales(self, entry: PlanEntry, parts: Mapping[str, SourceArray]) -> npt.NDArray[np.uint16]:
        """The checked BF16 row scales."""
        src = parts["row-scales"]
        n = parts["codes"].words.shape[0]
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
                rne = f32_to_bf16_rne(wide[r : r + 1], keep_nonfinite=True)
                nearest = _f32(int(rne[0]) << 16)
                raise _refuse(
                    entry,
                    f"{src.name}: the scale of row {r} is {_f32(w)!r} ({src.dtype} word "
                    f"0x{w:0{src.words.dtype.itemsize * 2}x}), which is not exactly "
                    f"representable as BF16 (nearest BF16: {nearest!r}); "
                    "FP8_E4M3FN_ROW_BF16S stores BF16 row multipliers and rounding would "
                    "change the represented weights, so the copy is refused",
                    "use a source whose channel scales are exact BF16 values",
                )
            scales = (wide >> np.uint32(16)).astype(np.uint16)
        bad = bf16_row_scale_invalid(scales)
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
        return scales

    @staticmethod
    def codes_ok(codes: npt.NDArray[np.uint8], scales: npt.NDArray[np.uint16]) -> bool:
        """Whether a row block of codes passes :meth:`check_codes` (one cheap pass)."""
        if fp8_code_invalid(codes).any():
            return False
        bad = zero_row_nonzero(codes, scales)
        return bad is None or not bad.any()

    @staticmethod
    def check_codes(
        entry: PlanEntry,
        parts: Mapping[str, SourceArray],
        codes: npt.NDArray[np.uint8],
        scales: npt.NDArray[np.uint16],
    ) -> None:
        nan = fp8_code_invalid(codes)
        if nan.any():
            r, c = first_index(nan)
            raise _refuse(
                entry,
                f"{parts['codes'].name}: code at row {r}, column {c} is E4M3FN NaN "
                f"(0x{int(codes[r, c]):02x}); FP8 weight codes must be finite",
                "the source weights are invalid",
            )
        nonzero = zero_row_nonzero(codes, scales)
        if nonzero is not None and nonzero.any():
            r, c = first_index(nonzero)
            raise _refuse(
                entry,
                f"row {r} has scale +0 but code 0x{int(codes[r, c]):02x} at "
                f"column {c}; a +0-scale row may hold only signed-zero codes",
                "the source weights are inconsistent",
            )

    def logical(self, entry: PlanEntry, parts: Mapping[str, SourceArray]) -> FP8RowWords:
        codes = np.asarray(parts["codes"].words, dtype=np.uint8)
        scales = self.scales(entry, parts)
        self.check_codes(entry, parts, codes, scales)
        return FP8RowWords(codes=np.ascontiguousarray(codes), scales=np.ascontiguousarray(scales))

    def planes(
        self, entry: PlanEntry, parts: Mapping[str, SourceArray], block_bytes: int
    ) -> Callable[[], PlaneBlocks]:
        codes = np.asarray(parts["codes"].words, dtype=np.uint8)
        rows = _rows_per_block(codes, block_bytes)

        def blocks() -> PlaneBlocks:
            row_scales = self.scales(entry, parts)
            for r0 in range(0, codes.shape[0], rows):
                block = codes[r0 : r0 + rows]
                if not self.codes_ok(block, row_scales[r0 : r0 + rows]):
                    self.check_codes(entry, parts, codes, row_scales)  # raises, worded
                yield 0, block.reshape(-1)
            yield 1, np.ascontiguousarray(row_scales).astype("<u2", copy=False).view(np.uint8)

        return blocks


COPY_PATHS: Mapping[str, CopyPath] = MappingProxyType(
    {c.name: c for c in (CompressedTensorsNVFP4(), ModelOptNVFP4(), CompressedTensorsFP8Channel())}
)
"""Every copy path a recipe may name, by name (the one registry; docs/recipes.md 4.6)."""
