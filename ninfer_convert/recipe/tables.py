"""Closed tables of the recipe language: conversions, copy paths, constraints, transforms.

Contract: every name a recipe may use for a source-type conversion, a copy path or a
constraint is listed here exactly once, with its meaning.  Names are compared exactly; nothing
is parsed apart.  The numeric formats and encoder profiles themselves live in
:mod:`ninfer_convert.formats`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "CONSTRAINTS",
    "CONVERSIONS",
    "COPY_PATHS",
    "DIRECT_SAME_SOURCE",
    "FINITE_ONLY",
    "GROUPED_SOURCES",
    "TRANSFORMS",
    "Conversion",
    "CopyPath",
]


@dataclass(frozen=True)
class Conversion:
    """A source-type conversion a recipe may request for a direct format (spec Section 3.1)."""

    name: str
    sources: frozenset[str]
    """safetensors dtypes it takes."""
    target: str
    """The direct format it produces."""
    lossy: bool
    """True when it rounds (and so needs cited evidence)."""
    rounds_to_bf16: bool
    description: str


CONVERSIONS: Mapping[str, Conversion] = MappingProxyType(
    {
        c.name: c
        for c in (
            Conversion(
                "f32-to-bf16-rne",
                frozenset({"F32"}),
                "BF16",
                True,
                True,
                "binary32 -> BF16, round to nearest, ties to even; non-finite sources refused "
                "unless keep_nonfinite; a finite value that would round to infinity is refused",
            ),
            Conversion(
                "f16-to-bf16-rne",
                frozenset({"F16"}),
                "BF16",
                True,
                True,
                "binary16 -> binary32 (exact) -> BF16 round to nearest, ties to even; "
                "non-finite sources refused unless keep_nonfinite",
            ),
            Conversion(
                "bf16-to-f32",
                frozenset({"BF16"}),
                "FP32",
                False,
                False,
                "BF16 -> binary32, exact (the word becomes the high half)",
            ),
            Conversion(
                "f16-to-f32",
                frozenset({"F16"}),
                "FP32",
                False,
                False,
                "binary16 -> binary32, exact (subnormals, infinities and NaN payloads kept)",
            ),
            Conversion(
                "int-to-i32",
                frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I64", "U64"}),
                "I32",
                False,
                False,
                "integer or bool -> I32 with a range check; a value outside I32 is refused "
                "(never wrapped, truncated or saturated)",
            ),
        )
    }
)

DIRECT_SAME_SOURCE: Mapping[str, str] = MappingProxyType(
    {"BF16": "BF16", "FP32": "F32", "I32": "I32"}
)
"""Direct format -> the source dtype it stores by bitwise copy, without any conversion."""

GROUPED_SOURCES = frozenset({"BF16", "F16", "F32"})
"""Source dtypes a grouped encoder takes (it widens them to binary32 exactly, spec Section 7)."""


@dataclass(frozen=True)
class CopyPath:
    """A copy of already-quantized words from a known producer's tensors."""

    name: str
    format: str
    description: str


COPY_PATHS: Mapping[str, CopyPath] = MappingProxyType(
    {
        c.name: c
        for c in (
            CopyPath(
                "compressed-tensors-nvfp4",
                "NVFP4",
                "compressed-tensors nvfp4-pack-quantized: X.weight_packed U8 [N, K/2] (element "
                "2j in the low nibble), X.weight_scale F8_E4M3 [N, K/16], X.weight_global_scale "
                "F32 [1] (already a divisor) -> output X.weight",
            ),
            CopyPath(
                "modelopt-nvfp4",
                "NVFP4",
                "ModelOpt NVFP4: X.weight U8 [N, K/2] (element 2j in the low nibble), "
                "X.weight_scale F8_E4M3 [N, K/16], X.weight_scale_2 F32 scalar multiplier whose "
                "reciprocal must be exact in binary32 -> output X.weight",
            ),
            CopyPath(
                "compressed-tensors-fp8-channel",
                "FP8_E4M3FN_ROW_BF16S",
                "compressed-tensors channel-wise FP8: X.weight F8_E4M3 [N, K], X.weight_scale "
                "F32/BF16/F16 [N, 1] multiplier that must be an exact BF16 -> output X.weight",
            ),
        )
    }
)

FINITE_ONLY = "finite-only"
CONSTRAINTS: Mapping[str, str] = MappingProxyType(
    {FINITE_ONLY: "every stored value must be finite (no infinity, no NaN)"}
)

TRANSFORMS: Mapping[str, str] = MappingProxyType(
    {
        "transpose": "swap the two axes of a rank-two tensor",
        "reshape": "reshape to rank two, [rows, cols]; one entry may be -1 (inferred)",
    }
)
