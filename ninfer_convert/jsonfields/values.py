"""Plain JSON values: the checks every field spec is built from, and free-form JSON.

Contract: each ``check_*`` function takes a parsed JSON value and its location ``where`` (a
JSON-pointer-like path such as ``tensors[3].planes[0].offset``) and returns the value or raises
:class:`~ninfer_convert.errors.SchemaError` with that location and a message naming what was
expected and what was found.  JSON types are strict: a bool is never an int, a float is never an
int, integers lie in a stated range (by default ``[0, MAX_INT]``).  :func:`json_value` validates
and copies free-form JSON (object keys strings, finite numbers, at most
:data:`~ninfer_convert.jsonlimits.MAX_JSON_DEPTH` nested levels); :func:`json_pairs` counts its
object members.  :func:`paused_gc` is for building many of these objects at once.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import SchemaError
from ..jsonlimits import MAX_JSON_DEPTH

__all__ = [
    "MAX_INT",
    "check_int",
    "check_list",
    "check_object",
    "check_str",
    "fast_ints",
    "json_pairs",
    "json_value",
    "kind_of",
    "paused_gc",
    "subpath",
]

MAX_INT = (1 << 63) - 1
"""Largest integer a JSON integer field may hold by default (fits a signed 64-bit reader)."""


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Run a block without the cyclic garbage collector.  Parsing or building a header makes
    a few dozen objects per tensor, none of them cyclic; with 100,000 tensors the collector's
    passes over the growing heap cost more than the parsing.  Reference counting still frees
    everything; the collector resumes (if it was on) when the block ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def check_object(value: object, where: str, keys: frozenset[str]) -> Mapping[str, Any]:
    """An object with exactly the string keys ``keys``."""
    # Fast path for what JSON parsing gives: a dict with exactly the allowed keys (all of
    # them strings) passes every check below.
    if type(value) is dict and value.keys() == keys:
        return value
    if not isinstance(value, Mapping):
        raise SchemaError(where, f"expected an object, got {kind_of(value)}")
    for key in value:
        if not isinstance(key, str):
            raise SchemaError(where, f"object key {key!r} is not a string")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise SchemaError(where, f"unknown key(s) {unknown}; allowed keys are {sorted(keys)}")
    missing = sorted(keys - set(value))
    if missing:
        raise SchemaError(where, f"missing key(s) {missing}")
    return value


def check_str(value: object, where: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise SchemaError(where, f"expected a string, got {kind_of(value)}")
    if nonempty and not value:
        raise SchemaError(where, "must not be empty")
    return value


def check_int(value: object, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    # bool is an int subclass in Python; JSON true is not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(where, f"expected an integer, got {kind_of(value)}")
    if not lo <= value <= hi:
        raise SchemaError(where, f"integer {value} outside [{lo}, {hi}]")
    return value


def check_list(value: object, where: str) -> Sequence[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise SchemaError(where, f"expected an array, got {kind_of(value)}")
    return value


def fast_ints(value: object, lo: int = 0, hi: int = MAX_INT) -> tuple[int, ...] | None:
    """The checks of ``Seq(Int(lo, hi))`` for a list of plain ints, without building error
    paths; ``None`` when anything is unusual (the caller then runs the checked path)."""
    if type(value) is not list and type(value) is not tuple:
        return None
    for v in value:
        if type(v) is not int or not lo <= v <= hi:
            return None
    return tuple(value)


def kind_of(value: object) -> str:
    """The JSON type of ``value`` as messages name it (``an integer``, ``null`` ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return type(value).__name__


def subpath(where: str, key: str) -> str:
    """The location of member ``key`` of the object at ``where``."""
    return f"{where}.{key}" if where else key


def json_value(value: object, where: str, depth: int = 0) -> Any:
    """Validate and copy free-form JSON (object keys strings, finite numbers, bounded depth)."""
    if depth > MAX_JSON_DEPTH:
        raise SchemaError(where, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SchemaError(where, f"non-finite number {value!r} is not JSON")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SchemaError(where, f"object key {k!r} is not a string")
            out[k] = json_value(v, f"{where}.{k}", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [json_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise SchemaError(where, f"{type(value).__name__} is not a JSON value")


def json_pairs(value: object) -> int:
    """Object members in a free-form JSON value, all levels included."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count
