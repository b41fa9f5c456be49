"""Name rules shared by the source reader, the planner and the container (one truth).

Contract: these functions answer with a problem sentence (or ``None``) and raise nothing, so
each caller wraps the answer in its own typed error: the source reader a ``SourceError`` at
plan time, the planner a recipe problem, the container's writer and reader a ``SchemaError``
(``container/checks.py``).  They depend on nothing else in the package, so the source and the
recipe need not import the container to refuse, early, a name the container could not store.

* A tensor name has 1..:data:`MAX_NAME_CHARS` characters and no control character
  (U+0000..U+001F, U+007F).
* A side file name is a relative path of 1..:data:`MAX_SIDE_FILE_DEPTH` components joined by
  ``/``, at most :data:`MAX_SIDE_FILE_CHARS` characters; each component 1..255 characters and
  not ``.`` or ``..``; no ``\\`` and no control character.  (The container also reserves its
  own file names: ``container/checks.py``.)
* :func:`side_file_key` is what a case-insensitive, normalising file system (APFS, NTFS,
  exFAT) treats as equal: two names, or a name and a folder prefix, with the same key collide.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = [
    "MAX_NAME_CHARS",
    "MAX_SIDE_FILE_CHARS",
    "MAX_SIDE_FILE_DEPTH",
    "side_file_key",
    "side_file_path_problem",
    "tensor_name_problem",
    "tensor_names_problem_free",
]

MAX_NAME_CHARS = 4096
"""Most characters in a tensor name."""

MAX_SIDE_FILE_DEPTH = 8
"""Most path components in a side file name (``a/b/c.json`` has 3)."""

MAX_SIDE_FILE_CHARS = 4096
"""Most characters in a side file name, separators included."""


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _has_control(text: str) -> bool:
    # One regex scan instead of a Python loop per character: names are checked once per
    # tensor on every write and every open.
    return _CONTROL.search(text) is not None


def tensor_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a tensor name, or ``None``."""
    if not name or len(name) > MAX_NAME_CHARS:
        return f"tensor name must have 1..{MAX_NAME_CHARS} characters"
    if _has_control(name):
        return f"tensor name {name!r} contains a control character"
    return None


def tensor_names_problem_free(names: Iterable[str]) -> bool:
    """Whether :func:`tensor_name_problem` is ``None`` for every name: one scan of the joined
    names (a control character in any name is one in the joined text) instead of one call
    per name."""
    names = list(names)
    if not names:
        return True
    lengths = list(map(len, names))
    return (
        min(lengths) >= 1
        and max(lengths) <= MAX_NAME_CHARS
        and _CONTROL.search("".join(names)) is None
    )


def side_file_path_problem(name: str) -> str | None:
    """Why ``name`` cannot be a side file's relative path, or ``None``."""
    parts = name.split("/")
    if (
        len(name) > MAX_SIDE_FILE_CHARS
        or len(parts) > MAX_SIDE_FILE_DEPTH
        or "\\" in name
        or _has_control(name)
        or any(not part or len(part) > 255 or part in (".", "..") for part in parts)
    ):
        return (
            f"side file name {name!r} is not a relative path of 1..{MAX_SIDE_FILE_DEPTH} "
            "plain file names joined by '/'"
        )
    return None


def side_file_key(name: str) -> str:
    """The collision key of a side file name or folder prefix (see the module contract)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())
