"""The canonical JSON of many header entries that differ only in their names, plane offsets and
source names, encoded once per kind of entry.

Contract: :meth:`EntryTemplates.encode` returns ``canonical_json(entry.to_json())``, byte for
byte.  Entries whose every other value is equal (format, layout, shape, physical extents, plane
names, sizes and digests, role, and the provenance but for its sources' names) share one
template: that entry's canonical JSON with a marker in place of each varying value, split at
the markers.  An entry is then the template's pieces joined with its own name, offsets and
source names encoded as ``json.dumps`` encodes them (a key's place in the sorted object does
not depend on its value, and arrays keep their order).  Any doubt falls back to encoding the
entry whole: a value of an inexact type (a ``str`` or ``int`` subclass, a bool; any value of
the entry that is not an exact ``int``, ``str`` or None, since the cache's ``==`` takes 1, 1.0
and True for one value), a template in which a marker does not occur exactly once (a rule
pattern holding the marker's text, a dimension equal to an offset marker), or an unhashable
value.

Why: a 100,000-tensor checkpoint of one-element tensors spent about 23 us per entry in
``json.dumps`` (the size plan encodes every entry once), about a tenth of convert's CPU.
"""

from __future__ import annotations

import dataclasses
import json.encoder
import re
from collections.abc import Sequence
from typing import Any

from .schema import (
    ConcatTransform,
    CopyQuantizedTransform,
    PlaneEntry,
    Provenance,
    ReshapeTransform,
    RuleRef,
    SourceRef,
    TensorEntry,
    TransposeTransform,
)
from .wire import MAX_INT, canonical_json

__all__ = ["MAX_TEMPLATES", "EntryTemplates", "Template", "fill"]

# ``json.dumps(..., ensure_ascii=False)`` encodes every string with this function (the C one
# when the accelerator is built), so a value encoded alone is the bytes it has inside the whole.
_encode_str = json.encoder.encode_basestring

# Markers: strings no real name holds (control characters, escaped as \u00XX in JSON) and
# integers at the top of the schema's range; each must occur exactly once in a template.
_NAME = "\x00\x01name\x01\x00"
_SOURCE = "\x00\x01source{}\x01\x00"
_OFFSET_BASE = MAX_INT - 4096  # offsets markers count up from here (at most 4096 planes)

MAX_TEMPLATES = 4096
"""Templates kept per size plan: entries whose fixed values all differ (a per-tensor importance
digest, say) would otherwise keep a second copy of every entry's JSON and gain nothing."""

_PROV_FIELDS = tuple(f.name for f in dataclasses.fields(Provenance) if f.name != "sources")
Template = tuple[tuple[bytes, ...], tuple[tuple[str, int], ...]]
"""The pieces between the markers, and which value goes after each piece but the last:
("name", 0), ("offset", plane index) or ("source", source index)."""


class EntryTemplates:
    """A cache of entry templates (see the module contract); one per size plan."""

    def __init__(self) -> None:
        self._templates: dict[tuple[Any, ...], Template | None] = {}

    def encode(self, entry: TensorEntry) -> bytes:
        """``canonical_json(entry.to_json())``."""
        template = self.template(entry)
        if template is None:
            return canonical_json(entry.to_json())
        return _fill(template, entry)

    def template(self, entry: TensorEntry) -> Template | None:
        """The template of ``entry``'s kind (made now if new), or None when it has none: see
        :func:`fill` for entries of the same kind."""
        try:
            key = _key(entry)
            known = key is not None and key in self._templates
        except TypeError:  # an unhashable or odd value somewhere: no template for it
            key = None
        if key is None:
            return None
        if known:
            return self._templates[key]
        if len(self._templates) >= MAX_TEMPLATES:
            return None
        template = self._templates[key] = _template(entry)
        return template


def _key(entry: TensorEntry) -> tuple[Any, ...] | None:
    """Everything of ``entry`` but its name, offsets and source names; None when a varying
    value is not of exactly the type the fill encodes."""
    if type(entry) is not TensorEntry or type(entry.name) is not str:
        return None
    prov = entry.provenance
    if type(prov) is not Provenance:
        return None
    # The key compares fixed values with ==, under which 1, 1.0 and True are one value that
    # json spells three ways: every value in it must be an exact int, str or None (equal
    # values of one of these types have one spelling).
    rule = prov.rule
    if type(rule) is not RuleRef or not all(map(_plain_transform, prov.transforms)):
        return None
    values = [
        *entry.shape, *entry.physical, rule.index, rule.line, rule.pattern, *prov.constraints,
        entry.format, entry.layout, entry.role, prov.conversion, prov.encoder_profile,
        prov.importance, prov.factor, prov.factor_block,
    ]  # fmt: skip
    planes = []
    for p in entry.planes:
        if type(p) is not PlaneEntry or type(p.offset) is not int:
            return None
        values += (p.name, p.nbytes, p.digest)
        planes.append((p.name, p.nbytes, p.digest))
    sources = []
    for s in prov.sources:
        if type(s) is not SourceRef or type(s.name) is not str:
            return None
        values += (s.dtype, s.file, *s.shape)
        sources.append((s.dtype, s.shape, s.file))
    if not set(map(type, values)) <= _PLAIN:
        return None
    return (
        entry.format,
        entry.layout,
        entry.shape,
        entry.physical,
        tuple(planes),
        entry.role,
        tuple(sources),
        *[getattr(prov, f) for f in _PROV_FIELDS],
    )


_PLAIN = frozenset((int, str, type(None)))


def _ints(values: tuple[object, ...]) -> bool:
    return all(type(v) is int for v in values)


def _plain_transform(t: object) -> bool:
    """A transform whose numbers are exact ints (see :func:`_key`)."""
    if type(t) is ConcatTransform:
        return type(t.axis) is int
    if type(t) is ReshapeTransform:
        return _ints(t.shape)
    if type(t) is CopyQuantizedTransform:
        return type(t.scheme) is str
    return type(t) is TransposeTransform


def _template(entry: TensorEntry) -> Template | None:
    """The pieces of ``entry``'s JSON around its varying values, or None (see the contract)."""
    if len(entry.planes) > 4096:
        return None
    prov = entry.provenance
    marked = dataclasses.replace(
        entry,
        name=_NAME,
        planes=tuple(
            dataclasses.replace(p, offset=_OFFSET_BASE + i) for i, p in enumerate(entry.planes)
        ),
        provenance=dataclasses.replace(
            prov,
            sources=tuple(
                dataclasses.replace(s, name=_SOURCE.format(i)) for i, s in enumerate(prov.sources)
            ),
        ),
    )
    raw = canonical_json(marked.to_json())
    marks: dict[bytes, tuple[str, int]] = {_encode_str(_NAME).encode(): ("name", 0)}
    for i in range(len(entry.planes)):
        marks[str(_OFFSET_BASE + i).encode()] = ("offset", i)
    for i in range(len(prov.sources)):
        marks[_encode_str(_SOURCE.format(i)).encode()] = ("source", i)
    found = re.split(b"(" + b"|".join(re.escape(m) for m in marks) + b")", raw)
    pieces, slots = tuple(found[0::2]), tuple(marks[m] for m in found[1::2])
    if len(slots) != len(marks) or len(set(slots)) != len(marks):
        return None  # a marker's text occurs elsewhere too: encode such entries whole
    # Markers only ever stand for whole values, so the pieces must not run into them.
    return pieces, slots


# The slots of an entry of one plane and one source (keys sorted: name, planes, provenance).
_ONE_PLANE_ONE_SOURCE = (("name", 0), ("offset", 0), ("source", 0))


def _fill(template: Template, entry: TensorEntry) -> bytes:
    offsets = [p.offset for p in entry.planes]
    return fill(template, entry.name, offsets, [s.name for s in entry.provenance.sources])


def fill(template: Template, name: str, offsets: Sequence[int], sources: Sequence[str]) -> bytes:
    """The JSON of the entry of ``template``'s kind with this name, these plane offsets and
    these source names (exact ``str`` and ``int`` values: the caller's to check), without
    building the entry: ``EntryTemplates.encode`` of it."""
    pieces, slots = template
    name_json = _encode_str(name).encode("utf-8")
    if slots == _ONE_PLANE_ONE_SOURCE:  # most entries: no loop
        source = sources[0]
        source_json = name_json if source == name else _encode_str(source).encode("utf-8")
        offset = str(offsets[0]).encode("ascii")
        return b"".join((pieces[0], name_json, pieces[1], offset, pieces[2], source_json,
                         pieces[3]))  # fmt: skip
    out = [pieces[0]]
    for (what, i), piece in zip(slots, pieces[1:], strict=True):
        if what == "offset":
            out.append(str(offsets[i]).encode("ascii"))
        elif what == "name":
            out.append(name_json)
        else:
            source = sources[i]
            # A tensor copied under its own name: the same string, encoded once.
            out.append(name_json if source == name else _encode_str(source).encode("utf-8"))
        out.append(piece)
    return b"".join(out)
