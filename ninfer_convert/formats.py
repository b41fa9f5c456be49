"""The closed registry of the nine persistent numeric formats and the encoder profiles.

Contract (spec Sections 1, 3, 5, 7, 10): exactly nine canonical names exist.  A name is looked
up by exact, case-sensitive comparison against :data:`FORMATS`; nothing is ever parsed apart
from its spelling, and there is no constructor from (bits, group size, scale type).  Every other
module asks this table for code widths, group sizes, code intervals, qmax, scale word types and
the registered layout name instead of repeating them.

:data:`ENCODER_PROFILES` is the one table of encoder profiles; each lists the formats it may
produce.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .errors import FormatError

__all__ = [
    "ENCODER_PROFILES",
    "FORMATS",
    "GPTQ_F16_SEARCH_IW_V1",
    "MAXABS_F16_RECIP_RNE_V1",
    "MSE_F16_SEARCH_IW_V1",
    "MSE_F16_SEARCH_V1",
    "Category",
    "EncoderProfile",
    "NumericFormat",
    "check_profile_fits",
    "lookup_format",
    "lookup_profile",
]


class Category(enum.Enum):
    """Format categories of spec Section 1; the values are the wire spelling in headers."""

    DIRECT = "direct"
    GROUPED = "grouped-signed-integer"
    BLOCK_SCALED = "block-scaled-fp"
    ROW_SCALED = "row-scaled-fp"


@dataclass(frozen=True)
class NumericFormat:
    """One registry entry.  Fields that do not apply to a category are ``None``."""

    name: str
    category: Category
    code_bits: int
    """Width of one logical word or code in bits."""
    word_dtype: str
    """numpy dtype string of the logical word/code as exposed by readers ('<u2', '<i4', ...)."""
    group_size: int | None
    """Logical K-axis group (64/32 grouped, 16 NVFP4); ``None`` for direct and row-scaled."""
    qmin: int | None
    qmax: int | None
    """Legal signed code interval of grouped formats; qmax is the encoder's denominator."""
    scale_word: str | None
    """Scale word type: 'binary16', 'e4m3fn', 'bf16' or ``None`` for direct formats."""
    layout: str
    """The registered storage layout (see ninfer_convert.layouts)."""

    @property
    def is_direct(self) -> bool:
        return self.category is Category.DIRECT

    @property
    def is_grouped(self) -> bool:
        return self.category is Category.GROUPED

    @property
    def logical_bits_per_weight(self) -> float:
        """Full-group logical cost of Section 6.3 (b + 16/G); the word width for direct formats."""
        if self.category is Category.GROUPED and self.group_size is not None:
            return self.code_bits + 16 / self.group_size
        if self.category is Category.BLOCK_SCALED and self.group_size is not None:
            return self.code_bits + 8 / self.group_size
        return float(self.code_bits)


def _direct(name: str, bits: int, word_dtype: str) -> NumericFormat:
    return NumericFormat(
        name, Category.DIRECT, bits, word_dtype, None, None, None, None, "contiguous-le-v1"
    )


def _grouped(name: str, bits: int, group: int, qmin: int, qmax: int) -> NumericFormat:
    return NumericFormat(
        name, Category.GROUPED, bits, "i1", group, qmin, qmax, "binary16", "row-split-k128-v1"
    )


_ALL: tuple[NumericFormat, ...] = (
    _direct("BF16", 16, "<u2"),
    _direct("FP32", 32, "<u4"),
    _direct("I32", 32, "<i4"),
    _grouped("Q4G64_F16S", 4, 64, -8, 7),
    _grouped("Q5G64_F16S", 5, 64, -16, 15),
    _grouped("Q6G64_F16S", 6, 64, -32, 31),
    # W8 deliberately excludes -128 (0x80): spec Section 5.
    _grouped("W8G32_F16S", 8, 32, -127, 127),
    NumericFormat(
        "NVFP4",
        Category.BLOCK_SCALED,
        4,
        "u1",
        16,
        None,
        None,
        "e4m3fn",
        "blockscale-k16-m128x4-v1",
    ),
    NumericFormat(
        "FP8_E4M3FN_ROW_BF16S",
        Category.ROW_SCALED,
        8,
        "u1",
        None,
        None,
        None,
        "bf16",
        "row-scale-v1",
    ),
)

FORMATS: Mapping[str, NumericFormat] = MappingProxyType({f.name: f for f in _ALL})
"""The closed registry, keyed by canonical name (read-only)."""

if len(FORMATS) != 9:  # pragma: no cover - guards an edit that duplicates a name
    raise RuntimeError("the format registry must hold exactly nine distinct names")


def lookup_format(name: object) -> NumericFormat:
    """Return the registry entry for an exact canonical name, or raise :class:`FormatError`."""
    if isinstance(name, NumericFormat):
        if FORMATS.get(name.name) is name:
            return name
        raise FormatError(f"{name!r} is not a registered format object")
    if isinstance(name, str) and name in FORMATS:
        return FORMATS[name]
    raise FormatError(
        f"unknown numeric format {name!r}",
        hint="the closed registry holds exactly: "
        + ", ".join(FORMATS)
        + "; names are compared exactly and never parsed apart",
    )


@dataclass(frozen=True)
class EncoderProfile:
    """A named source-to-format encoder.  ``formats`` are the formats it may produce."""

    name: str
    formats: frozenset[str]
    description: str
    importance: bool = False
    """Whether the encoder takes a per-column importance vector (stored in the artifact)."""
    factor: bool = False
    """Whether the encoder takes a [K, B] compensation factor (stored in the artifact)."""


MAXABS_F16_RECIP_RNE_V1 = "MAXABS_F16_RECIP_RNE_V1"
MSE_F16_SEARCH_V1 = "MSE_F16_SEARCH_V1"
MSE_F16_SEARCH_IW_V1 = "MSE_F16_SEARCH_IW_V1"
GPTQ_F16_SEARCH_IW_V1 = "GPTQ_F16_SEARCH_IW_V1"
_GROUPED = frozenset({"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"})

ENCODER_PROFILES: Mapping[str, EncoderProfile] = MappingProxyType(
    {
        MAXABS_F16_RECIP_RNE_V1: EncoderProfile(
            MAXABS_F16_RECIP_RNE_V1,
            _GROUPED,
            "per-row, per-group max-abs; binary16 scale = RNE(RNE32(amax/qmax)); "
            "codes = clamp(rint(RNE32(x * RNE32(1/scale32)))) (spec Section 7)",
        ),
        MSE_F16_SEARCH_V1: EncoderProfile(
            MSE_F16_SEARCH_V1,
            _GROUPED,
            "per-group search over 14 fixed binary16 scales (the canonical one, amax/|qmin|, "
            "amax*32/(qmax*c) for c = 29..40); nearest codes on the whole interval; the "
            "smallest binary64 squared error wins, ties to the lower index "
            "(docs/encoder-profiles.md)",
        ),
        MSE_F16_SEARCH_IW_V1: EncoderProfile(
            MSE_F16_SEARCH_IW_V1,
            _GROUPED,
            "MSE_F16_SEARCH_V1's candidates, codes and tie rule with the squared error of "
            "column k weighted by a stored binary32 importance w[k] (finite, >= +0) in "
            "binary64 (docs/encoder-profiles.md)",
            importance=True,
        ),
        GPTQ_F16_SEARCH_IW_V1: EncoderProfile(
            GPTQ_F16_SEARCH_IW_V1,
            _GROUPED,
            "block-compensated (GPTQ-style) encoding with a stored [K, B] binary32 factor "
            "(upper Cholesky factors of the inverted damped diagonal B-blocks of X^T X / n); "
            "each group's scale is MSE_F16_SEARCH_IW_V1's choice on the compensated values "
            "with the stored importance vector (docs/encoder-profiles.md)",
            importance=True,
            factor=True,
        ),
    }
)


def lookup_profile(name: object) -> EncoderProfile:
    """Return the encoder profile for an exact name, or raise :class:`FormatError`."""
    if isinstance(name, str) and name in ENCODER_PROFILES:
        return ENCODER_PROFILES[name]
    raise FormatError(
        f"unknown encoder profile {name!r}",
        hint="registered profiles: " + ", ".join(ENCODER_PROFILES),
    )


def check_profile_fits(profile: str, fmt: str) -> None:
    """Raise :class:`FormatError` unless ``profile`` may produce ``fmt``."""
    entry = lookup_profile(profile)
    lookup_format(fmt)
    if fmt not in entry.formats:
        raise FormatError(
            f"encoder profile {profile} cannot produce {fmt}",
            hint=f"{profile} produces only " + ", ".join(sorted(entry.formats)),
        )
