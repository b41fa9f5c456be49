"""The bit fields of the binary floating-point words the tool reads and writes.

Contract: :class:`BinaryFormat` is the one description of a sign / exponent / trailing-fraction
word; every mask of such a word (``0x7F800000``, ``0x7C00``, ``0x7FFFFF``, ...) is a property of
:data:`BINARY32`, :data:`BINARY16` or :data:`BFLOAT16` here, so no module writes one as a
literal.  This module imports nothing from the package (the encoder oracle, the word
conversions and the validators all use it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BFLOAT16", "BINARY16", "BINARY32", "BinaryFormat"]


@dataclass(frozen=True)
class BinaryFormat:
    """A binary floating-point word: one sign bit, ``exp_bits`` of biased exponent, then
    ``frac_bits`` of trailing fraction (IEEE 754 interchange layout)."""

    exp_bits: int
    frac_bits: int

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def exp_max(self) -> int:
        """The all-ones biased exponent (infinity and NaN)."""
        return (1 << self.exp_bits) - 1

    @property
    def sign_mask(self) -> int:
        return 1 << (self.exp_bits + self.frac_bits)

    @property
    def exp_mask(self) -> int:
        """The exponent field in place; also the word of +infinity."""
        return self.exp_max << self.frac_bits

    @property
    def frac_mask(self) -> int:
        return (1 << self.frac_bits) - 1

    @property
    def magnitude_mask(self) -> int:
        """Every bit but the sign: ``word & magnitude_mask`` is the word of ``|x|``."""
        return self.sign_mask - 1


BINARY32 = BinaryFormat(8, 23)
BINARY16 = BinaryFormat(5, 10)
BFLOAT16 = BinaryFormat(8, 7)
"""bfloat16: binary32's sign and exponent with 7 fraction bits (binary32's high half)."""
