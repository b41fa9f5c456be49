"""Hostile header text against the reader's duplicate-key detection (member counts instead of a
per-object hook): every repeated key is refused and named, whatever else the text holds, and
every header the writer produces opens, whatever its free-form strings hold."""

from __future__ import annotations

import copy
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from artifact_fixtures import (
    META,
    header_of,
    make_logical,
    provenance,
    rewrite_header,
    write_raw_header,
    write_small,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_convert.container import SINGLE_NAME, ArtifactWriter, open_artifact
from ninfer_convert.container.wire import canonical_json
from ninfer_convert.errors import ArtifactError
from ninfer_convert.jsonlimits import compact_members, scan

# Strings that put a quote right before a colon without being a key: an opening quote followed
# by ":", escaped backslashes before a colon, escaped quotes, braces and brackets.
TRICKY = [":", ":x", "::", "\\:", "\\\\:", '":', '\\":', "a,", "{", "[", "}:", '"', "\\", ": "]


def _write(out: Path, config_value: str, tensor: str = "w", *, once: bool = False) -> Path:
    meta = copy.deepcopy(META)
    meta["source"]["config"]["tricky"] = config_value
    if not once:
        meta["source"]["config"]["list"] = [config_value, {config_value: config_value}]
    with ArtifactWriter(out, metadata=meta) as w:
        w.add(
            tensor, "BF16", make_logical("BF16", (3, 5)), role="weight",
            provenance=provenance("BF16", name=tensor, shape=(3, 5)),
        )  # fmt: skip
        w.commit()
    return out


@pytest.mark.parametrize("value", TRICKY)
def test_written_header_with_tricky_strings_opens(tmp_path: Path, value: str) -> None:
    out = _write(tmp_path / "m", value, tensor=value + "w")
    with open_artifact(out) as art:
        assert art.metadata["source"]["config"]["tricky"] == value
        assert list(art.tensors) == [value + "w"]


@pytest.mark.parametrize("value", TRICKY)
def test_repeated_key_found_next_to_tricky_strings(tmp_path: Path, value: str) -> None:
    # One tricky string and one repeated key: the repeated key is what the message names, not
    # a member count that the string's quote-colon put off.
    out = _write(tmp_path / "m", value, once=True)

    def dup(h: dict[str, Any]) -> bytes:
        raw = canonical_json(h)
        assert raw.count(b'"role":"weight"') == 1
        return raw.replace(b'"role":"weight"', b'"role":"weight","role":"weight"')

    rewrite_header(out / SINGLE_NAME, dup)
    with pytest.raises(ArtifactError, match="repeats the JSON key 'role'"):
        open_artifact(out)


@pytest.mark.parametrize("value", TRICKY)
def test_compact_member_count_is_exact_or_declines(value: str) -> None:
    doc = {"a": value, value: [value, {"b": value, value: 1}], "c": {"d": {value: value}}}
    text = canonical_json(doc).decode()
    exact = scan(text)[1]
    assert exact == 7
    assert compact_members(text) in (None, exact)


_KEYS = st.text(alphabet='":\\,{}[] ax', max_size=4)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _KEYS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_compact_member_count_never_wrong(doc: Any) -> None:
    text = canonical_json(doc).decode()
    assert compact_members(text) in (None, scan(text)[1])


_DEEP_SCRIPT = """
import sys
from ninfer_convert.container import open_artifact
from ninfer_convert.errors import ArtifactError
sys.setrecursionlimit(1_000_000)  # a host program that raised it (some libraries do)
try:
    open_artifact(sys.argv[1])
except ArtifactError as exc:
    print(exc.message)
"""


def test_deep_config_is_refused_even_with_a_raised_recursion_limit(tmp_path: Path) -> None:
    # The parser's C recursion is bounded only by the recursion limit: with a raised limit,
    # 200,000 nested brackets overflowed the C stack (SIGSEGV) unless the nesting scan ran
    # before the parser.
    out = _write(tmp_path / "m", "x", once=True)

    def deep(h: dict[str, Any]) -> bytes:
        raw = canonical_json(h)
        return raw.replace(b'"tricky":"x"', b'"tricky":' + b"[" * 200_000 + b"]" * 200_000)

    rewrite_header(out / SINGLE_NAME, deep)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _DEEP_SCRIPT, str(out)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "nested too deeply" in proc.stdout


def _dump(value: Any, target: tuple[Any, ...], spelling: str, path: tuple[Any, ...] = ()) -> str:
    """Canonical-looking JSON text of ``value`` in which the object at ``target`` repeats its
    first key (same value), spelled per ``spelling``."""
    if isinstance(value, dict):
        parts = []
        for i, (key, item) in enumerate(sorted(value.items())):
            text = _dump(item, target, spelling, (*path, key))
            parts.append(f"{json.dumps(key, ensure_ascii=False)}:{text}")
            if i == 0 and path == target:
                if spelling == "escaped":  # "a" again as "\u0061"
                    again = f'"\\u{ord(key[0]):04x}' + json.dumps(key, ensure_ascii=False)[2:]
                    parts.append(f"{again}:{text}")
                elif spelling == "spaced":  # whitespace before the colon: the scan's count
                    parts.append(f"{json.dumps(key, ensure_ascii=False)} :{text}")
                else:
                    parts.append(f"{json.dumps(key, ensure_ascii=False)}:{text}")
        return "{" + ",".join(parts) + "}"
    if isinstance(value, list):
        return (
            "["
            + ",".join(_dump(v, target, spelling, (*path, i)) for i, v in enumerate(value))
            + "]"
        )
    return json.dumps(value, ensure_ascii=False)


def _objects(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(value, dict):
        if value:
            yield path, min(value)
        for key, item in value.items():
            yield from _objects(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _objects(item, (*path, i))


@pytest.fixture(scope="module")
def header_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, Any]]:
    root = tmp_path_factory.mktemp("walk")
    out = write_small(root / "m", ["BF16", "Q4G64_F16S", "NVFP4"])
    data = (out / SINGLE_NAME).read_bytes()
    return data, header_of(out / SINGLE_NAME)


@pytest.mark.parametrize("spelling", ["same", "escaped", "spaced"])
def test_every_object_at_every_depth_refuses_a_repeated_key(
    tmp_path: Path, header_file: tuple[bytes, dict[str, Any]], spelling: str
) -> None:
    data, header = header_file
    h_off = struct.unpack_from("<Q", data, 16)[0]
    path = tmp_path / SINGLE_NAME
    objects = list(_objects(header))
    assert len(objects) > 25  # root, artifact, source, config, tensors, planes, provenance...
    assert max(len(p) for p, _ in objects) >= 5
    for where, key in objects:
        raw = _dump(header, where, spelling).encode()
        assert json.loads(raw) == header  # the same document, one key repeated
        write_raw_header(path, data[:h_off], raw)
        with pytest.raises(ArtifactError, match=f"repeats the JSON key {key!r}"):
            open_artifact(path)


@pytest.mark.parametrize(
    "literal",
    ["true", "false", "null", "1.0", "1e2", "-1", "1e400", str(10**30), '"1"', "[1]", "9" * 5000],
    ids=lambda literal: literal[:12],
)
def test_integer_fields_refuse_other_json_types(
    tmp_path: Path, header_file: tuple[bytes, dict[str, Any]], literal: str
) -> None:
    data, header = header_file
    h_off = struct.unpack_from("<Q", data, 16)[0]
    path = tmp_path / SINGLE_NAME
    text = canonical_json(header).decode()
    fields = ['"offset":', '"nbytes":', '"alignment":', '"count":', '"index":', '"line":']
    checked = 0
    for field in fields:
        at = text.find(field)
        assert at >= 0, field
        start = at + len(field)
        end = start
        while text[end].isdigit():
            end += 1
        assert end > start, field
        write_raw_header(path, data[:h_off], (text[:start] + literal + text[end:]).encode())
        with pytest.raises(ArtifactError):
            open_artifact(path)
        checked += 1
    assert checked == len(fields)


def test_minus_zero_is_zero(tmp_path: Path, header_file: tuple[bytes, dict[str, Any]]) -> None:
    # "-0" is a valid JSON spelling of the integer 0 (readers accept any valid encoding).
    data, header = header_file
    h_off = struct.unpack_from("<Q", data, 16)[0]
    path = tmp_path / SINGLE_NAME
    text = canonical_json(header).decode()
    assert '"index":0' in text
    write_raw_header(path, data[:h_off], text.replace('"index":0', '"index":-0').encode())
    with open_artifact(path) as art:
        assert list(art.tensors) == [f"t.{f}" for f in ("BF16", "Q4G64_F16S", "NVFP4")]


def _nested(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_deepest_config_the_writer_accepts_opens_and_one_more_is_refused(tmp_path: Path) -> None:
    meta = copy.deepcopy(META)
    meta["source"]["config"]["deep"] = _nested(63)  # config's own level makes 64
    with ArtifactWriter(tmp_path / "m", metadata=meta) as w:
        w.add("w", "BF16", make_logical("BF16", (3, 5)), role="weight",
              provenance=provenance("BF16", shape=(3, 5)))  # fmt: skip
    with open_artifact(tmp_path / "m") as art:
        assert art.metadata["source"]["config"]["deep"] == _nested(63)

    def deeper(h: dict[str, Any]) -> None:
        h["artifact"]["source"]["config"]["deep"] = _nested(64)

    rewrite_header(tmp_path / "m" / SINGLE_NAME, deeper)
    with pytest.raises(ArtifactError, match="nested deeper than 64 levels"):
        open_artifact(tmp_path / "m")
