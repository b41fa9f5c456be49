"""Where the writer puts a tensor's planes and when it starts a new shard, and the exact size an
artifact laid out by those rules takes (docs/container.md section 8, "Sharding"; section 3 for
alignment and gaps).

Contract: planes are appended at the shard's cursor, each at the next multiple of the
alignment (:func:`_placement`); a tensor that would end past ``max_shard_size`` starts a new
shard unless it would be the shard's first (:func:`_starts_new_shard`).  The writer and
:func:`planned_size` both place tensors with these two functions, so the size planned before a
convert is the size it writes (tests compare them for every format).

A header is its metadata and its tensor entries: :func:`header_json` joins the canonical JSON
of each entry (encoded once: :func:`entry_json`) into the canonical JSON of the whole header,
byte for byte.  :func:`planned_size` can hand back each entry it planned with its JSON
(:class:`PlannedEntry`, digests as placeholders of the final length); the writer fills in the
real digests of a tensor placed as planned instead of encoding its entry again at commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from ..errors import NinferError, UsageError
from ..formats import lookup_format
from ..jsonfields.objects import _maker
from ..layouts import Layout, PlaneSpec, check_combination
from .checks import check_alignment
from .entry_template import MAX_TEMPLATES, EntryTemplates, Template, fill
from .metadata_json import metadata_json as _metadata_json
from .schema import (
    ArtifactMeta,
    Header,
    IndexFile,
    IndexShard,
    PlaneEntry,
    Provenance,
    SchemaError,
    ShardInfo,
    SideFile,
    SourceRef,
    TensorEntry,
)
from .wire import DEFAULT_ALIGNMENT, PRELUDE_SIZE, align_up, canonical_json, shard_name

__all__ = [
    "INDEX_VERSION",
    "Placement",
    "PlannedEntry",
    "check_writer_alignment",
    "entry_json",
    "header_json",
    "place_tensors",
    "planned_size",
]

INDEX_VERSION = 1


def _usage(exc: SchemaError, what: str) -> NinferError:
    return exc.as_error(UsageError, what)


def check_writer_alignment(alignment: object) -> None:
    """A usable plane alignment (an int, a power of two in [64, 2^30]), else a UsageError."""
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise UsageError(f"alignment must be an int, not {alignment!r}")
    try:
        check_alignment(alignment, "alignment")
    except SchemaError as exc:
        raise _usage(exc, "ArtifactWriter") from None


def _placement(cursor: int, nbytes: Iterable[int], alignment: int) -> tuple[list[int], int]:
    """Offsets of consecutive planes appended at ``cursor`` and the end of the last one."""
    offsets = []
    for n in nbytes:
        cursor = align_up(cursor, alignment)
        offsets.append(cursor)
        cursor += n
    return offsets, cursor


_Geometry = tuple[Layout, tuple[int, ...], Sequence[PlaneSpec], tuple[int, ...]]


def _geometry_key(fmt_name: object, shape: object) -> tuple[str, tuple[int, ...]] | None:
    """The cache key of a (format, shape) whose layout answer may be reused: exact types only
    (a list, a numpy integer or a bool dimension takes the checked path every time)."""
    if type(fmt_name) is str and type(shape) is tuple and all(type(d) is int for d in shape):
        return fmt_name, shape
    return None


def _starts_new_shard(has_tensors: bool, end: int, max_shard: int | None) -> bool:
    """docs/container.md section 8, "Sharding"."""
    return max_shard is not None and has_tensors and end > max_shard


_DIGEST_PLACEHOLDER = "0" * 32  # every digest in a header or index is 32 hex digits
# A plane entry's JSON starts with its digest (keys sorted: digest, name, nbytes, offset).  In
# canonical JSON a quote inside a string is escaped, so '{"' never occurs inside a string and
# this marks exactly the placeholder digests of an entry's plane entries, in plane order.
_DIGEST_MARK = b'{"digest":"'
_PLACEHOLDER_MARK = _DIGEST_MARK + _DIGEST_PLACEHOLDER.encode("ascii") + b'"'


def entry_json(entry: TensorEntry) -> bytes:
    """The canonical JSON of one header entry, as :func:`header_json` joins it."""
    return canonical_json(entry.to_json())


# The header's keys, sorted: the metadata comes first and the tensors last.
_HEADER_KEYS = ("artifact", "files", "shard", "tensors")
if tuple(sorted(Header.KEYS)) != _HEADER_KEYS:  # pragma: no cover - the schema's keys
    raise RuntimeError("the header's keys are not artifact, files, shard and tensors")


def _header_frame(meta_json: bytes, files: tuple[SideFile, ...], shard: ShardInfo) -> bytes:
    """The canonical JSON of a header without tensors whose metadata's canonical JSON is
    ``meta_json``, up to and including the ``[`` that opens its ``tensors`` array (the last
    key: keys are sorted); the metadata, the largest part, is encoded once by the caller."""
    rest = canonical_json({"files": [f.to_json() for f in files], "shard": shard.to_json(),
                           "tensors": []})  # fmt: skip
    return b"".join((b'{"artifact":', meta_json, b",", rest[1:-2]))


def header_json(
    metadata: ArtifactMeta,
    files: tuple[SideFile, ...],
    shard: ShardInfo,
    entries: Sequence[bytes],
    *,
    metadata_json: bytes | None = None,
) -> bytes:
    """The canonical JSON of a header whose tensor entries' canonical JSON is ``entries``
    (:func:`entry_json`, in order): the bytes of ``canonical_json(Header(...).to_json())``.
    ``metadata_json``: ``canonical_json(metadata.to_json())`` when the caller has it."""
    meta = _metadata_json(metadata.to_json()) if metadata_json is None else metadata_json
    return b"".join((_header_frame(meta, files, shard), b",".join(entries), b"]}"))


# The compiled decoders' slot fillers: instances equal to the classes' own (see _maker).
_make_entry = _maker(TensorEntry)
_make_plane = _maker(PlaneEntry)


class PlannedEntry(NamedTuple):
    """A tensor entry :func:`planned_size` planned (placeholder digests) and its canonical JSON
    split at those digests (:meth:`filled`); ``pieces`` is empty when the split is not one
    piece per plane plus one.  The entry's values are kept, not the entry (the size plan of a
    large checkpoint builds no entry for most tensors): :attr:`entry` builds it."""

    name: str
    format: str
    layout: str
    shape: tuple[int, ...]
    physical: tuple[int, ...]
    role: str
    provenance: Provenance
    planes: tuple[tuple[str, int, int], ...]
    """(name, offset, nbytes) of each plane."""
    pieces: tuple[bytes, ...]

    @property
    def entry(self) -> TensorEntry:
        """The planned entry, its digests placeholders (built on each use: read ``role`` and
        ``provenance`` directly)."""
        planes = tuple(_make_plane(n, o, b, _DIGEST_PLACEHOLDER) for n, o, b in self.planes)
        values = (self.name, self.format, self.layout, self.shape, self.physical, planes,
                  self.role, self.provenance)  # fmt: skip
        entry: TensorEntry = _make_entry(*values)
        return entry

    def placed_as(self, entry: TensorEntry) -> bool:
        """Whether ``entry`` is this one but for its planes' digests."""
        planes = entry.planes
        if len(self.pieces) != len(planes) + 1 or len(planes) != len(self.planes):
            return False
        if not (
            (entry.provenance is self.provenance or entry.provenance == self.provenance)
            and (entry.name, entry.format, entry.layout, entry.shape, entry.physical, entry.role)
            == self[:6]
        ):
            return False
        for p, (name, offset, nbytes) in zip(planes, self.planes, strict=True):
            if p.offset != offset or p.nbytes != nbytes or p.name != name:
                return False
        return True

    def filled(self, entry: TensorEntry) -> bytes:
        """:func:`entry_json` of ``entry``, which must be :meth:`placed_as` this one."""
        pieces = self.pieces
        if len(pieces) == 2:  # one plane: most entries
            return b"".join((pieces[0], _DIGEST_MARK, entry.planes[0].digest.encode("ascii"),
                             b'"', pieces[1]))  # fmt: skip
        out = [pieces[0]]
        for plane, piece in zip(entry.planes, pieces[1:], strict=True):
            out += (_DIGEST_MARK, plane.digest.encode("ascii"), b'"', piece)
        return b"".join(out)


def _planned_entry(entry: TensorEntry, raw: bytes) -> PlannedEntry:
    planes = tuple((p.name, p.offset, p.nbytes) for p in entry.planes)
    return _planned(entry.name, entry.format, entry.layout, entry.shape, entry.physical,
                    entry.role, entry.provenance, planes, raw)  # fmt: skip


def _planned(
    name: str,
    fmt_name: str,
    layout: str,
    dims: tuple[int, ...],
    physical: tuple[int, ...],
    role: str,
    provenance: Provenance,
    planes: tuple[tuple[str, int, int], ...],
    raw: bytes,
) -> PlannedEntry:
    pieces = tuple(raw.split(_PLACEHOLDER_MARK))
    if len(pieces) != len(planes) + 1:
        pieces = ()
    return PlannedEntry(name, fmt_name, layout, dims, physical, role, provenance, planes, pieces)


_FastKey = tuple[Any, ...]


class _Kind(NamedTuple):
    """A kind of entry of the fast path (see :func:`_fast_key`): the objects its key names by
    id (held, so the ids stay theirs), the geometry and the template."""

    rule: object
    constraints: object
    layout: str
    dims: tuple[int, ...]
    physical: tuple[int, ...]
    plane_names: tuple[str, ...]
    sizes: list[int]
    template: Template


def _fast_key(name: object, fmt_name: object, shape: object, role: object, prov: object
              ) -> _FastKey | None:  # fmt: skip
    """The key of the fast path's kind of an entry of one source and no transform, importance
    or factor (see :func:`planned_size`), or None.  Its rule and constraints are told by
    object (the kind holds them, so their ids stay theirs); every other value is in the key,
    checked to be of the exact type a template encodes (the key's ``==`` takes 1 and True for
    one value, "a" and a str subclass's "a" too)."""
    if (
        type(prov) is not Provenance
        or type(name) is not str
        or type(role) is not str
        or type(fmt_name) is not str
        or type(shape) is not tuple
    ):
        return None
    sources, conversion, profile = prov.sources, prov.conversion, prov.encoder_profile
    if (
        type(sources) is not tuple
        or len(sources) != 1
        or type(prov.transforms) is not tuple
        or prov.transforms
        or prov.importance is not None
        or prov.factor is not None
        or prov.factor_block is not None
        or (conversion is not None and type(conversion) is not str)
        or (profile is not None and type(profile) is not str)
    ):
        return None
    src = sources[0]
    if type(src) is not SourceRef or type(src.name) is not str:
        return None
    dtype, src_shape, file = src.dtype, src.shape, src.file
    if type(dtype) is not str or type(file) is not str or type(src_shape) is not tuple:
        return None
    for d in shape:
        if type(d) is not int:
            return None
    for d in src_shape:
        if type(d) is not int:
            return None
    return (fmt_name, shape, role, id(prov.rule), id(prov.constraints), conversion, profile,
            dtype, src_shape, file)  # fmt: skip


@dataclass(frozen=True)
class Placement:
    """Where the writer puts one tensor: its 0-based shard, its planes' offsets in that shard
    and the end of its last plane."""

    shard: int
    offsets: list[int]
    end: int


def place_tensors(
    plane_sizes: Iterable[Sequence[int]], *, alignment: int, max_shard_size: int | None
) -> list[Placement]:
    """The placement of consecutive tensors with these plane sizes by the writer's own rules
    (:func:`_placement`, :func:`_starts_new_shard`): a shard's payload written elsewhere
    (:mod:`ninfer_convert.cluster`) at these offsets holds the writer's bytes."""
    check_writer_alignment(alignment)
    placed: list[Placement] = []
    shard, cursor = 0, PRELUDE_SIZE
    for sizes in plane_sizes:
        offsets, end = _placement(cursor, sizes, alignment)
        if _starts_new_shard(bool(placed), end, max_shard_size):
            shard += 1
            offsets, end = _placement(PRELUDE_SIZE, sizes, alignment)
        placed.append(Placement(shard, offsets, end))
        cursor = end
    return placed


# The fast path is inline: a helper call per tensor cost about as much as it saves.
def _place_next(
    cursors: list[int],
    shards: list[list[str]],
    json_sizes: list[int],
    sizes: Sequence[int],
    alignment: int,
    max_shard_size: int | None,
) -> tuple[list[int], int]:
    """The next tensor's plane offsets and end in :func:`planned_size`'s last shard, a new
    shard opened (its cursor, names and entry-JSON size appended) when the writer would."""
    offsets, end = _placement(cursors[-1], sizes, alignment)
    if _starts_new_shard(bool(shards[-1]), end, max_shard_size):
        cursors.append(PRELUDE_SIZE)
        shards.append([])
        json_sizes.append(0)
        offsets, end = _placement(PRELUDE_SIZE, sizes, alignment)
    return offsets, end


# long: one loop per tensor over the shard state, the fast path and the whole-entry path
def planned_size(
    tensors: Iterable[tuple[str, str, Sequence[int], str, Provenance | Mapping[str, Any]]],
    *,
    metadata: ArtifactMeta | Mapping[str, Any] | None = None,
    side_files: Iterable[tuple[str, int]],
    alignment: int = DEFAULT_ALIGNMENT,
    max_shard_size: int | None = None,
    planned: dict[str, PlannedEntry] | None = None,
    metadata_size: int | None = None,
) -> int:
    """The exact bytes an artifact of these ``(name, format, shape, role, provenance)`` tensors
    and ``(name, size)`` side files takes (shards with preludes, gaps, planes and headers, the
    index, the side files), laid out by the writer's own rules.  ``metadata`` must have the
    final shape (digests are fixed-length, so placeholders give the same size).  ``planned``,
    when given, receives every tensor's planned entry (for ``ArtifactWriter(planned=...)``).
    ``metadata_size`` instead of ``metadata``: the length of its canonical JSON, when the caller
    knows it (:func:`~ninfer_convert.artifact_metadata.planned_metadata_size`)."""
    check_writer_alignment(alignment)
    if metadata_size is None:
        if metadata is None:
            raise UsageError("planned_size needs the metadata or its size")
        if isinstance(metadata, Mapping):
            metadata = ArtifactMeta.from_json({**metadata, "alignment": alignment}, "metadata")
        metadata_size = len(_metadata_json(metadata.to_json()))  # the same in every shard
    sides = tuple(SideFile(n, s, _DIGEST_PLACEHOLDER) for n, s in sorted(side_files))
    cursors = [PRELUDE_SIZE]
    shards: list[list[str]] = [[]]  # per shard: its tensors' names
    plane_total = 0
    json_sizes = [0]  # per shard: the bytes of its entries' JSON, commas included
    geometry: dict[tuple[str, tuple[int, ...]], _Geometry] = {}
    templates = EntryTemplates()  # the entries' JSON, encoded once per kind of entry
    kinds: dict[_FastKey, _Kind] = {}  # the fast path's kinds of entries
    for name, fmt_name, shape, role, provenance in tensors:
        # An entry of a kind seen before is placed and filled into its template from the
        # kind's geometry, without building the entry.
        fast = _fast_key(name, fmt_name, shape, role, provenance)
        kind = None if fast is None else kinds.get(fast)
        if kind is not None:
            sizes = kind.sizes
            offsets, end = _place_next(
                cursors, shards, json_sizes, sizes, alignment, max_shard_size
            )
            prov = cast(Provenance, provenance)  # _fast_key admits no other
            raw = fill(kind.template, name, offsets, (prov.sources[0].name,))
            if planned is not None:
                planes: tuple[tuple[str, int, int], ...]
                if len(sizes) == 1:
                    planes = ((kind.plane_names[0], offsets[0], sizes[0]),)
                else:
                    planes = tuple(zip(kind.plane_names, offsets, sizes, strict=True))
                pieces = tuple(raw.split(_PLACEHOLDER_MARK))
                if len(pieces) != len(planes) + 1:
                    pieces = ()
                # tuple.__new__: the generated __new__'s call per entry cost a microsecond.
                planned[name] = tuple.__new__(PlannedEntry, (
                    name, fmt_name, kind.layout, kind.dims, kind.physical, role, prov, planes,
                    pieces))  # fmt: skip
        else:
            key = _geometry_key(fmt_name, shape)
            known = None if key is None else geometry.get(key)
            if known is None:
                layout = check_combination(fmt_name, lookup_format(fmt_name).layout)
                dims = layout.check_shape(fmt_name, shape)
                known = (layout, dims, layout.planes(fmt_name, dims),
                         layout.physical_extents(fmt_name, dims))  # fmt: skip
                if key is not None:
                    geometry[key] = known
            layout, dims, specs, physical = known
            sizes = [s.nbytes for s in specs]
            offsets, end = _place_next(
                cursors, shards, json_sizes, sizes, alignment, max_shard_size
            )
            entry = TensorEntry(
                name=name,
                format=fmt_name,
                layout=layout.name,
                shape=dims,
                physical=physical,
                planes=tuple(
                    PlaneEntry(s.name, o, s.nbytes, _DIGEST_PLACEHOLDER)
                    for s, o in zip(specs, offsets, strict=True)
                ),
                role=role,
                provenance=Provenance.from_json(provenance, "provenance"),
            )
            raw = templates.encode(entry)
            template = None if fast is None else templates.template(entry)
            if fast is not None and template is not None and len(kinds) < MAX_TEMPLATES:
                assert isinstance(provenance, Provenance)
                names = tuple(s.name for s in specs)
                kinds[fast] = _Kind(provenance.rule, provenance.constraints, layout.name, dims,
                                    physical, names, sizes, template)  # fmt: skip
            if planned is not None:
                planned[name] = _planned_entry(entry, raw)
        json_sizes[-1] += len(raw) + bool(shards[-1])
        shards[-1].append(name)
        plane_total += sum(sizes)
        cursors[-1] = end
    count = len(shards)
    total = sum(f.size for f in sides)
    index_shards = []
    for number, cursor in enumerate(cursors, start=1):
        frame = _header_frame(b"", sides, ShardInfo(number, count))  # all but the metadata
        size = cursor + metadata_size + len(frame) + json_sizes[number - 1] + len(b"]}")
        total += size
        index_shards.append(IndexShard(shard_name(number, count), size, _DIGEST_PLACEHOLDER))
    if count > 1:
        weight_map = {t: shard_name(n, count) for n, names in enumerate(shards, 1) for t in names}
        index = IndexFile(INDEX_VERSION, plane_total, tuple(index_shards), weight_map)
        total += len(canonical_json(index.to_json()))
    return total
