"""``derive``: the words stored for a plan entry, the shared core of ``convert`` and ``verify``.

Data flows one way: :mod:`~ninfer_convert.source` -> :mod:`~ninfer_convert.recipe` (parse,
plan) -> ``derive`` (materialise, encode, pack: the words of one plan entry, block by block)
-> :mod:`~ninfer_convert.layouts` -> :mod:`~ninfer_convert.container`.  ``convert`` writes what
this package derives and ``verify`` re-derives it, so the two cannot drift apart; neither
command imports the other.

* :mod:`.entry`: :func:`derive_logical`, :func:`derive_packed` and the block-by-block
  comparisons :func:`host_grouped_equals`, :func:`host_stream_equals`, :func:`plane_stream`.
* :mod:`.fused`: the fused encode-and-pack row-block path of grouped formats.
* :mod:`.device`: :func:`resolve_device` (``--device auto|cpu|cuda``).
* :mod:`.provenance`: :func:`provenance_of`, the provenance recorded for an entry, and
  :func:`provenance_matches`, the comparison verify makes with it (:func:`provenances`: every
  entry's, built in bulk).
"""

from __future__ import annotations

from .device import resolve_device
from .entry import (
    DerivedTensor,
    PackedTensor,
    derive_logical,
    derive_packed,
    host_grouped_equals,
    host_stream_equals,
    plane_stream,
)
from .provenance import provenance_matches, provenance_of, provenances

__all__ = [
    "DerivedTensor",
    "PackedTensor",
    "derive_logical",
    "derive_packed",
    "host_grouped_equals",
    "host_stream_equals",
    "plane_stream",
    "provenance_matches",
    "provenance_of",
    "provenances",
    "resolve_device",
]
