"""The C reader of the safetensors header (``_jsonfast.safetensors``, ninfer_convert/_stheader.c)
against the reference (source/header.py's json.loads and per-entry checks): on every header,
valid or not, both give the same tensors and metadata or the same error, and the C reader
accepts the ordinary headers itself (it declines only on doubt)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from ninfer_convert.errors import SourceError
from ninfer_convert.native import optional_module
from ninfer_convert.source import header as hdr
from ninfer_convert.source.header import OPAQUE_DTYPES, TensorEntry, direct_entries

_native = optional_module("_jsonfast")
needs_native = pytest.mark.skipif(
    _native is None and os.environ.get("NINFER_REQUIRE_NATIVE") != "1",
    reason="the C module _jsonfast was not built",
)


def _outcome(raw: bytes, file_size: int, native: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        if not native:
            m.setattr(hdr, "_native", None)
        try:
            h = hdr._checked_header(Path("m.safetensors"), raw, file_size)
        except SourceError as exc:
            return ("error", str(exc), exc.tensor)
    entries = [(k, v.name, v.dtype, v.shape, v.begin, v.end) for k, v in h.tensors.items()]
    return ("ok", h.data_start, dict(h.metadata), entries)


def _same(raw: bytes, file_size: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    ref = _outcome(raw, file_size, False, monkeypatch)
    assert _outcome(raw, file_size, True, monkeypatch) == ref, raw[:300]
    return ref


def _header(n: int = 4, meta: object = None) -> tuple[bytes, int]:
    """A header of n [2, 3] BF16 tensors (and ``__metadata__`` unless None), its data bytes."""
    h: dict[str, object] = {} if meta is None else {"__metadata__": meta}
    for i in range(n):
        h[f"model.layers.{i}.w"] = {
            "dtype": "BF16",
            "shape": [2, 3],
            "data_offsets": [12 * i, 12 * i + 12],
        }
    return json.dumps(h).encode(), 12 * n


def _one(name: str, dtype: str, shape: list[int], nbytes: int) -> tuple[bytes, int]:
    h = {name: {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}
    return json.dumps(h, ensure_ascii=False).encode(), nbytes


ORDINARY = [
    _header(),
    _header(meta={"format": "pt"}),
    _header(meta={"k": 'v \u00e9 " \\', "z": ""}),
    _header(0),
    _header(0, meta={}),
    (b'\n {"__metadata__": null, "a": {"shape": [], "data_offsets": [0, 4], "dtype": "F32"}}  ', 4),
    _one("é名", "F4", [3, 2], 3),
    _one("x", "U8", [0, 10**17], 0),
    _one("x" * 4096, "C64", [1], 8),
    _one("\u00e9" * 4096, "U8", [2], 2),  # 4096 code points in 8192 bytes
    _one("big", "U8", [10**6, 10**6, 10**5], 10**17),
]


@needs_native
@pytest.mark.parametrize("case", range(len(ORDINARY)))
def test_ordinary_headers_are_read_directly_and_equal(
    case: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, data = ORDINARY[case]
    size = 8 + len(raw) + data
    assert _same(raw, size, monkeypatch)[0] == "ok"
    assert direct_entries(raw, size, TensorEntry, None) is not None


def _variants() -> list[bytes]:
    """Headers the C reader must decline or refuse exactly as the reference does."""
    good = '"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]'
    bad_values = [
        '"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 11]',
        '"dtype": "BF16", "shape": [2, 3], "data_offsets": [12, 0]',
        '"dtype": "BF16", "shape": [2, 3], "data_offsets": [1, 13]',
        '"dtype": "BF16", "shape": [2, -3], "data_offsets": [0, 12]',
        '"dtype": "BF16", "shape": [2, -0], "data_offsets": [0, 12]',
        '"dtype": "BF16", "shape": [2, 3.0], "data_offsets": [0, 12]',
        '"dtype": "BF16", "shape": [2, 3e0], "data_offsets": [0, 12]',
        '"dtype": "BF16", "shape": [2, 03], "data_offsets": [0, 12]',
        '"dtype": "BF16", "shape": [2, true], "data_offsets": [0, 12]',
        '"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12, 14]',
        '"dtype": "BF16", "shape": [2, 3], "data_offsets": [0]',
        '"dtype": "BF16", "shape": 6, "data_offsets": [0, 12]',
        '"dtype": "bf16", "shape": [2, 3], "data_offsets": [0, 12]',
        '"dtype": "BF1", "shape": [2, 3], "data_offsets": [0, 12]',
        '"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12], "x": 1',
        '"dtype": "BF16", "shape": [2, 3]',
        '"dtype": "BF16", "dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]',
        '"dtype": "B\\u004616", "shape": [2, 3], "data_offsets": [0, 12]',
        '"dtype": "F4", "shape": [3], "data_offsets": [0, 1]',
        '"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 12]',
        '"dtype": "U8", "shape": [' + ", ".join(["1"] * 65) + '], "data_offsets": [0, 1]',
        '"dtype": "U8", "shape": [0, 100000000000000000, 100], "data_offsets": [0, 0]',
        '"dtype": "U8", "shape": [999999999999999999, 999999999999999999], "data_offsets": [0, 12]',
        '"dtype": "U8", "shape": [12], "data_offsets": [0, 12345678901234567890]',
    ]
    out = [("{" + f'"t": {{{v}}}' + "}").encode() for v in bad_values]
    # The longest name is 4096 code points: one more is refused, counted in code points.
    names = ['"' + "x" * 4097 + '"', '"' + "\u00e9" * 4097 + '"', '"' + "\U0001f600" * 4097 + '"']
    names += ['""', '"a\\u0000"', '"a\x7fb"', '"a\\"b"', '"__metadata__"', '"\\ud800"', '"a\x01"']
    out += [("{" + f"{n}: {{{good}}}" + "}").encode() for n in names]
    out += [
        ("{" + f'"t": {{{good}}}, "t": {{{good}}}' + "}").encode(),
        ("{" + f'"t": {{{good}}}, "u": {{{good}}}' + "}").encode(),
        ("{" + f'"t": {{{good}}},' + "}").encode(),
        ("{" + f'"t": {{{good}}}' + "} x").encode(),
        ("{" + f'"t": {{{good}}}' + "}{}").encode(),
        ("\ufeff{" + f'"t": {{{good}}}' + "}").encode(),
        ("[" + f'{{"t": {{{good}}}}}' + "]").encode(),
        ("{" + f'"t": [{good}]' + "}").encode(),
        b'{"t": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}, "\xff": 1}',
        b'{"t\xc3": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}',
    ]
    # Only space, tab, newline and carriage return are JSON whitespace.
    for space in ("\f", "\v", "\u00a0", "\u3000", "\x00"):
        out += [
            (space + "{" + f'"t": {{{good}}}' + "}").encode(),
            ("{" + f'"t": {{{good}}}' + "}" + space).encode(),
            ("{" + f'"t":{space}{{{good}}}' + "}").encode(),
            (
                "{"
                + f'"t": {{"dtype": "BF16", "shape": [2,{space}3], "data_offsets": [0, 12]}}'
                + "}"
            ).encode(),
        ]
    metas = [
        '{"a": 1}',
        '{"a": "b", "a": "c"}',
        '"x"',
        "[]",
        '{"a": {"b": "c"}}',
        '{"a": "\\ud800"}',
        '{"a": "\\x"}',
        '{"a": "b",}',
        "nul",
        '{"a": "\x01"}',
        '{"a": "\xff"}',
        '{"a": NaN}',
    ]
    for meta in metas:
        out.append(
            ("{" + f'"__metadata__": {meta}, "t": {{{good}}}' + "}").encode(
                "utf-8", "surrogateescape"
            )
        )
    out.append(
        ("{" + f'"__metadata__": null, "__metadata__": {{}}, "t": {{{good}}}' + "}").encode()
    )
    return out


@pytest.mark.parametrize("case", range(len(_variants())))
def test_bad_and_odd_headers_match_the_reference(
    case: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _variants()[case]
    for data in (0, 1, 12):  # the tensor's own extent among them, so that the tiling holds
        _same(raw, 8 + len(raw) + data, monkeypatch)


def test_unsorted_and_gapped_headers_match_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    a = {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}
    b = {"dtype": "U8", "shape": [3], "data_offsets": [2, 5]}
    unsorted = json.dumps({"b": b, "a": a}).encode()
    assert _same(unsorted, 8 + len(unsorted) + 5, monkeypatch)[0] == "ok"
    for size_delta in (4, 6):  # short data, trailing bytes
        _same(unsorted, 8 + len(unsorted) + size_delta, monkeypatch)
    gap = json.dumps({"a": a, "b": {**b, "data_offsets": [3, 6]}}).encode()
    _same(gap, 8 + len(gap) + 6, monkeypatch)


def test_random_byte_mutations_match_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(12)
    base, data = _header(3, meta={"format": "pt"})
    alphabet = b'{}[],:" 0123456789-.e\\u\x7f\x00\xc3\xa9abBF16IU8_'
    accepted = 0
    for _ in range(1500):
        raw = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(raw))
            op = rng.randrange(3)
            if op == 0:
                raw[i] = rng.choice(alphabet)
            elif op == 1:
                del raw[i]
            else:
                raw.insert(i, rng.choice(alphabet))
        size = 8 + len(raw) + data + rng.choice((0, 0, 0, -1, 1))
        accepted += _same(bytes(raw), size, monkeypatch)[0] == "ok"
    assert accepted > 50  # some mutations (a digit in a name, spaces) keep the header valid


def test_opaque_widths_are_the_reference_ones() -> None:
    # The C reader takes every dtype's width from header.py (one table).
    assert dict(zip(hdr._DTYPE_NAMES, hdr._DTYPE_BITS, strict=True))["F6_E2M3"] == 6
    assert set(OPAQUE_DTYPES) <= set(hdr._DTYPE_NAMES)


@pytest.mark.parametrize("file_size", [2**63, 2**64 + 20])
def test_a_file_size_past_64_bits_is_the_references_error(
    file_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The C reader declines a data region it cannot hold in 64 bits (no OverflowError): the
    # reference refuses it as a region the tensors do not tile.
    raw, _data = _header(1)
    assert _same(raw, file_size, monkeypatch)[0] == "error"
