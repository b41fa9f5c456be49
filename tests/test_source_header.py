"""Strict safetensors header validation: every malformed-header case has its own error."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ninfer_convert.errors import SourceError
from ninfer_convert.source import parse_header
from ninfer_convert.source.header import DTYPES, MAX_HEADER_BYTES, OPAQUE_DTYPES


def raw_file(path: Path, header: bytes | str | dict[str, object], data: bytes = b"") -> Path:
    """Write a safetensors-framed file with exactly the given header bytes and data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode("utf-8")
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def ok_header() -> dict[str, object]:
    return {
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
        "b": {"dtype": "I64", "shape": [1], "data_offsets": [12, 20]},
    }


def test_valid_header_parses(tmp_path: Path) -> None:
    p = raw_file(tmp_path / "m.safetensors", ok_header(), bytes(20))
    h = parse_header(p)
    assert h.metadata == {"format": "pt"}
    assert set(h.tensors) == {"a", "b"}
    a = h.tensors["a"]
    assert (a.dtype, a.shape, a.nbytes) == ("BF16", (2, 3), 12)
    assert a.begin == h.data_start and h.tensors["b"].end == h.file_size


def test_header_padding_spaces_allowed(tmp_path: Path) -> None:
    text = json.dumps(ok_header()) + "    "
    parse_header(raw_file(tmp_path / "m.safetensors", text, bytes(20)))


def test_empty_model_is_valid(tmp_path: Path) -> None:
    assert parse_header(raw_file(tmp_path / "e.safetensors", "{}")).tensors == {}


def _mutated(change: str) -> tuple[dict[str, object] | str | bytes, bytes]:
    h = ok_header()
    data = bytes(20)
    a = h["a"]
    assert isinstance(a, dict)
    if change == "dtype":
        a["dtype"] = "F17"
    elif change == "f4":
        a["dtype"] = "F4"
        a["shape"] = [3]
        a["data_offsets"] = [0, 2]
        h["b"] = {"dtype": "I64", "shape": [1], "data_offsets": [2, 10]}
        data = bytes(10)
    elif change == "shape-negative":
        a["shape"] = [2, -3]
    elif change == "shape-bool":
        a["shape"] = [True, 3]
    elif change == "shape-not-list":
        a["shape"] = "2x3"
    elif change == "offsets-len":
        a["data_offsets"] = [0]
    elif change == "offsets-reversed":
        a["data_offsets"] = [12, 0]
    elif change == "size":
        a["shape"] = [2, 4]
    elif change == "extra-key":
        a["extra"] = 1
    elif change == "missing-key":
        del a["data_offsets"]
    elif change == "gap":
        h["b"] = {"dtype": "I64", "shape": [1], "data_offsets": [13, 21]}
        data = bytes(21)
    elif change == "overlap":
        h["b"] = {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}
        data = bytes(16)
    elif change == "trailing":
        data = bytes(24)
    elif change == "truncated-data":
        data = bytes(19)
    elif change == "metadata":
        h["__metadata__"] = {"format": 1}
    elif change == "entry-not-object":
        h["a"] = [1]
    elif change == "duplicate":
        text = (
            json.dumps(h)[:-1] + ', "a": {"dtype": "BF16", "shape": [0], "data_offsets": [20, 20]}}'
        )
        return text, data
    elif change == "nan":
        return '{"a": NaN}', b""
    elif change == "bad-json":
        return '{"a": ', b""
    elif change == "not-brace":
        return ' [{"a": 1}]', b""
    elif change == "utf8":
        return b'{"\xff": 1}', b""
    return h, data


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("dtype", "not a safetensors dtype"),
        ("f4", "does not fill whole bytes"),
        ("shape-negative", "non-negative integers"),
        ("shape-bool", "non-negative integers"),
        ("shape-not-list", "non-negative integers"),
        ("offsets-len", "data_offsets"),
        ("offsets-reversed", "data_offsets"),
        ("size", "needs 16"),
        ("extra-key", "unexpected keys ['extra']"),
        ("missing-key", "missing keys ['data_offsets']"),
        ("gap", "leaves a gap"),
        ("overlap", "overlaps"),
        ("trailing", "trailing bytes"),
        ("truncated-data", "truncated"),
        ("metadata", "__metadata__"),
        ("entry-not-object", "not an object"),
        ("duplicate", "duplicate key 'a'"),
        ("nan", "non-JSON constant"),
        ("bad-json", "not valid JSON"),
        ("not-brace", "does not start with '{'"),
        ("utf8", "not valid UTF-8"),
    ],
)
def test_malformed_headers_rejected(tmp_path: Path, change: str, needle: str) -> None:
    header, data = _mutated(change)
    p = raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(SourceError) as info:
        parse_header(p)
    assert info.value.kind == "source_header" and info.value.path == str(p)
    assert needle in str(info.value)  # the message names the broken rule


@pytest.mark.parametrize(
    "change",
    [
        "dtype",
        "f4",
        "shape-negative",
        "shape-not-list",
        "offsets-len",
        "offsets-reversed",
        "size",
        "extra-key",
        "missing-key",
        "entry-not-object",
    ],
)
def test_a_bad_entry_error_names_its_tensor(tmp_path: Path, change: str) -> None:
    header, data = _mutated(change)
    p = raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(SourceError) as info:
        parse_header(p)
    assert (info.value.kind, info.value.path, info.value.tensor) == ("source_header", str(p), "a")
    assert str(info.value).startswith(f"{p}: tensor 'a': ")


def test_an_unknown_dtype_or_an_impossible_shape_says_what_to_do(tmp_path: Path) -> None:
    header, data = _mutated("dtype")
    with pytest.raises(SourceError) as info:
        parse_header(raw_file(tmp_path / "bad.safetensors", header, data))
    assert info.value.hint == "known: " + ", ".join([*DTYPES, *OPAQUE_DTYPES])
    h = {"a": {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]}}
    with pytest.raises(SourceError) as info:
        parse_header(raw_file(tmp_path / "big.safetensors", h))
    assert info.value.hint == "no real tensor has this shape; the header is corrupt or hostile"
    header, data = _mutated("size")
    with pytest.raises(SourceError) as info:
        parse_header(raw_file(tmp_path / "bad.safetensors", header, data))
    assert info.value.hint is None


def test_framing_errors(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02")
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    past = tmp_path / "past.safetensors"
    past.write_bytes(struct.pack("<Q", 100) + b"{}")
    for path in (tiny, huge, past):
        with pytest.raises(SourceError) as info:
            parse_header(path)
        assert (info.value.kind, info.value.path) == ("source_header", str(path))
    with pytest.raises(SourceError, match="exceeds the cap"):
        parse_header(huge)


def test_sizes_use_python_ints_and_are_capped(tmp_path: Path) -> None:
    # numel * itemsize overflows int64 here; a numpy product would wrap and might "match".
    for shape in ([2**62, 4], [0, 10**30], [2**40, 0, 2**40]):
        h = {"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}
        with pytest.raises(SourceError, match="spans more than 9223372036854775807 bytes"):
            parse_header(raw_file(tmp_path / "big.safetensors", h))
    # Below the cap the exact Python-int size is compared (2**60 bytes != 0).
    h = {"a": {"dtype": "U8", "shape": [2**40, 2**20], "data_offsets": [0, 0]}}
    with pytest.raises(SourceError, match="needs 1152921504606846976"):
        parse_header(raw_file(tmp_path / "big.safetensors", h))
    # An empty tensor whose other extent numpy can still address is valid (as in safetensors).
    h = {"a": {"dtype": "U8", "shape": [0, 2**62], "data_offsets": [0, 0]}}
    assert parse_header(raw_file(tmp_path / "ok.safetensors", h)).tensors["a"].nbytes == 0


def test_too_many_dimensions_refused(tmp_path: Path) -> None:
    h = {"a": {"dtype": "U8", "shape": [1] * 65, "data_offsets": [0, 1]}}
    with pytest.raises(SourceError, match="65 dimensions; at most 64"):
        parse_header(raw_file(tmp_path / "d.safetensors", h, b"\0"))
    h = {"a": {"dtype": "U8", "shape": [1] * 64, "data_offsets": [0, 1]}}
    assert parse_header(raw_file(tmp_path / "d.safetensors", h, b"\0")).tensors["a"].nbytes == 1


@given(st.data())
def test_fuzzed_headers_never_crash(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    text = json.dumps(ok_header()).encode()
    base = bytearray(struct.pack("<Q", len(text)) + text + bytes(20))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(base)))
    p = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    p.write_bytes(bytes(base[: max(cut, len(base) - 8)]))
    with contextlib.suppress(SourceError):  # anything else (crash, hang) fails the test
        parse_header(p)
