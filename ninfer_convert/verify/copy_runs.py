"""Direct copies of a batch of small tensors checked as one unit, for ``verify``'s runner.

A *direct copy* is a plan entry whose stored words are its one source tensor's bytes as they
are: a direct format with no conversion, no transform, no copy path, the source dtype the
format stores bitwise, and no finite-only constraint to test (:func:`copy_entry`).  For such a
tensor the per-tensor checks (:func:`~.tensor_checks.check_tensor`) come to three equalities
of one byte string, the source tensor's raw bytes ``b``:

* its source digest, ``xxh3-128:`` + xxh3-128(``b``), equals the recorded one;
* its stored plane is ``b`` byte for byte (the re-derivation is ``b``);
* its stored plane digest equals xxh3-128(``b``): the digest of the stored bytes, as they are
  the same bytes (the container and source digests are both xxh3-128, seed 0).

Contract of :func:`checked_copies`: for the direct copies of ``names`` whose source bytes
came from one ``pread`` per run of neighbouring source tensors
(:meth:`~ninfer_convert.source.SourceCheckpoint.preread_bytes`) and for which all three hold,
the outcome :func:`~.tensor_checks.check_tensor` returns (compared, no finding), by name.  Any
other tensor (not a direct copy, not read ahead, or one equality false) is left out: the
caller checks it on its own, so every finding of a tensor that differs is built by the one
per-tensor path, with its exact text, and only for that tensor.
"""

from __future__ import annotations

import functools
import mmap
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..container import Artifact
from ..container.wire import SOURCE_DIGEST_PREFIX, digest_hex
from ..formats import lookup_format
from ..layouts import lookup_layout
from ..recipe.tables import DIRECT_SAME_SOURCE, FINITE_ONLY
from ..source.checkpoint import SMALL_READ_BYTES
from .tensor_checks import SourceContext, TensorOutcome

if TYPE_CHECKING:
    from ..recipe import PlanEntry

__all__ = ["checked_copies", "copy_entry"]

_LITTLE = sys.byteorder == "little"
"""Stored words are little-endian; the source words are compared as read only on a
little-endian host (elsewhere every tensor takes the per-tensor path)."""


@functools.lru_cache(maxsize=256)
def _copies_bitwise(fmt: str, dtype: str, finite_only: bool) -> bool:
    """Whether a direct ``fmt`` made without conversion from ``dtype`` stores the source
    bytes unchecked (materialize's ``_convert`` returns the words themselves and
    ``stream_direct`` tests them only under a finite-only constraint on BF16 / FP32)."""
    if lookup_format(fmt).is_grouped or DIRECT_SAME_SOURCE.get(fmt) != dtype:
        return False
    return not (finite_only and fmt in ("BF16", "FP32"))


@functools.lru_cache(maxsize=4096)
def _plane_sizes(format_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Bytes of each plane of the layout, cached per (format, shape) (as the re-derivation's
    own comparison checks them): a checkpoint repeats a few shapes many times."""
    fmt = lookup_format(format_name)
    return tuple(spec.nbytes for spec in lookup_layout(fmt.layout).planes(fmt, shape))


def copy_entry(entry: PlanEntry) -> bool:
    """Whether ``entry`` is a direct copy (see the module contract)."""
    if (
        not _LITTLE
        or entry.copy is not None
        or entry.conversion is not None
        or entry.transforms
        or len(entry.sources) != 1
    ):
        return False
    src = entry.sources[0]
    if src.shape != entry.shape:
        return False
    return _copies_bitwise(entry.format, src.dtype, FINITE_ONLY in entry.constraints)


def checked_copies(
    art: Artifact, ctx: SourceContext, names: tuple[str, ...]
) -> dict[str, TensorOutcome]:
    """The outcomes of the direct copies of ``names`` proven equal (see the module contract)."""
    entries, source, recorded = ctx.entries, ctx.source, ctx.recorded
    tensors, stored = art.tensors, source.tensors
    # (name, source tensor, plane, stored file) of each candidate: what the equalities need.
    candidates = []
    for name in names:
        entry = entries.get(name)
        if entry is None or not copy_entry(entry):
            continue
        src = entry.sources[0]
        sname = src.name
        sinfo = stored.get(sname)
        if (
            sinfo is None
            or sinfo.dtype != src.dtype
            or sinfo.shape != src.shape
            or not 0 < sinfo.nbytes <= SMALL_READ_BYTES
            or sname not in recorded
        ):
            continue
        info = tensors[name]
        planes = info.planes
        if len(planes) != 1 or planes[0].nbytes != sinfo.nbytes:
            continue
        if (sinfo.nbytes,) != _plane_sizes(entry.format, entry.shape):
            continue
        candidates.append((name, sinfo, planes[0], info.file))
    if len(candidates) < 2:
        return {}
    raw = source.preread_bytes(c[1] for c in candidates)
    done: dict[str, TensorOutcome] = {}
    maps: dict[Path, mmap.mmap] = {}
    for name, sinfo, plane, file in candidates:
        b = raw.get(sinfo.name)
        if b is None:
            continue
        h = digest_hex(b)
        if h != plane.digest or SOURCE_DIGEST_PREFIX + h != recorded[sinfo.name]:
            continue
        mm = maps.get(file)
        if mm is None:
            mm = maps[file] = art.mapping_of(name)
        offset = plane.offset
        if mm[offset : offset + plane.nbytes] != b:
            continue
        done[name] = TensorOutcome(name, integrity=[], compared=True)
    return done
