"""Closed tables of the recipe language: conversions, copy paths, constraints, transforms.

Contract: every name a recipe may use for a source-type conversion, a copy path or a
constraint is listed here exactly once, with its meaning.  Names are compared exactly; nothing
is parsed apart.  The numeric formats and encoder profiles themselves live in
:mod:`ninfer_convert.formats`; the copy paths are objects that carry their own units, checks
and readers, so their one table, :data:`COPY_PATHS`, is defined in :mod:`.copy_paths` and
re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .copy_paths import COPY_PATHS, CopyPath

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
