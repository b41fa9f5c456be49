"""JSON forms generated from dataclass fields: the one machinery behind the container header's
schema (container/schema.py) and the plan's JSON (recipe/entries.py).

Contract: each JSON object is a frozen dataclass whose fields carry a field spec (``Str``,
``Bool``, ``Int``, ``Seq``, ``Obj``, ``OneOf``, ``StrMap``, ``Json``, ``Opt``: :mod:`.specs`); the
:func:`schema` decorator (:mod:`.objects`) generates from those specs, once at import,
everything else the class does with JSON:

* ``to_json()`` returns plain JSON values, ready for ``json.dumps`` or the container's
  ``canonical_json`` (constant keys such as a transform's ``op`` first, then the fields in
  declaration order; a field declared ``omit_none`` is left out when it holds its default);
* ``from_json(value, where)`` validates strictly and raises
  :class:`~ninfer_convert.errors.SchemaError`; it also accepts an instance of the class, which
  it returns unchanged;
* ``checked_from_json(value, where)`` is the field-by-field validation that names the failing
  field.  Classes declared with ``fast=NAME`` also get a decoder compiled from the specs (bound
  to ``NAME`` in the class's module) that checks a plain parsed dict without building error
  paths and returns ``None`` on any doubt; ``from_json`` tries it first and falls back to the
  checked path, which finds the same problem and names it.  The fast decoder accepts exactly
  what the checked path accepts and builds the same value (tests/test_schema_fast_path.py);
* ``json_pairs()`` is the number of object members of ``to_json()``'s value, all levels
  included, without building it (the container reader compares it with the members in the
  text to find duplicate keys without a per-object hook).

Strictness: every object has a fixed key set (unknown or missing keys are errors), every value
has one JSON type (a bool is never an int, a float is never an int), integers lie in a stated
range (:mod:`.values`).  :class:`~ninfer_convert.errors.SchemaError` carries a
JSON-pointer-like location (``tensors[3].planes[0].offset``); the caller turns it into the
error of its own file or argument.

This package imports nothing of the pipeline (only :mod:`ninfer_convert.errors` and
:mod:`ninfer_convert.jsonlimits`), so every stage may use it.
"""

from __future__ import annotations

from .objects import SchemaObject, js, not_json, schema
from .specs import (
    Bool,
    CheckContext,
    DecoderSource,
    Int,
    Json,
    Obj,
    OneOf,
    Opt,
    Seq,
    Spec,
    Str,
    StrMap,
)
from .values import MAX_INT, json_pairs, json_value, paused_gc

__all__ = [
    "MAX_INT",
    "Bool",
    "CheckContext",
    "DecoderSource",
    "Int",
    "Json",
    "Obj",
    "OneOf",
    "Opt",
    "SchemaObject",
    "Seq",
    "Spec",
    "Str",
    "StrMap",
    "js",
    "json_pairs",
    "json_value",
    "not_json",
    "paused_gc",
    "schema",
]
