"""Nesting bounds for JSON read from untrusted files, checked before any parser runs.

Contract: :func:`nesting_problem` scans JSON text once, without recursion, and returns the
character offset of the first ``[`` or ``{`` that opens a level deeper than ``limit`` (or
``None``).  Brackets inside strings do not count; escapes inside strings are honoured.  Every
reader of an untrusted JSON document (safetensors headers, ``model.safetensors.index.json``,
``config.json``, ``.ninfer`` headers and indexes) calls it first, so a 1,000-level document is a
typed error naming the file instead of a ``RecursionError`` inside ``json.loads`` (whose C
scanner recurses once per level).

The ``.ninfer`` reader without the C module ``_jsonfast`` is the one exception to "first": it
parses first and runs the scan only when the parse or its schema refuses the document,
because a schema-valid header is shallow by construction (``container.typed_json``), and
only while Python's recursion limit is low enough that the parser's C recursion cannot
overflow the stack.  With the C module the scan is one pass over the code points, cheaper
than the parse, and that reader runs it first too.  :func:`scan` also counts the
object members (colons outside strings), and :func:`compact_members` counts them without a
pass over the string literals; that reader compares the count with its typed value to find
repeated keys.

:data:`MAX_JSON_DEPTH` is far above what any real header needs (ours nest 6 levels, Hugging
Face configs about 5) and far below Python's recursion limit.
"""

from __future__ import annotations

import re

import numpy as np

from .native import optional_module

__all__ = [
    "MAX_JSON_DEPTH",
    "NATIVE_SCAN",
    "compact_members",
    "nesting_problem",
    "scan",
    "scan_python",
]

MAX_JSON_DEPTH = 64

_native = optional_module("_jsonfast")
NATIVE_SCAN = _native is not None
"""Whether :func:`scan` is the C module's single pass rather than the regular expressions of
:func:`scan_python` (the header reader then runs its checks in the documented order)."""

_CHUNK = 1 << 20

# A JSON string literal: a quote, then any run of non-quote non-backslash characters or
# backslash escapes, then a quote.  Unterminated strings are left for the parser to reject.
# Written as runs between escapes ("unrolled"): the same matches as one alternation per
# character, 2.4x faster on a 100,000-tensor header.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def nesting_problem(text: str, limit: int = MAX_JSON_DEPTH) -> int | None:
    """Offset in ``text`` of the first bracket nested deeper than ``limit``, else ``None``."""
    return scan(text, limit)[0]


def scan(text: str, limit: int = MAX_JSON_DEPTH) -> tuple[int | None, int]:
    """``(nesting_problem(text, limit), members)`` in one pass over the text.

    ``members`` counts the colons outside string literals: in valid JSON, exactly the number of
    object members (key-value pairs, all levels included), whatever keys repeat.  A reader
    that parses without a per-object hook compares it with the members it kept to learn that
    some object repeats a key (and only then parses again to name it).  With the C module
    ``_jsonfast`` built this is its single pass over the code points (:data:`NATIVE_SCAN`);
    :func:`scan_python` is the reference it matches (tests/test_jsonlimits.py)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if _native is not None:
        got: tuple[int | None, int] = _native.scan(text, limit)
        return got
    return scan_python(text, limit)


def scan_python(text: str, limit: int = MAX_JSON_DEPTH) -> tuple[int | None, int]:
    """:func:`scan` without the C module: string literals found by a regular expression (a
    quote whose string never ends is an ordinary character, and so is the text after it),
    then the brackets and colons of what remains."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if "[" not in text and "{" not in text:
        return None, 0  # no object, so no member (a colon here is inside a string)
    # First without the offsets: every string literal replaced by "" in C (no Python call per
    # string; a 100,000-tensor header has millions) leaves the same brackets in the same
    # order, so it decides whether any is too deep, from the brackets alone (deleted out of
    # the bytes in C, so the arrays below are a few bytes per object, not 4 per character).
    # Only then are the offsets recovered.
    emptied = _STRING.sub('""', text)
    members = emptied.count(":")
    brackets = emptied.encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    if _deepest(brackets) <= limit:
        return None, members
    # Blank out string literals (same length, so offsets stay true), then walk brackets only.
    return _too_deep(_STRING.sub(lambda m: " " * len(m.group(0)), text), limit), members


def compact_members(text: str) -> int | None:
    """The object members of ``text`` if it is valid JSON, counted without a scan of its string
    literals; ``None`` when a quote is followed by whitespace and a colon anywhere (then
    :func:`scan` counts them).

    Why it is exact for valid JSON: with every escaped backslash removed, a backslash-quote is
    an escaped quote, and any other quote delimits a string.  Each member is a key string whose
    closing quote is followed by its colon (no whitespace between them, which the ``None``
    case leaves to :func:`scan`).  Any other quote followed by a colon is either an escaped
    quote inside a string (subtracted) or the opening quote of a string whose text starts
    with a colon (``":"``, or ``"\\\\:"`` once its escaped backslash is removed).  An opening
    quote follows ``{``, ``[``, ``,``, ``:``, whitespace or nothing, so whenever one of those
    precedes a quote-colon the count could be one too many and ``None`` is returned instead
    (a key whose text ends in such a character declines too, which costs only the slower
    count).  For text that is not valid JSON the number means nothing; callers use it only for
    text the parser accepted."""
    if any(q in text for q in _QUOTE_SPACE) and _QUOTE_SPACE_COLON.search(text) is not None:
        return None
    if "\\" in text:
        text = text.replace("\\\\", "")
    if text.startswith('":') or any(q in text for q in _OPEN_QUOTE_COLON):
        return None
    return text.count('":') - text.count('\\":')


_QUOTE_SPACE = ('" ', '"\t', '"\n', '"\r')
_QUOTE_SPACE_COLON = re.compile(r'"[ \t\n\r]+:')
_OPEN_QUOTE_COLON = tuple(f'{c}":' for c in "{[,: \t\n\r")

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _deepest(brackets: bytes) -> int:
    codes = np.frombuffer(brackets, dtype=np.uint8)
    if not codes.size:
        return 0
    opens = (codes == ord("[")) | (codes == ord("{"))
    steps = opens.astype(np.int32) * 2 - 1
    return int(np.cumsum(steps, dtype=np.int64).max())


def _too_deep(blanked: str, limit: int) -> int | None:
    # A chunk at a time, so a 64 MiB header costs a few MiB of arrays, not gigabytes.
    depth_before = 0
    for start in range(0, len(blanked), _CHUNK):
        chunk = blanked[start : start + _CHUNK]
        codes = np.frombuffer(chunk.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        opens = (codes == ord("[")) | (codes == ord("{"))
        closes = (codes == ord("]")) | (codes == ord("}"))
        steps = opens.astype(np.int32) - closes.astype(np.int32)
        depth = np.cumsum(steps, dtype=np.int64) + depth_before
        too_deep = np.flatnonzero(opens & (depth > limit))
        if too_deep.size:
            return start + int(too_deep[0])
        depth_before = int(depth[-1])
    return None
