"""The header schema's fast path accepts exactly what its field-by-field path accepts.

``TensorEntry.from_json`` first tries a check without error paths (``_fast_tensor``) and falls
back to ``TensorEntry.checked_from_json``, which names the failing field.  Every value below is
a valid entry with one field replaced by a hostile value (or a key added or removed): the fast
path must either refuse it (``None``) or build the very entry the checked path builds, and it
must refuse whatever the checked path rejects.
"""

from __future__ import annotations

import copy
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from artifact_fixtures import write_raw_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer_convert.container import open_artifact
from ninfer_convert.container.schema import (
    Provenance,
    SchemaError,
    SourceInfo,
    SourceTensor,
    TensorEntry,
    _fast_provenance,
    _fast_tensor,
)
from ninfer_convert.container.wire import MAX_INT, SINGLE_NAME
from ninfer_convert.errors import ArtifactError

VALID: dict[str, Any] = {
    "name": "model.layers.0.mlp.w",
    "format": "Q4G64_F16S",
    "layout": "ROWS",
    "shape": [2, 64],
    "physical": [2, 64],
    "planes": [
        {"name": "codes", "offset": 4096, "nbytes": 64, "digest": "0" * 32},
        {"name": "scales", "offset": 8192, "nbytes": 4, "digest": "0123456789abcdef" * 2},
    ],
    "role": "weight",
    "provenance": {
        "sources": [
            {"name": "a.w", "dtype": "BF16", "shape": [1, 64], "file": "m.safetensors"},
            {"name": "b.w", "dtype": "BF16", "shape": [1, 64], "file": "m.safetensors"},
        ],
        "conversion": None,
        "transforms": [{"op": "concat", "axis": 0}, {"op": "transpose"}],
        "encoder_profile": "MAXABS_F16_RECIP_RNE_V1",
        "rule": {"index": 0, "line": 5, "pattern": "re:.*"},
        "constraints": ["c1"],
    },
}

HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, MAX_INT, MAX_INT + 1, 1.0, "", "x", "A" * 32, "0" * 31,
    "0" * 33, "g" * 32, [], [1], [True], [-1], [1.0], ["x"], {}, {"op": "transpose"},
    {"op": "bogus"}, (1, 2),
]  # fmt: skip


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _variants() -> Iterator[Any]:
    yield copy.deepcopy(VALID)
    for path in _paths(VALID):
        for hostile in HOSTILE:
            if not path:
                yield hostile
                continue
            doc = copy.deepcopy(VALID)
            parent = doc
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = copy.deepcopy(hostile)
            yield doc
        parent = copy.deepcopy(VALID)
        target = parent
        for step in path:
            target = target[step]
        if isinstance(target, dict):
            target["extra"] = 1
            yield parent
            for key in list(target)[:-1]:
                doc = copy.deepcopy(parent)
                node = doc
                for step in path:
                    node = node[step]
                del node["extra"], node[key]
                yield doc


def _checked(value: Any) -> TensorEntry | None:
    try:
        return TensorEntry.checked_from_json(value)
    except SchemaError:
        return None


def test_fast_path_is_taken_for_a_valid_entry() -> None:
    # Otherwise the comparison below would compare the checked path with itself.
    fast = _fast_tensor(copy.deepcopy(VALID), {})
    assert fast is not None
    assert fast == TensorEntry.checked_from_json(copy.deepcopy(VALID))
    assert _fast_provenance(copy.deepcopy(VALID["provenance"]), {}) is not None


def test_fast_path_accepts_exactly_what_the_checked_path_accepts() -> None:
    count = 0
    for value in _variants():
        count += 1
        fast = _fast_tensor(copy.deepcopy(value), {})
        checked = _checked(copy.deepcopy(value))
        if checked is None:
            assert fast is None, f"fast path accepted what the checked path refuses: {value!r}"
        elif fast is not None:
            assert fast == checked, value
    assert count > 500


def test_public_from_json_names_the_field_the_fast_path_refused() -> None:
    doc = copy.deepcopy(VALID)
    doc["planes"][1]["digest"] = "A" * 32
    with pytest.raises(SchemaError) as info:
        TensorEntry.from_json(doc, "tensors[7]")
    assert info.value.where == "tensors[7].planes[1].digest"
    prov = copy.deepcopy(VALID["provenance"])
    prov["rule"]["line"] = -1
    with pytest.raises(SchemaError) as info:
        Provenance.from_json(prov)
    assert info.value.where == "provenance.rule.line"


def test_header_shares_equal_strings_between_entries() -> None:
    # The per-header memo: 100,000 entries must not hold 100,000 copies of "weight".
    entries = []
    for i in range(3):
        doc = copy.deepcopy(VALID)
        doc["name"] = f"t{i}"
        doc["role"] = "".join(["wei", "ght"])  # a fresh string object each time
        entries.append(doc)
    memo: dict[Any, Any] = {}
    parsed = [TensorEntry.from_json(e, f"tensors[{i}]", memo) for i, e in enumerate(entries)]
    assert parsed[0].role is parsed[1].role is parsed[2].role
    assert parsed[0].provenance.rule is parsed[2].provenance.rule


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # parse_float refuses what overflows to inf (the encoding check no longer runs on
        # every header to catch it)
        (b'{"x": 1e999}', "not acceptable JSON: the number 1e999"),
        (b'{"x": -' + b"9" * 400 + b".0}", "not acceptable JSON"),
        # the encoding check still runs for any \uD800-\uDFFF escape, in either case of hex
        (b'{"x": "\\uDBFF"}', "lone surrogate"),
        (b'{"x": "a\\udc00"}', "lone surrogate"),
        (b'{"x": "\\ud83d\\ude00", "x": 1}', "repeats the JSON key 'x'"),
    ],
)
def test_header_json_refusals_without_the_encoding_pass(
    tmp_path: Path, raw: bytes, message: str
) -> None:
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, bytes(48), raw)
    with pytest.raises(ArtifactError, match=message):
        open_artifact(path)


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ({"dtype": "BF16", "shape": [1], "digest": 5}, "source.tensors.t.digest"),
        ({"dtype": "BF16", "shape": [-1], "digest": "d"}, "source.tensors.t.shape[0]"),
        ({"dtype": 1, "shape": [1], "digest": "d"}, "source.tensors.t.dtype"),
        ({"dtype": "BF16", "shape": [1]}, "source.tensors.t"),
    ],
)
def test_source_tensor_digests_fast_path_still_names_the_field(
    entry: dict[str, Any], where: str
) -> None:
    good = {"dtype": "BF16", "shape": [2], "digest": "xxh3-128:" + "0" * 32}
    doc = {"kind": "hf-dir", "path": "/m", "config": None, "files": [],
           "tensors": {"a": good, "t": entry}}  # fmt: skip
    with pytest.raises(SchemaError) as info:
        SourceInfo.from_json(doc)
    assert info.value.where == where
    doc["tensors"] = {"a": good, "b": SourceTensor("F16", (3,), "d")}
    parsed = SourceInfo.from_json(doc)
    assert parsed.tensors["a"] == SourceTensor("BF16", (2,), good["digest"])
    assert parsed.tensors["b"] == SourceTensor("F16", (3,), "d")


def test_nesting_scan_agrees_with_a_sequential_scan_on_random_text() -> None:
    # nesting_problem finds string literals with one unrolled regex and decides with the
    # strings removed before it recovers offsets; a character-by-character scan (strings
    # from an unescaped quote to the next unescaped quote, unterminated ones not strings)
    # must find the same first too-deep bracket on any text, valid JSON or not.
    import random

    from ninfer_convert.jsonlimits import nesting_problem

    def reference(text: str, limit: int) -> int | None:
        depth, i, n = 0, 0, len(text)
        while i < n:
            c = text[i]
            if c == '"':
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                if j < n:  # a terminated string: skip it
                    i = j + 1
                    continue
            elif c in "[{":
                depth += 1
                if depth > limit:
                    return i
            elif c in "]}":
                depth -= 1
            i += 1
        return None

    rng = random.Random(12)
    for _ in range(4000):
        text = "".join(rng.choice('"\\a[[{]}') for _ in range(rng.randint(0, 40)))
        limit = rng.randint(1, 4)
        assert nesting_problem(text, limit) == reference(text, limit), (text, limit)


_GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.ninfer"))
_HEADER_HOSTILE = st.sampled_from(
    [*HOSTILE, -0.0, 2**64, -(2**63), "\ud800", [None], [[1]], {"op": "concat", "axis": True}]
)


def _open_outcome(path: Path) -> tuple[str, str]:
    try:
        art = open_artifact(path)
    except ArtifactError as exc:
        return ("refused", str(exc))
    try:
        return ("opened", repr([t.entry for t in art.tensors.values()]) + repr(art.meta))
    finally:
        art.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fast_path_opens_exactly_what_the_checked_path_opens_for_mutated_golden_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    # A whole golden file (with source tensors added) whose header has one value replaced, one
    # key added or one removed: opened with the fast paths and with them switched off, the
    # outcome (entries and metadata, or the message) must be the same.
    from ninfer_convert.container import schema

    blob = data.draw(st.sampled_from(_GOLDEN)).read_bytes()
    h_off, h_len = struct.unpack_from("<QQ", blob, 16)
    doc = json.loads(blob[h_off : h_off + h_len])
    doc["artifact"]["source"]["tensors"] = {
        "a": {"dtype": "BF16", "shape": [2, 3], "digest": "xxh3-128:" + "0" * 32}
    }
    path = data.draw(st.sampled_from(list(_paths(doc))[1:]))
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    action = data.draw(st.sampled_from(["replace", "add", "remove"]))
    if action == "replace" or not isinstance(parent, dict):
        parent[path[-1]] = data.draw(_HEADER_HOSTILE)
    elif action == "add":
        parent["extra"] = 1
    else:
        del parent[path[-1]]
    file = tmp_path / SINGLE_NAME
    write_raw_header(file, blob[:h_off], json.dumps(doc).encode())
    fast = _open_outcome(file)
    with monkeypatch.context() as m:
        m.setattr(schema, "_fast_tensor", lambda value, memo: None)
        m.setattr(schema, "_fast_provenance", lambda value, memo: None)
        m.setattr(schema, "_fast_source_tensor", lambda value: None)
        checked = _open_outcome(file)
    assert fast == checked, (path, action)
