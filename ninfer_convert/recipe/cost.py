"""Padding cost of a plan entry: physical against nominal bits per weight (docs/recipes.md 7.1).

Contract: the *nominal* bits per weight of a format is the registry's
:attr:`~ninfer_convert.formats.NumericFormat.logical_bits_per_weight` (the full-group cost of
spec Section 6.3), never a second table; the *physical* bits per weight of an entry is
``8 * encoded_bytes / elements`` with ``encoded_bytes`` from the format's storage layout, padding
included.  An entry whose physical cost exceeds its nominal cost by more than
:data:`PADDING_TOLERANCE` (10 %) gets a :class:`PaddingWarning`; exactly 10 % does not.  The
comparison is done in exact rationals, so the threshold has no rounding slack.  Entries without
elements never warn.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING

from ..formats import FORMATS, Category, lookup_format

if TYPE_CHECKING:  # pragma: no cover
    from .entries import PlanEntry

__all__ = [
    "PADDING_TOLERANCE",
    "WARNINGS_SHOWN",
    "PaddingWarning",
    "padding_warning",
    "padding_warnings",
]

WARNINGS_SHOWN = 10
"""How many padding warnings a human-readable listing (the CLI, the generated card) shows
before it says how many more there are; ``--json`` lists them all."""

PADDING_TOLERANCE = Fraction(1, 10)
"""Physical cost may exceed the nominal one by at most this fraction without a warning."""

# Why a layout costs more than its nominal bits, per format category (docs/layouts.md).
_WHY = {
    Category.GROUPED: "each row is padded to a multiple of 128 columns, with a binary16 scale "
    "per padded group",
    Category.BLOCK_SCALED: "the E4M3 scale plane is padded to 128-row x 4-column tiles, "
    "plus the FP32 divisor",
    Category.ROW_SCALED: "every row carries its BF16 scale, which short rows do not amortise",
    Category.DIRECT: "the layout stores no padding",
}


@dataclass(frozen=True)
class PaddingWarning:
    """One tensor whose stored bits per weight exceed its format's nominal bits by > 10 %."""

    tensor: str
    format: str
    shape: tuple[int, ...]
    nominal_bits_per_weight: float
    physical_bits_per_weight: float
    excess: float
    """Physical over nominal, minus one (0.25: 25 % more bits than nominal)."""

    @property
    def message(self) -> str:
        fmt = lookup_format(self.format)
        text = (
            f"tensor {self.tensor!r} ({self.format} {list(self.shape)}) costs "
            f"{self.physical_bits_per_weight:.3f} bits per weight, {100 * self.excess:.1f} % above "
            f"the nominal {self.nominal_bits_per_weight:g}: {_WHY[fmt.category]}"
        )
        bf16 = FORMATS["BF16"].logical_bits_per_weight
        # Only an encoded tensor came from a float source; an already-quantized one (NVFP4,
        # FP8 row: scale x code) does not fit BF16's 8-bit significand.
        if fmt.category is Category.GROUPED and self.physical_bits_per_weight > bf16:
            text += f"; BF16 would store a BF16 source exactly in {bf16:g} bits per weight"
        return text

    def to_dict(self) -> dict[str, object]:
        return {
            "tensor": self.tensor,
            "format": self.format,
            "shape": list(self.shape),
            "nominal_bits_per_weight": self.nominal_bits_per_weight,
            "physical_bits_per_weight": self.physical_bits_per_weight,
            "excess": self.excess,
            "message": self.message,
        }


@functools.cache
def _limits(format: str) -> Fraction:
    """The largest physical bits per weight of ``format`` that does not warn."""
    return Fraction(lookup_format(format).logical_bits_per_weight) * (1 + PADDING_TOLERANCE)


def padding_warning(
    tensor: str, format: str, shape: tuple[int, ...], encoded_bytes: int
) -> PaddingWarning | None:
    """The warning for one tensor of ``format`` and ``shape`` stored in ``encoded_bytes``."""
    numel = 1
    for d in shape:
        numel *= d
    if numel == 0:
        return None
    nominal = lookup_format(format).logical_bits_per_weight
    # The same exact test as ``physical <= nominal * (1 + tolerance)`` in integers: this runs
    # once per tensor, and Fraction arithmetic cost more than the rest of planning a tiny tensor.
    limit = _limits(format)
    if 8 * encoded_bytes * limit.denominator <= limit.numerator * numel:
        return None
    physical = Fraction(8 * encoded_bytes, numel)
    excess = physical / Fraction(nominal) - 1
    return PaddingWarning(tensor, format, tuple(shape), nominal, float(physical), float(excess))


def padding_warnings(entries: Iterable[PlanEntry]) -> tuple[PaddingWarning, ...]:
    """The warnings of every entry, in the entries' order."""
    out = []
    # The answer depends on the values of (format, shape, bytes) only: a checkpoint of many
    # tensors repeats a few of them.  A warning still names its own tensor and shape.
    known: dict[tuple[str, tuple[int, ...], int], PaddingWarning | None] = {}
    for e in entries:
        key = (e.format, e.shape, e.encoded_bytes)
        try:
            w = known[key]
        except KeyError:
            w = known[key] = padding_warning(e.output, e.format, e.shape, e.encoded_bytes)
            if w is not None:
                out.append(w)
            continue
        except TypeError:  # an unhashable shape: no memo for it
            w = padding_warning(e.output, e.format, e.shape, e.encoded_bytes)
            if w is not None:
                out.append(w)
            continue
        if w is not None:  # another tensor's: this one's own names
            out.append(replace(w, tensor=e.output, format=e.format, shape=tuple(e.shape)))
    return tuple(out)
