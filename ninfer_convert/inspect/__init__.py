"""``inspect``: what is inside an artifact, from its header, and one tensor's values on request.

Contract:

* :func:`summarize` reads only the header (``open_artifact`` validates it; no payload byte is
  touched): producer, recipe, source identity, files and shards, bytes on disk split into
  plane, header and alignment-gap bytes, per-format totals with logical and physical bits per
  weight, and one :class:`TensorRow` per stored tensor (optionally filtered by a glob).
* :func:`tensor_details` adds, for one tensor, its full provenance and layout details (planes
  with offsets, sizes and digests; physical extents) and value statistics: min / max / mean of
  the dequantized values (NaN and infinities counted apart), the histogram of codes and the
  count of zero-scale groups (rows for FP8).  Values are decoded in row blocks, so memory stays
  near the tensor's stored words plus one block.
* :meth:`InspectReport.to_json` is the documented, stable JSON object of ``inspect --json``
  (``schema_version`` :data:`INSPECT_SCHEMA_VERSION`, docs/cli.md); fields are only ever added.
* Bits per weight, logical and physical, per tensor and summed per format: :mod:`.summary`
  states the rules.

The package is split by job: :mod:`.report` holds the report types and their stable JSON form,
:mod:`.summary` the header-only listing, :mod:`.details` one tensor's details and value
statistics; :func:`inspect_artifact` here opens the artifact and puts them together.  It reads
through :mod:`ninfer_convert.container` only (tests/test_package_imports.py).
"""

from __future__ import annotations

import os

from ..container import check_artifact_path, open_artifact
from .details import tensor_details
from .report import (
    INSPECT_SCHEMA_VERSION,
    FormatTotals,
    InspectReport,
    PlaneDetails,
    TensorDetails,
    TensorRow,
    ValueStats,
)
from .summary import logical_bits, summarize

__all__ = [
    "INSPECT_SCHEMA_VERSION",
    "FormatTotals",
    "InspectReport",
    "PlaneDetails",
    "TensorDetails",
    "TensorRow",
    "ValueStats",
    "inspect_artifact",
    "logical_bits",
    "summarize",
    "tensor_details",
]


def inspect_artifact(
    path: str | os.PathLike[str], *, filter: str | None = None, tensor: str | None = None
) -> InspectReport:
    """Open ``path``, summarise it (header only) and, with ``tensor``, add that tensor's
    details (which reads its values)."""
    p = check_artifact_path(path)
    with open_artifact(p) as art:
        report = summarize(art, filter=filter)
        if tensor is None:
            return report
        details = tensor_details(art, tensor)
    return InspectReport(**{**report.__dict__, "details": details})
