"""Storage layouts: how each format's logical words become byte planes (docs/layouts.md).

Contract: :data:`LAYOUTS` is the one closed table of layouts; every format in
:data:`ninfer_convert.formats.FORMATS` names exactly one of them.  Each layout computes its plane
geometry from (format, logical shape) alone, packs with canonical zero padding, unpacks
bit-exactly and reports non-canonical padding.
"""

from __future__ import annotations

from .base import Buffer, Layout, PlaneSpec, logical_shape
from .blockscale import BlockscaleK16M128x4, swizzle_offset, swizzle_scales, unswizzle_scales
from .contiguous import ContiguousLE
from .registry import LAYOUTS, check_combination, layout_for, lookup_layout
from .row_scale import RowScale
from .row_split import Rows, RowSplitK128

__all__ = [
    "LAYOUTS",
    "BlockscaleK16M128x4",
    "Buffer",
    "ContiguousLE",
    "Layout",
    "PlaneSpec",
    "RowScale",
    "RowSplitK128",
    "Rows",
    "check_combination",
    "layout_for",
    "logical_shape",
    "lookup_layout",
    "swizzle_offset",
    "swizzle_scales",
    "unswizzle_scales",
]
