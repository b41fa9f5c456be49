"""Strict parsing of one safetensors file header, before any tensor byte is touched.

Contract (mirrors the checks of huggingface/safetensors ``tensor.rs``; every failure is a
:class:`~ninfer_convert.errors.SourceError` naming the file and, where known, the tensor):

* the file holds at least the 8-byte little-endian header length ``n``; ``n`` is at most
  :data:`MAX_HEADER_BYTES` and ``8 + n`` lies inside the file;
* the header is strict UTF-8 JSON whose first byte is ``{`` (trailing spaces, the writer's
  padding, are allowed); duplicate keys and the non-JSON constants NaN/Infinity are refused;
* ``__metadata__``, when present, maps strings to strings;
* every other key is a tensor with exactly the keys ``dtype``, ``shape`` and ``data_offsets``;
  ``dtype`` is one of :data:`DTYPES`; ``shape`` is a list of non-negative integers;
  ``data_offsets`` is ``[begin, end]`` with ``0 <= begin <= end``;
* ``end - begin == numel * itemsize``, computed with Python ints (never a wrapping numpy
  product);
* sorted by offset, the tensors tile the data region exactly: the first starts at 0, each starts
  where the previous ended (no gaps, no overlaps) and the last ends at the end of the file.

Sub-byte dtypes (F4, F6_*) are refused as unsupported rather than misread.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import SourceError

__all__ = [
    "DTYPES",
    "MAX_HEADER_BYTES",
    "DTypeInfo",
    "SafetensorsHeader",
    "TensorEntry",
    "loads_strict_json",
    "parse_header",
]

MAX_HEADER_BYTES = 100_000_000
"""Header size cap; the same value as safetensors' ``MAX_HEADER_SIZE``."""


@dataclass(frozen=True)
class DTypeInfo:
    """How one safetensors dtype is read: its item size and the numpy dtype of its words."""

    name: str
    itemsize: int
    word_dtype: str
    """numpy dtype string of the exposed words (explicit little-endian where it matters)."""
    floating: bool


def _dt(name: str, itemsize: int, word: str, floating: bool = False) -> DTypeInfo:
    return DTypeInfo(name, itemsize, word, floating)


DTYPES: Mapping[str, DTypeInfo] = MappingProxyType(
    {
        d.name: d
        for d in (
            # Floating-point types are exposed as unsigned words of their width so that NaN
            # payloads, signalling bits and -0.0 survive unchanged (no cast ever happens).
            _dt("BF16", 2, "<u2", True),
            _dt("F16", 2, "<u2", True),
            _dt("F32", 4, "<u4", True),
            _dt("F64", 8, "<u8", True),
            _dt("F8_E4M3", 1, "u1", True),
            _dt("F8_E5M2", 1, "u1", True),
            _dt("F8_E8M0", 1, "u1", True),
            _dt("BOOL", 1, "?"),
            _dt("U8", 1, "u1"),
            _dt("I8", 1, "i1"),
            _dt("U16", 2, "<u2"),
            _dt("I16", 2, "<i2"),
            _dt("U32", 4, "<u4"),
            _dt("I32", 4, "<i4"),
            _dt("U64", 8, "<u8"),
            _dt("I64", 8, "<i8"),
        )
    }
)
"""Every safetensors dtype this reader accepts, by its safetensors spelling."""

_UNSUPPORTED = {"F4", "F6_E2M3", "F6_E3M2", "C64", "F8_E4M3FNUZ", "F8_E5M2FNUZ"}


@dataclass(frozen=True)
class TensorEntry:
    """One validated header entry; ``begin``/``end`` are absolute byte offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    file_size: int
    data_start: int
    metadata: Mapping[str, str]
    tensors: Mapping[str, TensorEntry]


def _reject_constant(value: str) -> Any:
    raise ValueError(f"non-JSON constant {value}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def loads_strict_json(text: str) -> Any:
    """``json.loads`` that refuses duplicate keys and NaN/Infinity (raises ValueError)."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_header(path: str | Path) -> SafetensorsHeader:
    """Read and validate the header of one ``.safetensors`` file (no tensor data is read)."""
    p = Path(path)
    where = str(p)
    try:
        with open(p, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if file_size < 8:
                raise SourceError(
                    f"file is {file_size} bytes, too small for a safetensors header",
                    path=where,
                    hint="the file is truncated or not a safetensors file",
                )
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                raise SourceError(
                    f"header length {n} exceeds the cap of {MAX_HEADER_BYTES} bytes",
                    path=where,
                    hint="not a safetensors file, or a hostile one",
                )
            if 8 + n > file_size:
                raise SourceError(
                    f"header length {n} runs past the end of the {file_size}-byte file",
                    path=where,
                    hint="the file is truncated",
                )
            raw = f.read(n)
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}", path=where) from exc
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})", path=where
        ) from exc
    if not text.startswith("{"):
        raise SourceError(
            "header does not start with '{'", path=where, hint="not a safetensors file"
        )
    try:
        header = loads_strict_json(text)
    except ValueError as exc:
        raise SourceError(f"header is not valid JSON: {exc}", path=where) from exc
    if not isinstance(header, dict):
        raise SourceError("header is not a JSON object", path=where)

    data_start = 8 + n
    data_len = file_size - data_start
    metadata: dict[str, str] = {}
    entries: list[TensorEntry] = []
    for name, spec in header.items():
        if name == "__metadata__":
            if not isinstance(spec, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in spec.items()
            ):
                raise SourceError("__metadata__ must map strings to strings", path=where)
            metadata = dict(spec)
            continue
        entries.append(_entry(name, spec, where, data_start))

    # Tile check: sorted by offsets, each tensor starts where the previous ended.
    expected = 0
    for e in sorted(entries, key=lambda t: (t.begin, t.end)):
        rel = e.begin - data_start
        if rel != expected:
            what = "overlaps the previous tensor" if rel < expected else "leaves a gap"
            raise SourceError(
                f"data_offsets begin at {rel} but the previous tensor ends at {expected} ({what})",
                path=where,
                tensor=e.name,
                hint="safetensors data must tile the data region exactly",
            )
        expected = e.end - data_start
    if expected != data_len:
        raise SourceError(
            f"tensor data ends at {expected} but the data region is {data_len} bytes",
            path=where,
            hint="the file is truncated or has trailing bytes",
        )
    return SafetensorsHeader(
        path=p,
        file_size=file_size,
        data_start=data_start,
        metadata=MappingProxyType(metadata),
        tensors=MappingProxyType({e.name: e for e in entries}),
    )


def _entry(name: str, spec: object, where: str, data_start: int) -> TensorEntry:
    if not isinstance(spec, dict):
        raise SourceError("header entry is not an object", path=where, tensor=name)
    keys = set(spec)
    if keys != {"dtype", "shape", "data_offsets"}:
        extra = sorted(keys - {"dtype", "shape", "data_offsets"})
        missing = sorted({"dtype", "shape", "data_offsets"} - keys)
        raise SourceError(
            f"header entry has unexpected keys {extra} / missing keys {missing}",
            path=where,
            tensor=name,
        )
    dtype = spec["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        why = "is not supported" if dtype in _UNSUPPORTED else "is not a safetensors dtype"
        raise SourceError(
            f"dtype {dtype!r} {why}",
            path=where,
            tensor=name,
            hint="supported: " + ", ".join(DTYPES),
        )
    shape = spec["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise SourceError(
            f"shape {shape!r} is not a list of non-negative integers", path=where, tensor=name
        )
    offsets = spec["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise SourceError(
            f"data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end",
            path=where,
            tensor=name,
        )
    numel = 1
    for d in shape:
        numel *= d  # Python ints: no silent wrap-around
    expected = numel * DTYPES[dtype].itemsize
    begin, end = offsets
    if end - begin != expected:
        raise SourceError(
            f"data_offsets span {end - begin} bytes but shape {shape} of {dtype} needs {expected}",
            path=where,
            tensor=name,
        )
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)
