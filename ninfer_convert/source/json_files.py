"""Small JSON files of a source (``config.json``, the shard index), read without blocking.

Contract: a JSON file is opened with ``O_NONBLOCK`` and must be a regular file of at most
:data:`MAX_JSON_FILE_BYTES` (``fstat`` on the opened descriptor decides, no race), read whole,
strict UTF-8 and strict JSON (:func:`~.header.loads_strict_json`: no duplicate keys, no
NaN/Infinity, bounded nesting, no lone surrogate); anything else is a SourceError naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SourceError
from ..regular import open_regular
from .header import loads_strict_json

__all__ = ["MAX_JSON_FILE_BYTES"]

MAX_JSON_FILE_BYTES = 100_000_000
"""Cap on ``config.json`` and ``model.safetensors.index.json`` (the safetensors header cap)."""


def _open_regular(p: Path, limit: int | None) -> tuple[int, int]:
    """Open ``p`` for reading without ever blocking; return ``(fd, size)`` of a regular file.

    ``O_NONBLOCK`` makes opening a FIFO return at once; ``fstat`` on the descriptor then tells
    what was really opened (no race between a check and the open)."""
    try:
        opened = open_regular(p)
    except OSError as exc:
        raise SourceError(f"cannot open: {exc.strerror or exc}", path=str(p)) from exc
    if opened is None:
        raise SourceError(
            "is not a regular file (a FIFO, device or socket)",
            path=str(p),
            hint="replace it with a regular file or remove it",
        )
    fd, st = opened
    if limit is not None and st.st_size > limit:
        os.close(fd)
        raise SourceError(f"is {st.st_size} bytes, over the cap of {limit} bytes", path=str(p))
    return fd, st.st_size


def _read_json(p: Path) -> object:
    fd, size = _open_regular(p, MAX_JSON_FILE_BYTES)
    try:
        with os.fdopen(fd, "rb") as f:
            fd = -1
            raw = f.read(size + 1)
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}", path=str(p)) from exc
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) != size:
        raise SourceError(
            f"changed while read ({len(raw)} bytes read, {size} expected)", path=str(p)
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"is not valid UTF-8 ({exc.reason} at byte {exc.start})", path=str(p)
        ) from exc
    try:
        return loads_strict_json(text)
    except ValueError as exc:
        raise SourceError(f"not valid JSON: {exc}", path=str(p)) from exc
