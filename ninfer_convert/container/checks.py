"""Semantic header checks shared by the writer and the reader (docs/container.md, "Validation").

Contract: these functions take schema-valid dataclasses and check what the schema alone cannot:
registry identities, format/layout combination, geometry against the layout, plane placement,
side-file names.  They raise :class:`~ninfer_convert.container.schema.SchemaError`; the caller
decides whether that is a usage error (writer) or an artifact error (reader).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import NinferError, UsageError
from ..formats import check_profile_fits
from ..layouts import Buffer, Layout, PlaneSpec, check_combination
from ..names import (
    MAX_NAME_CHARS,
    MAX_SIDE_FILE_CHARS,
    MAX_SIDE_FILE_DEPTH,
    side_file_key,
    side_file_path_problem,
    tensor_name_problem,
)
from .schema import Provenance, SchemaError, TensorEntry
from .wire import INDEX_NAME, MAX_ALIGNMENT, MIN_ALIGNMENT, SINGLE_NAME, align_up, parse_shard_name

# The name rules themselves live in ..names (shared with the source reader and the planner);
# their limits are re-exported here for the container's callers.
__all__ = [
    "MAX_NAME_CHARS",
    "MAX_SIDE_FILE_CHARS",
    "MAX_SIDE_FILE_DEPTH",
    "GeometryCache",
    "check_alignment",
    "check_entries_geometry",
    "check_header_tensors",
    "check_provenance",
    "check_side_file_name",
    "check_tensor_geometry",
    "check_tensor_name",
    "expected_planes",
    "side_file_key",
]


def _message(exc: NinferError) -> str:
    return exc.message + (f" ({exc.hint})" if exc.hint else "")


def check_alignment(alignment: int, where: str = "artifact.alignment") -> None:
    """Alignment must be a power of two in [MIN_ALIGNMENT, MAX_ALIGNMENT]."""
    if alignment < MIN_ALIGNMENT or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        raise SchemaError(
            where,
            f"alignment {alignment} is not a power of two in [{MIN_ALIGNMENT}, {MAX_ALIGNMENT}]",
        )


def check_tensor_name(name: str, where: str) -> None:
    """Tensor names: non-empty, at most 4096 characters, no control characters."""
    problem = tensor_name_problem(name)
    if problem is not None:
        raise SchemaError(where, problem)


def expected_planes(
    fmt: str, layout: str, shape: tuple[int, ...], where: str
) -> tuple[list[PlaneSpec], tuple[int, ...]]:
    """Planes and physical extents the layout computes; registry and shape errors -> SchemaError."""
    try:
        lay = check_combination(fmt, layout)
    except NinferError as exc:
        raise SchemaError(where, _message(exc)) from None
    try:
        return lay.planes(fmt, shape), lay.physical_extents(fmt, shape)
    except NinferError as exc:
        raise SchemaError(f"{where}.shape", _message(exc)) from None


def check_provenance(prov: Provenance, fmt: str, where: str) -> None:
    """An encoder profile, when named, must be registered and able to produce ``fmt``."""
    if prov.encoder_profile is not None:
        try:
            check_profile_fits(prov.encoder_profile, fmt)
        except NinferError as exc:
            raise SchemaError(f"{where}.encoder_profile", _message(exc)) from None


GeometryCache = dict[tuple[str, str, tuple[int, ...]], tuple[list[PlaneSpec], tuple[int, ...]]]
"""What :func:`expected_planes` computed per (format, layout, shape), shared across the entries
of one header: models repeat a few shapes thousands of times."""


def require_canonical_padding(
    layout: Layout, fmt: str, shape: Sequence[int], planes: Sequence[Buffer], tensor: str
) -> None:
    """Refuse planes whose layout padding is not all zero bits (docs/layouts.md), as every
    writer of a tensor must; a layout without padding bits has nothing to check, so its planes
    are not even viewed (a measurable part of a tiny tensor's cost)."""
    if not layout.has_padding():
        return
    problems = layout.padding_problems(fmt, shape, planes)
    if problems:
        raise UsageError(
            "packed planes have non-canonical padding: " + "; ".join(problems[:4]), tensor=tensor
        )


def check_tensor_geometry(
    entry: TensorEntry, where: str, cache: GeometryCache | None = None
) -> list[PlaneSpec]:
    """Format, layout, shape, physical extents and plane names/sizes of one header entry.

    ``cache`` (one dict per header, owned by the caller) memoizes the layout's answer for a
    (format, layout, shape); a cached answer is only ever one that passed, so every entry is
    still compared with it in full.
    """
    check_tensor_name(entry.name, f"{where}.name")
    key = (entry.format, entry.layout, entry.shape)
    known = None if cache is None else cache.get(key)
    if known is None:
        known = expected_planes(entry.format, entry.layout, entry.shape, where)
        if cache is not None:
            cache[key] = known
    specs, physical = known
    if entry.physical != physical:
        raise SchemaError(
            f"{where}.physical",
            f"physical extents {list(entry.physical)} differ from {list(physical)} computed by "
            f"{entry.layout} for shape {list(entry.shape)}",
        )
    names = [p.name for p in entry.planes]
    if names != [s.name for s in specs]:
        raise SchemaError(
            f"{where}.planes",
            f"planes {names} differ from {[s.name for s in specs]} required by {entry.layout}",
        )
    for i, (plane, spec) in enumerate(zip(entry.planes, specs, strict=True)):
        if plane.nbytes != spec.nbytes:
            raise SchemaError(
                f"{where}.planes[{i}].nbytes",
                f"plane {plane.name!r} declares {plane.nbytes} bytes but {entry.layout} "
                f"computes {spec.nbytes} for {entry.format} {list(entry.shape)}",
            )
    check_provenance(entry.provenance, entry.format, f"{where}.provenance")
    return specs


def check_entries_geometry(
    entries: Sequence[TensorEntry], where: Callable[[TensorEntry], str], cache: GeometryCache
) -> None:
    """:func:`check_tensor_geometry` of each of ``entries`` (``where(entry)`` names it in a
    message), in bulk: the names joined for one control-character scan, each entry compared
    with its (format, layout, shape)'s answer, kept in ``cache`` with its plane names and
    sizes.  Any doubt runs :func:`check_tensor_geometry` itself, which raises the problem it
    always raised; a pass only ever answers "all clear"."""
    names = [e.name for e in entries]
    sound = bool(names) and min(map(len, names)) >= 1 and max(map(len, names)) <= MAX_NAME_CHARS
    if not sound or _CONTROL_CHAR.search("".join(names)) is not None:
        for entry in entries:
            check_tensor_geometry(entry, where(entry), cache)
        return
    planes_of = _planes_of
    for entry in entries:
        key = (entry.format, entry.layout, entry.shape)
        known = planes_of.get(key) if key in cache else None
        if (
            known is None
            or entry.physical != known[0]
            or tuple([(p.name, p.nbytes) for p in entry.planes]) != known[1]
        ):
            specs = check_tensor_geometry(entry, where(entry), cache)  # raises any problem
            if len(planes_of) >= 4096:  # a bound; models repeat a few shapes
                planes_of.clear()
            planes_of[key] = (cache[key][1], tuple([(p.name, p.nbytes) for p in specs]))
        elif entry.provenance.encoder_profile is not None:
            check_provenance(entry.provenance, entry.format, f"{where(entry)}.provenance")


_planes_of: dict[tuple[str, str, tuple[int, ...]], tuple[tuple[int, ...], tuple[Any, ...]]] = {}
"""(format, layout, shape) -> (physical extents, (plane name, bytes) pairs) of answers that
passed :func:`check_tensor_geometry` (the registry's answer: the same for every header)."""


def check_header_tensors(
    tensors: Sequence[TensorEntry], alignment: int, start: int, end: int
) -> int:
    """Every check of a header's tensor list, in the reader's order, and the end of the last
    plane: per entry (index order) a repeated name, then :func:`check_tensor_geometry`; then
    :func:`check_placement`.  The first problem that order meets is raised.

    A 100,000-tensor header is checked in bulk first (names joined into one string for the
    control-character scan, geometry compared per distinct (format, layout, shape), plane
    offsets as numpy arrays); that pass only ever answers "all clear", and any doubt runs the
    entry-by-entry checks, which raise the very problem they always raised."""
    if not _all_clear(tensors, alignment, start, end):
        names: set[str] = set()
        layouts: GeometryCache = {}
        for i, t in enumerate(tensors):
            if t.name in names:
                raise SchemaError(f"tensors[{i}].name", f"duplicate tensor name {t.name!r}")
            names.add(t.name)
            check_tensor_geometry(t, f"tensors[{i}]", layouts)
        return check_placement(tensors, alignment, start, end)
    last = tensors[-1].planes[-1] if tensors and tensors[-1].planes else None
    if last is None:  # an entry without planes: the exact walk computes the cursor
        return check_placement(tensors, alignment, start, end)
    return last.offset + last.nbytes


def _all_clear(tensors: Sequence[TensorEntry], alignment: int, start: int, end: int) -> bool:
    """Whether :func:`check_header_tensors`'s exact checks would all pass (``False``: maybe
    not, run them)."""
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        return False
    if names and (min(map(len, names)) < 1 or max(map(len, names)) > MAX_NAME_CHARS):
        return False
    if _CONTROL_CHAR.search("".join(names)) is not None:  # one in the join is one in a name
        return False
    expected: dict[tuple[str, str, tuple[int, ...]], tuple[tuple[int, ...], tuple[Any, ...]]]
    expected = {}
    profiles: set[tuple[str, str]] = set()
    offsets: list[int] = []
    sizes: list[int] = []
    for t in tensors:
        key = (t.format, t.layout, t.shape)
        known = expected.get(key)
        if known is None:
            try:
                specs, physical = expected_planes(t.format, t.layout, t.shape, "")
            except SchemaError:
                return False
            known = expected[key] = (physical, tuple((p.name, p.nbytes) for p in specs))
        if t.physical != known[0]:
            return False
        planes = t.planes
        if len(planes) != len(known[1]):
            return False
        for plane, (name, nbytes) in zip(planes, known[1], strict=True):
            if plane.name != name or plane.nbytes != nbytes:
                return False
            offsets.append(plane.offset)
            sizes.append(nbytes)
        profile = t.provenance.encoder_profile
        if profile is not None:
            profiles.add((profile, t.format))
    for profile, fmt in profiles:
        try:
            check_profile_fits(profile, fmt)
        except NinferError:
            return False
    if not offsets:
        return False
    # Placement: each plane at align_up(end of the previous one), the first at
    # align_up(start), every plane ending by ``end``.  Offsets and sizes are below 2**63, so
    # their sums fit uint64; once every end is at most ``end`` (< 2**63) so is every cursor.
    off = np.array(offsets, dtype=np.uint64)
    stop = off + np.array(sizes, dtype=np.uint64)
    if int(stop.max()) > end:
        return False
    cursor = np.empty_like(off)
    cursor[0] = start
    cursor[1:] = stop[:-1]
    mask = np.uint64(alignment - 1)
    return bool(np.array_equal((cursor + mask) & ~mask, off))


_CONTROL_CHAR = re.compile("[\x00-\x1f\x7f]")
"""The control characters names.tensor_name_problem refuses (the same class)."""


def check_placement(tensors: Iterable[TensorEntry], alignment: int, start: int, end: int) -> int:
    """Check that planes sit at their canonical offsets; return the end of the last plane.

    Plane i (in header order) must start at ``align_up(end of plane i-1, alignment)`` (the
    first at ``align_up(start, alignment)``) and end at or before ``end``.  The distinct
    messages say what is wrong: misaligned, overlapping, out of range, or merely not canonical.
    """
    cursor = start
    for t_index, entry in enumerate(tensors):
        for p_index, plane in enumerate(entry.planes):
            where = f"tensors[{t_index}].planes[{p_index}]"
            what = f"tensor {entry.name!r} plane {plane.name!r}"
            if plane.offset % alignment:
                raise SchemaError(
                    f"{where}.offset",
                    f"{what} offset {plane.offset} is not a multiple of the alignment {alignment}",
                )
            if plane.offset < cursor:
                raise SchemaError(
                    f"{where}.offset",
                    f"{what} [{plane.offset}, {plane.offset + plane.nbytes}) overlaps the "
                    f"prelude or the previous plane, which ends at {cursor}",
                )
            if plane.offset + plane.nbytes > end:
                raise SchemaError(
                    f"{where}.offset",
                    f"{what} [{plane.offset}, {plane.offset + plane.nbytes}) lies beyond the "
                    f"payload region, which ends at byte {end}",
                )
            expected = align_up(cursor, alignment)
            if plane.offset != expected:
                raise SchemaError(
                    f"{where}.offset",
                    f"{what} starts at {plane.offset} but the canonical offset is {expected} "
                    "(planes are packed at the next aligned offset; no other gaps)",
                )
            cursor = plane.offset + plane.nbytes
    return cursor


_WRITER_TEMPORARY = re.compile(r"shard-\d{5,}\.partial")
"""The names ``ArtifactWriter`` gives shards while they are written (in the same folder as
the side files until commit)."""


def check_side_file_name(name: str, where: str) -> None:
    """A side file name is a relative path of plain components that cannot be mistaken for a
    container file (docs/container.md section 4.6)."""
    problem = side_file_path_problem(name)
    if problem is not None:
        raise SchemaError(where, problem)
    if _WRITER_TEMPORARY.fullmatch(name.casefold()):
        raise SchemaError(where, f"side file name {name!r} is the writer's temporary shard name")
    # Every component: a folder named model.ninfer would take the container file's place.
    for folded in name.casefold().split("/"):
        if (
            folded in (SINGLE_NAME, INDEX_NAME)
            or parse_shard_name(folded) is not None
            or folded.endswith(".ninfer")
        ):
            raise SchemaError(where, f"side file name {name!r} is reserved for container files")
