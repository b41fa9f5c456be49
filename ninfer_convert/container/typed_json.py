"""Strict JSON for the container's two documents: the header and the shard index.

Contract (docs/container.md sections 3 and 5, section 7 for the index): :func:`parse_typed`
turns the raw bytes of a header or index into its typed schema value, or raises an
:class:`~ninfer_convert.errors.ArtifactError` naming the file.  Accepted is UTF-8 only, no
repeated keys, no NaN/Infinity, no lone surrogate escapes, bounded integers and nesting
(:data:`HEADER_DEPTH`, :data:`INDEX_DEPTH`, checked by :mod:`ninfer_convert.jsonlimits`
without recursion); a document is refused for the first problem in that order, whatever
order the cheaper common path checks in.  The common path is the direct reader
(:mod:`ninfer_convert.jsonfields.direct`): the typed value built while the bytes are parsed,
or a decline, after which the checks run in that order.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ArtifactError
from ..jsonfields import direct
from ..jsonlimits import NATIVE_SCAN, compact_members, scan
from .schema import MAX_JSON_DEPTH, Header, IndexFile, SchemaError
from .wire import canonical_json

__all__ = ["HEADER_DEPTH", "INDEX_DEPTH", "parse_typed"]

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_repeated_keys(text: str, what: str, path: Path) -> None:
    """Parse again with a hook on every object and raise the first repeated key, if any (the
    slow path of :func:`parse_typed`'s duplicate detection)."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):  # find the first repeated key for the message
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    raise ArtifactError(f"{what} repeats the JSON key {key!r}", path=str(path))
                seen.add(key)
        return out

    _parse(text, what, path, pairs)


def _utf8(raw: bytes, what: str, path: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(
            f"{what} is not valid UTF-8 (byte {exc.start}: {exc.reason})", path=str(path)
        ) from None


def _parse(
    text: str, what: str, path: Path, hook: Callable[[list[tuple[str, Any]]], Any] | None
) -> Any:
    def finite(literal: str) -> float:
        # A literal such as 1e999 parses to inf, which is not JSON either.
        number = float(literal)
        if not math.isfinite(number):
            raise ValueError(f"the number {literal[:40]} is out of the float range")
        return number

    def constant(name: str) -> Any:
        raise ArtifactError(f"{what} contains {name}, which is not JSON", path=str(path))

    try:
        value = json.loads(
            text, object_pairs_hook=hook, parse_constant=constant, parse_float=finite
        )
        # A \ud800 escape parses to a lone surrogate, which is not Unicode text: refuse it, so
        # every accepted string can be written back as UTF-8.  Only a \uD800-\uDFFF escape
        # can make one (decoded UTF-8 holds none), so the encoding test runs only then.
        if _SURROGATE_ESCAPE.search(text) is not None:
            canonical_json(value)
        return value
    except UnicodeEncodeError:
        raise ArtifactError(
            f"{what} contains an escaped lone surrogate, which is not Unicode text",
            path=str(path),
        ) from None
    except RecursionError:  # the first parse of a hostile document; the checked order follows
        raise ArtifactError(f"{what} JSON is nested too deeply", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            path=str(path),
        ) from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ArtifactError(f"{what} is not acceptable JSON: {exc}", path=str(path)) from None


def _checked_shape(text: str, what: str, path: Path, depth: int) -> int:
    """The object members of ``text``, after refusing nesting deeper than ``depth`` (bracket
    levels of the whole document, checked by :func:`~ninfer_convert.jsonlimits.scan` without
    recursion)."""
    deep, members = scan(text, depth)
    if deep is not None:
        raise ArtifactError(
            f"{what} JSON is nested too deeply: deeper than {depth} levels at character {deep}",
            path=str(path),
            hint="not a file this tool writes; it may be hostile",
        )
    return members


_S = TypeVar("_S", Header, IndexFile)
_PARSE_FIRST_MAX_RECURSION = 4000  # Python's default is 1000; 60,000 levels fit in 8 MiB
_UNPARSED = object()


def parse_typed(cls: type[_S], raw: bytes, what: str, path: Path, depth: int) -> _S:
    """The header or index in ``raw``: strict JSON (UTF-8 only, no repeated keys, no
    NaN/Infinity, bounded integers and nesting) that fits the schema ``cls``.

    A document is refused for the first of: not UTF-8; nested deeper than ``depth``; not JSON;
    a repeated key; what the schema says.  With the C scan (``jsonlimits.NATIVE_SCAN``) that
    is the order the checks run in; without it the common case is cheaper than that order: the C
    parser runs first, without a per-object hook (which cost a Python call per object), so an
    object that repeats a key keeps its last value.  The members in the text
    (:func:`~ninfer_convert.jsonlimits.compact_members`, or :func:`scan` when whitespace
    precedes a colon) then tell: a schema-valid document has exactly as many members as its
    typed value (``json_pairs()``), so any difference is a repeated key, which
    :func:`_refuse_repeated_keys` names.  A schema-valid document nests at most 7 levels plus
    ``config``'s bounded depth, so it is within ``depth``; the parser itself stops at
    Python's recursion limit (when that limit was raised above
    :data:`_PARSE_FIRST_MAX_RECURSION`, the nesting scan runs first instead).  Whenever the
    parse or the schema refuses, the full order above runs, so the message is the one that
    order gives.

    First of all the direct reader (:mod:`~ninfer_convert.jsonfields.direct`, the C module)
    tries to build the typed value while it parses; it accepts only what this function
    accepts, with the same value, and declines everything else, which then takes the path
    above."""
    if direct.ENABLED:
        if not raw.isascii():
            _utf8(raw, what, path)  # the direct reader reads valid UTF-8 only
        typed_direct: _S | None = direct.decode(cls, raw, depth)
        if typed_direct is not None:
            return typed_direct
    text = _utf8(raw, what, path)
    # The parser's C recursion is bounded only by Python's recursion limit: parsing before the
    # nesting scan is safe only while that limit is low enough for the C stack (a host that
    # raised it to 1,000,000 got a SIGSEGV from 200,000 nested brackets).
    # With the C scan (jsonlimits.NATIVE_SCAN) the documented order costs less than the
    # parse-first shortcut: one pass over the text, then one parse.
    members = (
        compact_members(text)
        if not NATIVE_SCAN and sys.getrecursionlimit() <= _PARSE_FIRST_MAX_RECURSION
        else None
    )
    value: Any = _UNPARSED
    if members is not None:
        with contextlib.suppress(ArtifactError):
            value = _parse(text, what, path, None)
    if value is _UNPARSED or members is None:
        members = _checked_shape(text, what, path, depth)
        value = _parse(text, what, path, None)
    try:
        typed = cls.from_json(value)
    except SchemaError as exc:
        _checked_shape(text, what, path, depth)
        _refuse_repeated_keys(text, what, path)
        raise exc.as_error(
            ArtifactError, f"invalid {what}", kind="header_invalid", path=str(path)
        ) from None
    del value  # the parsed JSON is freed here, while the collector is paused
    if typed.json_pairs() != members:
        _refuse_repeated_keys(text, what, path)
        raise ArtifactError(  # pragma: no cover - only a repeated key makes the counts differ
            f"{what} holds {members} object members but its schema reads {typed.json_pairs()}",
            path=str(path),
        )
    return typed


# Bracket levels of a header: the root, ``artifact`` and ``source`` objects, then the free-form
# ``config`` (its own level plus at most MAX_JSON_DEPTH nested levels, the bound of
# jsonfields.values.json_value), so every header a writer can produce passes.  The index
# nests 3 levels.
HEADER_DEPTH = 3 + 1 + MAX_JSON_DEPTH
INDEX_DEPTH = 8
