"""The closed table of storage layouts.

Contract: :data:`LAYOUTS` maps each registered layout name (exact, case-sensitive) to its one
layout object.  :func:`lookup_layout` refuses any other name with :class:`FormatError`;
:func:`check_combination` refuses any (format, layout) pair other than the format's registered
layout (spec Section 2: the support matrix is a closed whitelist, not a Cartesian product).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ..errors import FormatError
from ..formats import FORMATS, NumericFormat, lookup_format
from .base import Layout
from .blockscale import BLOCKSCALE_K16_M128X4_V1
from .contiguous import CONTIGUOUS_LE_V1
from .row_scale import ROW_SCALE_V1
from .row_split import ROW_SPLIT_K128_V1

__all__ = ["LAYOUTS", "check_combination", "layout_for", "lookup_layout"]


def _register(*layouts: Layout) -> Mapping[str, Layout]:
    table: dict[str, Layout] = {}
    for layout in layouts:
        if layout.name in table:  # pragma: no cover - guards an edit that duplicates a name
            raise RuntimeError(f"layout {layout.name} registered twice")
        table[layout.name] = layout
    return MappingProxyType(table)


LAYOUTS: Mapping[str, Layout] = _register(
    CONTIGUOUS_LE_V1,  # "contiguous-le-v1"
    ROW_SPLIT_K128_V1,  # "row-split-k128-v1"
    BLOCKSCALE_K16_M128X4_V1,  # "blockscale-k16-m128x4-v1"
    ROW_SCALE_V1,  # "row-scale-v1"
)
"""The closed layout registry, keyed by exact name (read-only)."""


def lookup_layout(name: object) -> Layout:
    """Return the layout registered under exactly ``name``, or raise :class:`FormatError`."""
    if isinstance(name, str) and name in LAYOUTS:
        return LAYOUTS[name]
    raise FormatError(
        f"unknown storage layout {name!r}",
        hint="registered layouts: " + ", ".join(LAYOUTS),
    )


def check_combination(fmt_name: object, layout_name: object) -> Layout:
    """Return the layout if ``layout_name`` is the registered layout of ``fmt_name``.

    Raises :class:`FormatError` for an unknown format, an unknown layout, or a pair that is not
    registered (for example BF16 with row-split-k128-v1).
    """
    fmt = lookup_format(fmt_name)
    layout = lookup_layout(layout_name)
    if fmt.layout != layout.name or fmt.name not in layout.formats:
        raise FormatError(
            f"format {fmt.name} cannot be stored with layout {layout.name}",
            hint=f"{fmt.name} is stored only with {fmt.layout}",
        )
    return layout


def layout_for(fmt: str | NumericFormat) -> Layout:
    """The registered layout of a format."""
    entry = lookup_format(fmt)
    return check_combination(entry.name, entry.layout)


if set(FORMATS) != {f for layout in LAYOUTS.values() for f in layout.formats}:  # pragma: no cover
    raise RuntimeError("every registered format needs exactly one registered layout")
