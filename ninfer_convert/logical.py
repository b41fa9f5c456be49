"""Logical (layout-independent) tensor representations shared by encoders, layouts and readers.

Contract: these are the exact words of spec Sections 3-6 in logical order, before any storage
layout packs them and after any layout unpacks them.  Every layout's ``pack`` takes one of these
and every reader's ``read`` returns one, so a round trip is an equality of these fields.

=================================  ==========================================================
format                             logical representation
=================================  ==========================================================
BF16 / FP32 / I32                  :class:`DirectWords`: ``words`` uint16 / uint32 / int32,
                                   any shape (0-D included)
Q4G64/Q5G64/Q6G64/W8G32_F16S       :class:`GroupedCodes`: ``codes`` int8 [N, K] signed codes,
                                   ``scales`` uint16 binary16 words [N, ceil(K/G)]
NVFP4                              :class:`NVFP4Words`: ``codes`` uint8 E2M1 words (0..15)
                                   [N, K], ``scales`` uint8 E4M3FN words [N, K/16]
                                   (natural order, un-swizzled), ``divisor`` binary32 word
FP8_E4M3FN_ROW_BF16S               :class:`FP8RowWords`: ``codes`` uint8 E4M3FN [N, K],
                                   ``scales`` uint16 BF16 words [N]
=================================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["DirectWords", "FP8RowWords", "GroupedCodes", "LogicalTensor", "NVFP4Words"]


@dataclass(frozen=True, eq=False)
class DirectWords:
    words: npt.NDArray[np.generic]


@dataclass(frozen=True, eq=False)
class GroupedCodes:
    codes: npt.NDArray[np.int8]
    scales: npt.NDArray[np.uint16]


@dataclass(frozen=True, eq=False)
class NVFP4Words:
    codes: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.uint8]
    divisor: int
    """The binary32 word of d_w as an unsigned int (e.g. 0x3F800000 for 1.0)."""


@dataclass(frozen=True, eq=False)
class FP8RowWords:
    codes: npt.NDArray[np.uint8]
    scales: npt.NDArray[np.uint16]


LogicalTensor = DirectWords | GroupedCodes | NVFP4Words | FP8RowWords
