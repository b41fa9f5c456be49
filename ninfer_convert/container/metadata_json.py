"""The canonical JSON of the artifact metadata, its source-tensor map encoded per kind of entry.

Contract: :func:`metadata_json` returns ``canonical_json(value)`` byte for byte, raising what
it raises (``TypeError`` / ``ValueError`` for a value that is not JSON, ``UnicodeEncodeError``
for a lone surrogate).  The ``source.tensors`` map (one ``{"digest", "dtype", "shape"}`` object
per digested source tensor) is encoded without ``json.dumps``: its keys are sorted as
``sort_keys`` sorts them, each key and digest is encoded as ``json.dumps`` encodes a string,
and the rest of each object is the canonical JSON of its ``dtype`` and ``shape``, encoded once
per (dtype, shape).  Everything else is ``canonical_json`` of the metadata with a marker string
in place of that map.  Any doubt falls back to encoding the whole value: a key or a digest that
is not an exact ``str``, an object of other keys, a dtype or shape of another type than exact
``str`` and a list of exact ``int``, or a marker that does not occur exactly once.

:func:`source_tensors_size` is the length of that map's canonical JSON for one digest in every
entry (the size plan's placeholders), from three ``json.dumps`` of lists.

Why: at 100,000 source tensors ``json.dumps(..., sort_keys=True)`` of the metadata cost about
3.6 us per tensor, and convert encoded it four times (the size plan, the check of the final
metadata, and once per shard header at commit; the last two now share one encoding).
"""

from __future__ import annotations

import json.encoder
from collections.abc import Sequence
from typing import Any

from .wire import canonical_json

__all__ = ["metadata_json", "source_tensors_size"]

_encode_str = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) uses
_MARK = "\x00\x01source tensors\x01\x00"  # control characters: escaped, so never a real value
_MARK_JSON = _encode_str(_MARK).encode("ascii")
_KEYS = {"digest": 0, "dtype": 0, "shape": 0}.keys()


def metadata_json(value: Any) -> bytes:
    """``canonical_json(value)`` of an artifact metadata value (see the module contract)."""
    source = value.get("source") if type(value) is dict else None
    if type(source) is not dict:
        return canonical_json(value)
    tensors = source.get("tensors")
    if type(tensors) is not dict or not tensors:
        return canonical_json(value)
    try:
        body = _tensors_json(tensors)
        outer = (
            b""
            if body is None
            else canonical_json({**value, "source": {**source, "tensors": _MARK}})
        )
    except (TypeError, ValueError):
        # Raised as the whole raises it: the first bad value in its order, at its position (a
        # lone surrogate's position counts the map's bytes when it comes after the map).
        body = None
    if body is None:
        return canonical_json(value)
    pieces = outer.split(_MARK_JSON)
    if len(pieces) != 2:  # the marker's text occurs elsewhere too
        return canonical_json(value)
    return b"".join((pieces[0], body, pieces[1]))


def _tensors_json(tensors: dict[Any, Any]) -> bytes | None:
    """The canonical JSON of the source-tensor map, or None when it takes the whole path."""
    tails: dict[tuple[str | int, ...], str] = {}
    out = []
    try:
        names = sorted(tensors)
    except TypeError:
        return None
    for name in names:
        item = tensors[name]
        if type(name) is not str or type(item) is not dict or item.keys() != _KEYS:
            return None
        digest, dtype, shape = item["digest"], item["dtype"], item["shape"]
        if type(digest) is not str or type(dtype) is not str or type(shape) is not list:
            return None
        # Checked every time: (True,) and (1,) are one key of ``tails``.
        for d in shape:
            if type(d) is not int:
                return None
        key = (dtype, *shape)
        tail = tails.get(key)
        if tail is None:
            # '{"digest":...' comes first: "digest" sorts before "dtype" and "shape".
            tail = tails[key] = "," + canonical_json({"dtype": dtype, "shape": shape})[1:].decode()
        out.append(_encode_str(name) + ':{"digest":' + _encode_str(digest) + tail)
    try:
        return ("{" + ",".join(out) + "}").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: json.dumps's own error, from the whole
        return None


def source_tensors_size(tensors: Sequence[tuple[str, Any, Any]], digest: str) -> int:
    """``len(canonical_json(m))`` of the source-tensor map ``m`` whose entries are
    ``name: {"digest": digest, "dtype": dtype, "shape": shape}`` for these ``(name, dtype,
    shape)`` of distinct names, without building it: every entry's object has the same keys
    and digest, and the names, dtypes and shapes are encoded by one ``json.dumps`` of a list
    each (a list's items are encoded as they are inside a map, and joined by one comma)."""
    count = len(tensors)
    if count == 0:
        return 2  # {}

    def total(values: list[Any]) -> int:  # of the items' encodings
        return len(canonical_json(values)) - 2 - (count - 1)

    names = total([t[0] for t in tensors])
    dtypes = total([t[1] for t in tensors])
    shapes = total([list(t[2]) for t in tensors])
    fixed = len(b'{"digest":') + len(_encode_str(digest).encode("utf-8"))
    fixed += len(b',"dtype":') + len(b',"shape":') + len(b"}") + len(b":")
    return 2 + (count - 1) + names + dtypes + shapes + count * fixed
