"""Strict parsing of one safetensors file header, before any tensor byte is touched.

Contract (mirrors the checks of huggingface/safetensors ``tensor.rs``; every failure is a
:class:`~ninfer_convert.errors.SourceError` naming the file and, where known, the tensor; the
rules are listed for users in docs/cli.md, "Source checkpoints"):

* the file holds at least the 8-byte little-endian header length ``n``; ``n`` is at most
  :data:`MAX_HEADER_BYTES` and ``8 + n`` lies inside the file;
* the header is strict UTF-8 JSON whose first non-whitespace byte is ``{`` (JSON whitespace
  before it, as safetensors' ``test_whitespace_leading_padded_header`` accepts, and trailing
  spaces, the writer's padding, are allowed); duplicate keys, the non-JSON constants
  NaN/Infinity, nesting deeper than :data:`~ninfer_convert.jsonlimits.MAX_JSON_DEPTH` and
  ``\\u`` escapes that leave a lone UTF-16 surrogate (safetensors refuses them as invalid
  JSON) and the integer literal ``-0`` (not an unsigned integer) are refused;
* ``__metadata__``, when present and not ``null``, maps strings to strings;
* every other key is a tensor name that the container can store (1..4096 characters, no
  control character: :func:`~ninfer_convert.names.tensor_name_problem`), with exactly
  the keys ``dtype``, ``shape`` and ``data_offsets``;
* ``dtype`` is one of :data:`DTYPES` (read and converted) or :data:`OPAQUE_DTYPES` (valid
  safetensors types the converter cannot convert: their bytes are checked and digested, so a
  ``skip`` rule can name them, but no rule can convert them);
* ``shape`` is a list of at most :data:`MAX_NDIM` non-negative integers, and the product of
  its non-zero dimensions times the item size is at most :data:`MAX_TENSOR_BYTES` (so a
  shape such as ``[0, 10**30]`` is refused although it holds no element);
* ``data_offsets`` is ``[begin, end]`` with ``0 <= begin <= end``;
* ``end - begin`` is ``numel * bits / 8`` bytes, computed with Python ints (never a wrapping
  numpy product); for the sub-byte types (F4, F6_*) ``numel * bits`` must be a multiple of 8;
* sorted by offset, the tensors tile the data region exactly: the first starts at 0, each starts
  where the previous ended (no gaps, no overlaps) and the last ends at the end of the file.

Ordinary headers are read by the C module's one-pass reader (``_jsonfast.safetensors``,
ninfer_convert/_stheader.c: :func:`direct_entries`), which builds each tensor's object while
parsing; it declines, and the Python checks below decide, on anything it does not accept
exactly as they do (an escape in a tensor name, an unsorted header, any refusal), so every
error is theirs.  tests/test_source_header_direct.py holds both to the same outcome.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from ..errors import SourceError
from ..jsonfields.makers import instance_maker
from ..names import tensor_name_problem
from ..native import optional_module
from ..regular import open_regular
from .strict_json import loads_strict_json

__all__ = [
    "DTYPES",
    "MAX_HEADER_BYTES",
    "MAX_NDIM",
    "MAX_TENSOR_BYTES",
    "OPAQUE_DTYPES",
    "DTypeInfo",
    "SafetensorsHeader",
    "TensorEntry",
    "loads_strict_json",
    "parse_header",
]

MAX_HEADER_BYTES = 100_000_000
"""Header size cap; the same value as safetensors' ``MAX_HEADER_SIZE``."""

MAX_NDIM = 64
"""Most dimensions a tensor may have (numpy's limit, so every accepted shape can be viewed)."""

MAX_TENSOR_BYTES = 2**63 - 1
"""Cap on (product of the non-zero dimensions) * item size: the largest numpy array extent."""


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
"""Every safetensors dtype this reader reads as words, by its safetensors spelling."""

OPAQUE_DTYPES: Mapping[str, int] = MappingProxyType(
    {
        "F4": 4,
        "F6_E2M3": 6,
        "F6_E3M2": 6,
        "F8_E4M3FNUZ": 8,
        "F8_E5M2FNUZ": 8,
        "C64": 64,
    }
)
"""The other safetensors dtypes, with their width in bits: validated and digested (raw
bytes), never converted.  With :data:`DTYPES` this is safetensors' whole ``Dtype`` enum."""


def dtype_bits(dtype: str) -> int:
    """Width in bits of one element of a dtype from :data:`DTYPES` or :data:`OPAQUE_DTYPES`."""
    info = DTYPES.get(dtype)
    return info.itemsize * 8 if info is not None else OPAQUE_DTYPES[dtype]


@dataclass(frozen=True, slots=True)
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


_T = TypeVar("_T")


_JSON_WHITESPACE = " \t\n\r"


def parse_header(path: str | Path) -> SafetensorsHeader:
    """Read and validate the header of one ``.safetensors`` file (no tensor data is read)."""
    p = Path(path)
    raw, file_size = _read_header(p)
    return _checked_header(p, raw, file_size)


def parse_header_as(
    path: str | Path, file: str, make: Callable[[str, str, tuple[int, ...], str, int, int], _T]
) -> tuple[int, dict[str, _T]]:
    """The file size and the tensors of one ``.safetensors`` file, validated as by
    :func:`parse_header` (the same errors), each built as ``make(name, dtype, shape, file,
    nbytes, begin)`` (``begin`` absolute) without a :class:`TensorEntry` in between."""
    p = Path(path)
    raw, file_size = _read_header(p)
    direct = direct_entries(raw, file_size, make, file)
    if direct is not None:
        return file_size, direct[0]
    header = _checked_header(p, raw, file_size)
    return file_size, {
        e.name: make(e.name, e.dtype, e.shape, file, e.nbytes, e.begin)
        for e in header.tensors.values()
    }


def _read_header(p: Path) -> tuple[bytes, int]:
    """The header text of the file ``p`` and the file's size (the length prefix checked)."""
    where = str(p)
    try:
        # A FIFO or device is refused without ever blocking.
        opened = open_regular(p)
        if opened is None:
            raise SourceError(
                "is not a regular file (a FIFO, device or socket)",
                kind="source_header",
                path=where,
                hint="pass a real .safetensors file",
            )
        fd, st = opened
        with open(fd, "rb") as f:
            file_size = st.st_size
            if file_size < 8:
                raise SourceError(
                    f"file is {file_size} bytes, too small for a safetensors header",
                    kind="source_header",
                    path=where,
                    hint="the file is truncated or not a safetensors file",
                )
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                raise SourceError(
                    f"header length {n} exceeds the cap of {MAX_HEADER_BYTES} bytes",
                    kind="source_header",
                    path=where,
                    hint="not a safetensors file, or a hostile one",
                )
            if 8 + n > file_size:
                raise SourceError(
                    f"header length {n} runs past the end of the {file_size}-byte file",
                    kind="source_header",
                    path=where,
                    hint="the file is truncated",
                )
            raw = f.read(n)
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}", path=where) from exc
    return raw, file_size


def parse_header_bytes(
    data: bytes, where: str, *, file_size: int | None = None
) -> SafetensorsHeader:
    """Validate a whole safetensors file held in memory by the rules of :func:`parse_header`
    (``where`` names it in errors and is the header's ``path``).  ``file_size``: ``data`` is
    only the file's beginning (its length prefix and header, when they fit in the file) and
    this is the whole file's size (a file read in parts)."""
    size = len(data) if file_size is None else file_size
    if size < 8:
        raise SourceError(
            f"file is {size} bytes, too small for a safetensors header",
            kind="source_header",
            path=where,
            hint="the file is truncated or not a safetensors file",
        )
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise SourceError(
            f"header length {n} runs past the end of the {size}-byte file",
            kind="source_header",
            path=where,
            hint="the file is truncated",
        )
    if 8 + n > len(data):
        raise ValueError("data must hold the length prefix and the whole header")
    return _checked_header(Path(where), bytes(data[8 : 8 + n]), size)


_native = optional_module("_jsonfast")
_DTYPE_NAMES = (*DTYPES, *OPAQUE_DTYPES)
_DTYPE_BITS = tuple(dtype_bits(d) for d in _DTYPE_NAMES)
_make_entry = instance_maker(TensorEntry)


def direct_entries(
    raw: bytes, file_size: int, make: Callable[..., _T], file: str | None
) -> tuple[dict[str, _T], dict[str, str]] | None:
    """The tensors and metadata of the header text ``raw`` of a ``file_size``-byte file,
    read by the C reader in one pass, or None: declined (no C module, or anything the reader
    does not accept exactly as :func:`_checked_header` would), and the caller runs the
    reference.  Each tensor is ``make(name, dtype, shape, begin, end)`` (absolute offsets)
    when ``file`` is None, else ``make(name, dtype, shape, file, nbytes, begin)``."""
    if _native is None:
        return None
    data_start = 8 + len(raw)
    got = _native.safetensors(
        raw, data_start, file_size - data_start, _DTYPE_NAMES, _DTYPE_BITS, make, file
    )
    if got is None:
        return None
    tensors, span = got
    if span is None:
        return tensors, {}
    # The metadata object, checked by the reference JSON reader (escapes, surrogates,
    # duplicates, UTF-8): the C reader only found where it ends.
    try:
        meta = loads_strict_json(raw[span[0] : span[1]].decode("utf-8"), header=True)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return None
    return tensors, meta


def _direct_header(p: Path, raw: bytes, file_size: int) -> SafetensorsHeader | None:
    """:func:`_checked_header`'s value by the C reader, or None (declined)."""
    direct = direct_entries(raw, file_size, _make_entry, None)
    if direct is None:
        return None
    return SafetensorsHeader(
        path=p,
        file_size=file_size,
        data_start=8 + len(raw),
        metadata=MappingProxyType(direct[1]),
        tensors=MappingProxyType(direct[0]),
    )


def _checked_header(p: Path, raw: bytes, file_size: int) -> SafetensorsHeader:
    """Validate the header text ``raw`` of the ``file_size``-byte file ``p``."""
    direct = _direct_header(p, raw, file_size)
    if direct is not None:
        return direct
    where = str(p)
    n = len(raw)
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise SourceError(
            f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})",
            kind="source_header",
            path=where,
        ) from exc
    if not text.lstrip(_JSON_WHITESPACE).startswith("{"):
        raise SourceError(
            "header does not start with '{'",
            kind="source_header",
            path=where,
            hint="not a safetensors file",
        )
    try:
        header = loads_strict_json(text, header=True)
    except ValueError as exc:
        raise SourceError(
            f"header is not valid JSON: {exc}", kind="source_header", path=where
        ) from exc
    if not isinstance(header, dict):
        raise SourceError("header is not a JSON object", kind="source_header", path=where)

    data_start = 8 + n
    data_len = file_size - data_start
    metadata: dict[str, str] = {}
    entries: list[TensorEntry] = []
    for name, spec in header.items():
        if name == "__metadata__":
            if spec is None:  # safetensors reads an absent map as null too
                continue
            if not isinstance(spec, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in spec.items()
            ):
                raise SourceError(
                    "__metadata__ must map strings to strings", kind="source_header", path=where
                )
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
                kind="source_header",
                path=where,
                tensor=e.name,
                hint="safetensors data must tile the data region exactly",
            )
        expected = e.end - data_start
    if expected != data_len:
        raise SourceError(
            f"tensor data ends at {expected} but the data region is {data_len} bytes",
            kind="source_header",
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


def _check_name(name: str, where: str) -> None:
    problem = tensor_name_problem(name)
    if problem is not None:
        shown = name if len(name) <= 80 else name[:60] + f"... ({len(name)} characters)"
        raise SourceError(
            problem,
            kind="source_header",
            path=where,
            tensor=shown,
            hint="the output container cannot store this name; rename the tensor in the "
            "checkpoint (a recipe rule cannot claim it)",
        ) from None


def _entry_error(where: str, name: str, message: str, hint: str | None = None) -> SourceError:
    """The error of one bad header entry (built only when an entry fails: none per tensor)."""
    return SourceError(message, kind="source_header", path=where, tensor=name, hint=hint)


def _entry(name: str, spec: object, where: str, data_start: int) -> TensorEntry:
    # One call per tensor (100,000 for a large MoE checkpoint): the checks run inline, and
    # the errors are built by _entry_error only when one fails.
    _check_name(name, where)
    if not isinstance(spec, dict):
        raise _entry_error(where, name, "header entry is not an object")
    keys = set(spec)
    if keys != {"dtype", "shape", "data_offsets"}:
        extra = sorted(keys - {"dtype", "shape", "data_offsets"})
        missing = sorted({"dtype", "shape", "data_offsets"} - keys)
        raise _entry_error(
            where, name, f"header entry has unexpected keys {extra} / missing keys {missing}"
        )
    dtype = spec["dtype"]
    if not isinstance(dtype, str) or (dtype not in DTYPES and dtype not in OPAQUE_DTYPES):
        raise _entry_error(
            where,
            name,
            f"dtype {dtype!r} is not a safetensors dtype",
            hint="known: " + ", ".join([*DTYPES, *OPAQUE_DTYPES]),
        )
    shape = spec["shape"]
    # type(), not isinstance: json makes exact ints, and a bool (an int subclass) is refused.
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise _entry_error(where, name, f"shape {shape!r} is not a list of non-negative integers")
    if len(shape) > MAX_NDIM:
        raise _entry_error(
            where, name, f"shape has {len(shape)} dimensions; at most {MAX_NDIM} are supported"
        )
    bits = dtype_bits(dtype)
    extent = 1
    for d in shape:
        extent *= d or 1  # Python ints: no silent wrap-around
    if extent * ((bits + 7) // 8) > MAX_TENSOR_BYTES:
        raise _entry_error(
            where,
            name,
            f"shape {shape} of {dtype} spans more than {MAX_TENSOR_BYTES} bytes "
            "(product of the non-zero dimensions times the item size)",
            hint="no real tensor has this shape; the header is corrupt or hostile",
        )
    offsets = spec["data_offsets"]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or type(offsets[0]) is not int
        or type(offsets[1]) is not int
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise _entry_error(
            where, name, f"data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end"
        )
    numel = 1
    for d in shape:
        numel *= d
    if numel * bits % 8:
        raise _entry_error(
            where,
            name,
            f"shape {shape} of {dtype} ({bits}-bit elements) does not fill whole bytes "
            f"({numel} elements * {bits} bits is not a multiple of 8)",
        )
    expected = numel * bits // 8
    begin, end = offsets
    if end - begin != expected:
        raise _entry_error(
            where,
            name,
            f"data_offsets span {end - begin} bytes but shape {shape} of {dtype} needs {expected}",
        )
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)
