"""Strict JSON for untrusted headers and metadata files (the safetensors header, config.json,
side JSON files): :func:`loads_strict_json`.

Contract: ``json.loads`` that refuses duplicate keys, NaN/Infinity, nesting deeper than
:data:`~ninfer_convert.jsonlimits.MAX_JSON_DEPTH` and lone surrogates (a ValueError saying
which), and with ``header=True`` the integer literal ``-0``; each caller wraps the ValueError
in its own typed error.  (Moved here from source/header.py, which re-exports it.)
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..jsonlimits import MAX_JSON_DEPTH, nesting_problem

__all__ = ["loads_strict_json"]


def _reject_constant(value: str) -> Any:
    raise ValueError(f"non-JSON constant {value}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


# A \u escape of a UTF-16 surrogate (the only way a lone surrogate enters decoded UTF-8 text).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _header_int(literal: str) -> int:
    # safetensors reads shapes and offsets as unsigned integers: "-0" is not one.
    if literal.startswith("-"):
        value = int(literal)
        if value == 0:
            raise ValueError("-0 is not an unsigned integer")
        return value
    return int(literal)


def loads_strict_json(text: str, *, header: bool = False) -> Any:
    """``json.loads`` that refuses duplicate keys, NaN/Infinity, nesting deeper than
    :data:`~ninfer_convert.jsonlimits.MAX_JSON_DEPTH` and lone surrogates (raises ValueError).

    The nesting bound runs first, so ``json.loads`` never recurses past it.  ``json.loads``
    pairs surrogate escapes itself; one left unpaired is a string no UTF-8 encoder can write,
    so it is refused here, as safetensors refuses it.  ``header=True`` (a safetensors header)
    also refuses the integer literal ``-0``, which safetensors' unsigned fields refuse."""
    deep = nesting_problem(text)
    if deep is not None:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels at character {deep}")
    value = json.loads(
        text,
        object_pairs_hook=_no_duplicates,
        parse_constant=_reject_constant,
        # Without the two characters "-0" anywhere in the text there is no -0 literal, and
        # json's own int parse gives what _header_int gives (one Python call per integer
        # saved: three per tensor).
        parse_int=_header_int if header and "-0" in text else None,
    )
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise ValueError(
                f"a \\u escape leaves the lone UTF-16 surrogate {bad!r} (not a character)"
            ) from None
    return value
