"""The direct reader (``_jsonfast.decode``) against the reference reader.

``parse_typed`` first lets the C module build the typed header while it parses
(ninfer_convert/jsonfields/direct.py); it must accept only what the reference (``json.loads`` and
the field specs' checks) accepts, with the same typed value, and decline everything else (the
reference then gives its own answer).  Every document below goes through both: the reference
(the direct reader switched off) gives a value or an ``ArtifactError``; ``parse_typed`` with the
direct reader must give the same value or the very same message, and when the direct reader
accepts alone it must be that value.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer_convert.container.schema import Header, IndexFile, SchemaObject
from ninfer_convert.container.typed_json import HEADER_DEPTH, INDEX_DEPTH, parse_typed
from ninfer_convert.container.wire import DIGEST_HEX_RE, PRELUDE, PRELUDE_SIZE, canonical_json
from ninfer_convert.errors import ArtifactError
from ninfer_convert.jsonfields import Str, direct, js, schema
from ninfer_convert.jsonlimits import MAX_JSON_DEPTH

pytestmark = pytest.mark.skipif(not direct.ENABLED, reason="needs the C module _jsonfast")

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.ninfer"))
WHERE = Path("/nowhere/model.ninfer")

DIGEST = "0123456789abcdef" * 2
ENTRY: dict[str, Any] = {
    "format": "Q4G64_F16S",
    "layout": "row-split-k128-v1",
    "name": "model.layers.0.mlp.w",
    "physical": [2, 128],
    "planes": [
        {"digest": DIGEST, "name": "codes", "nbytes": 128, "offset": 64},
        {"digest": "0" * 32, "name": "scales", "nbytes": 8, "offset": 192},
    ],
    "provenance": {
        "constraints": ["c1"],
        "conversion": None,
        "encoder_profile": "MAXABS_F16_RECIP_RNE_V1",
        "factor": DIGEST,
        "factor_block": 128,
        "importance": DIGEST,
        "rule": {"index": 0, "line": 5, "pattern": "re:.*"},
        "sources": [
            {"dtype": "BF16", "file": "m.safetensors", "name": "a.w", "shape": [1, 70]},
            {"dtype": "BF16", "file": "m.safetensors", "name": "b.w", "shape": [1, 70]},
        ],
        "transforms": [
            {"axis": -1, "op": "concat"},
            {"op": "transpose"},
            {"op": "reshape", "shape": [2, 70]},
            {"op": "copy-quantized", "scheme": "gptq"},
        ],
    },
    "role": "weight",
    "shape": [2, 70],
}
HEADER: dict[str, Any] = {
    "artifact": {
        "alignment": 64,
        "producer": {"name": "ninfer-convert", "version": "1"},
        "recipe": {"digest": "", "evidence": ["e"], "name": "r", "text": 'a: 1\n\t"q" \\ é ☃'},
        "source": {
            "config": {
                "a": [1, -2, 3.5, -0.0, 1e-7, 2.5e300, True, False, None, "x"],
                "nested": {"k": {"k": [[]]}},
                "ünï": "\u0000\u001f\u2028 😀",
            },
            "files": [{"name": "m.safetensors", "size": 10}],
            "kind": "repo",
            "path": "/src",
            "repo": {"commit": "a" * 40, "id": "org/m", "revision": None},
            "tensors": {
                "a.w": {"digest": DIGEST, "dtype": "BF16", "shape": [1, 70]},
                "b.w": {"digest": DIGEST, "dtype": "BF16", "shape": [1, 70]},
            },
        },
    },
    "files": [{"digest": DIGEST, "name": "config.json", "size": 3}],
    "shard": {"count": 3, "index": 2},
    "tensors": [ENTRY, {**copy.deepcopy(ENTRY), "name": "名前.w"}],
}
INDEX: dict[str, Any] = {
    "format": "ninfer-index",
    "shards": [{"digest": DIGEST, "file": "model-00001-of-00002.ninfer", "size": 100}],
    "total_size": 100,
    "version": 1,
    "weight_map": {"a": "model-00001-of-00002.ninfer"},
}


def _reference(cls: type[SchemaObject], raw: bytes, depth: int) -> Any:
    was = direct.ENABLED
    direct.ENABLED = False
    try:
        return parse_typed(cls, raw, "header", WHERE, depth)  # type: ignore[type-var]
    except ArtifactError as exc:
        return exc
    finally:
        direct.ENABLED = was


def _same(a: Any, b: Any) -> bool:
    """Equal values of the very same types all the way down (dataclass ``==`` alone would let
    ``1 == 1.0 == True`` pass)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, SchemaObject):
        return all(_same(getattr(a, s), getattr(b, s)) for s in type(a).__slots__)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a.hex() == b.hex()
    return bool(a == b)


def check(raw: bytes, cls: type[SchemaObject] = Header, depth: int = HEADER_DEPTH) -> Any:
    """Both readers on ``raw``; returns what the direct reader alone says (value or None)."""
    ref = _reference(cls, raw, depth)
    alone = direct.decode(cls, raw, depth) if raw.isascii() or _utf8(raw) else None
    if alone is not None:
        assert not isinstance(ref, ArtifactError), (
            f"direct accepted what the reference refuses: {ref}"
        )
        assert _same(alone, ref)
    try:
        got: Any = parse_typed(cls, raw, "header", WHERE, depth)  # type: ignore[type-var]
    except ArtifactError as exc:
        got = exc
    if isinstance(ref, ArtifactError):
        assert isinstance(got, ArtifactError) and str(got) == str(ref)
        assert (got.kind, got.hint) == (ref.kind, ref.hint)
    else:
        assert _same(got, ref)
    return alone


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _dumps(value: Any, **kw: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, **kw).encode("utf-8")


def test_every_document_class_has_a_plan() -> None:
    assert direct.plan_of(Header)[0] == direct.plan_of(IndexFile)[0]


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_golden_headers_are_read_directly(path: Path) -> None:
    raw = path.read_bytes()
    h_off, h_len = PRELUDE.unpack(raw[:PRELUDE_SIZE])[4:6]
    assert check(raw[h_off : h_off + h_len]) is not None


@pytest.mark.parametrize(
    "spelling",
    [
        {"sort_keys": True, "separators": (",", ":")},
        {"sort_keys": False, "separators": (",", ":")},
        {"indent": 2},
        {"separators": (" , ", " : ")},
    ],
)
def test_rich_header_in_any_spelling_is_read_directly(spelling: dict[str, Any]) -> None:
    assert check(_dumps(HEADER, **spelling)) is not None
    assert check(json.dumps(HEADER, **spelling).encode("ascii")) is not None  # \u escapes
    assert check(b" \r\n\t" + _dumps(HEADER, **spelling) + b"\n ") is not None


def test_index_is_read_directly() -> None:
    assert check(canonical_json(INDEX), IndexFile, INDEX_DEPTH) is not None


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


HOSTILE: list[Any] = [
    None, True, -1, 65, 1 << 63, 1.0, "", "g" * 32, [], [1.0], ["x"], {}, {"op": "transpose"},
    {"op": "bogus"},
]  # fmt: skip


def _mutations(doc: Any) -> Iterator[Any]:
    for path in list(_paths(doc))[1:]:
        for new in HOSTILE:
            out = copy.deepcopy(doc)
            parent = out
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = new
            yield out
        out = copy.deepcopy(doc)
        parent = out
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        yield out
        if isinstance(parent, dict):
            parent["extra"] = 1
            yield out


def test_every_field_replaced_by_a_hostile_value_gives_the_reference_answer() -> None:
    small = copy.deepcopy(HEADER)
    small["tensors"] = small["tensors"][:1]
    small["artifact"]["source"]["config"] = {"a": [1.5, {"b": None}]}
    for doc in _mutations(small):
        check(canonical_json(doc))
    for doc in _mutations(INDEX):
        check(canonical_json(doc), IndexFile, INDEX_DEPTH)


def _canon() -> str:
    return canonical_json(HEADER).decode("utf-8")


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace('"role":"weight"', '"role":"weight","role":"weight"', 1),
        lambda t: t.replace('"a.w":{', '"b.w":{"digest":"x"},"a.w":{', 1),  # StrMap repeat
        lambda t: t.replace('"nested":', '"a":1,"nested":', 1),  # config repeat
        lambda t: t.replace('"kind"', '"ki\\u006ed"', 1),  # an escaped key
        lambda t: t.replace('"x"', '"\\ud800"', 1),
        lambda t: t.replace('"x"', '"\\udc00"', 1),
        lambda t: t.replace('"x"', '"\\ud800\\u0041"', 1),
        lambda t: t.replace('"x"', '"\\ud83d\\ude00"', 1),
        lambda t: t.replace('"x"', '"\\uD83D\\uDE00\\/\\b\\f"', 1),
        lambda t: t.replace('"x"', '"\\x"', 1),
        lambda t: t.replace('"x"', '"\\u12"', 1),
        lambda t: t.replace('"x"', '"\t"', 1),
        lambda t: t.replace('"x"', "NaN", 1),
        lambda t: t.replace('"x"', "-Infinity", 1),
        lambda t: t.replace('"x"', "1e999", 1),
        lambda t: t.replace('"x"', "-1e999", 1),
        lambda t: t.replace('"x"', "01", 1),
        lambda t: t.replace('"x"', "1.", 1),
        lambda t: t.replace('"x"', ".5", 1),
        lambda t: t.replace('"x"', "1e", 1),
        lambda t: t.replace('"x"', "-", 1),
        lambda t: t.replace('"x"', "1" * 5000, 1),
        lambda t: t.replace('"x"', "1" * 300, 1),
        lambda t: t.replace('"x"', "0." + "1" * 300 + "e-5", 1),
        lambda t: t.replace('"x"', "tru", 1),
        lambda t: t.replace('"alignment":64', '"alignment":64.0', 1),
        lambda t: t.replace('"alignment":64', '"alignment":6e1', 1),
        lambda t: t.replace('"alignment":64', '"alignment":-0', 1),
        lambda t: t.replace('"alignment":64', '"alignment":064', 1),
        lambda t: t.replace('"alignment":64', '"alignment":' + "9" * 19, 1),
        lambda t: t.replace('"alignment":64', '"alignment":' + "9" * 25, 1),
        lambda t: t.replace('"alignment":64', '"alignment":9223372036854775807', 1),
        lambda t: t.replace('"alignment":64', '"alignment":9223372036854775808', 1),
        lambda t: t.replace('"axis":-1', '"axis":-9223372036854775808', 1),
        lambda t: t.replace('"axis":-1', '"axis":-64', 1),
        lambda t: t.replace('"axis":-1', '"axis":-0', 1),
        lambda t: t.replace('"count":3,"index":2', '"count":3,"index":4', 1),
        lambda t: t.replace('"count":3,"index":2', '"count":3,"index":3', 1),
        lambda t: t.replace('"count":3', '"count":true', 1),
        lambda t: t.replace('"revision":null', '"revision":""', 1),
        lambda t: t.replace('"commit":"aaaa', '"commit":"Aaaa', 1),
        lambda t: t.replace(DIGEST, DIGEST.upper(), 1),
        lambda t: t.replace(DIGEST, "\\u0030" + DIGEST[1:], 1),
        lambda t: t.replace('"factor_block":128,', "", 1),
        lambda t: t + " x",
        lambda t: t + "{}",
        lambda t: t[:-1],
        lambda t: t[: len(t) // 2],
        lambda t: "\ufeff" + t,
        lambda t: "[" + t + "]",
        lambda t: t.replace(",", ",,", 1),
        lambda t: t.replace(":", "::", 1),
        lambda t: t.replace("}", ",}", 1),
        lambda t: t.replace("]", ",]", 1),
        lambda t: t.replace('"evidence":["e"]', '"evidence":["e",]', 1),
        lambda t: t.replace('"', "'", 1),
        lambda t: t.replace(" ", "\u00a0", 1),
    ],
)
def test_hand_built_hostile_header_gives_the_reference_answer(edit: Any) -> None:
    check(edit(_canon()).encode("utf-8"))


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 3000])
def test_deep_config_gives_the_reference_answer(depth: int) -> None:
    for inner in (_deep(depth), [_deep(depth - 1)] if depth else []):
        doc = copy.deepcopy(HEADER)
        doc["artifact"]["source"]["config"] = {"x": inner}
        accepted = check(canonical_json(doc) if depth < 500 else _deep_text(depth))
        assert (accepted is not None) == (depth < MAX_JSON_DEPTH)


def _deep_text(depth: int) -> bytes:
    # canonical_json of a 3,000-level value would recurse past Python's limit.
    text = _canon().replace(
        '"nested":', '"deep":' + '{"k":' * depth + "1" + "}" * depth + ',"nested":'
    )
    return text.encode("utf-8")


def test_nesting_limit_is_the_callers() -> None:
    raw = canonical_json(HEADER)
    assert direct.decode(Header, raw, HEADER_DEPTH) is not None
    assert direct.decode(Header, raw, 7) is None  # config's [[]] opens level 8
    check(raw, Header, 7)


def test_invalid_utf8_is_the_reference_refusal() -> None:
    raw = _canon().replace("é", "\udce9").encode("utf-8", "surrogateescape")
    with pytest.raises(ArtifactError, match="not valid UTF-8"):
        parse_typed(Header, raw, "header", WHERE, HEADER_DEPTH)
    check(raw)


_TOKENS = [*'{}[]:,"\\ \n', "0", "1", "-", ".", "e", "null", "true", "x", "é", "\\u00", "d8"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_text_edits_give_the_reference_answer(data: st.DataObject) -> None:
    text = _canon()
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 3))
        new = "".join(data.draw(st.lists(st.sampled_from(_TOKENS), max_size=3)))
        text = text[:at] + new + text[at + cut :]
    check(text.encode("utf-8"))


def _json_children(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children, max_size=3)
    )


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(1 << 70), 1 << 70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=6),
    ),
    _json_children,
    max_leaves=8,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_values_anywhere_give_the_reference_answer(data: st.DataObject) -> None:
    doc = copy.deepcopy(HEADER)
    paths = list(_paths(doc))[1:]
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(paths))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = data.draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue
    ascii_only = data.draw(st.booleans())
    check(json.dumps(doc, ensure_ascii=ascii_only, sort_keys=data.draw(st.booleans())).encode())


@settings(max_examples=60, deadline=None)
@given(config=st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=4))
def test_any_config_is_read_directly(config: dict[str, Any]) -> None:
    doc = copy.deepcopy(HEADER)
    doc["artifact"]["source"]["config"] = config
    assert check(canonical_json(doc)) is not None


def test_open_artifact_reads_a_valid_header_without_the_reference_parse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # inspect and verify open through open_artifact too, so they read the same way.
    from ninfer_convert.container import open_artifact, typed_json

    def parsed(*args: object) -> None:
        raise AssertionError("the reference parse ran for a valid header")

    monkeypatch.setattr(typed_json, "_parse", parsed)
    with open_artifact(GOLDEN[0]) as art:
        assert len(art.tensors) == 1
    monkeypatch.setattr(direct, "ENABLED", False)
    with pytest.raises(AssertionError, match="reference parse ran"):
        open_artifact(GOLDEN[0])


def test_declined_documents_leave_no_memory_behind() -> None:
    # A string whose escapes turn out invalid after its buffer was allocated, a repeated key,
    # a document cut short: each decline frees what it made (tracemalloc sees PyMem blocks).
    import tracemalloc

    text = _canon()
    docs = [
        text.replace('"x"', '"' + "y" * 2000 + '\\ud800"', 1),
        text.replace('"kind"', '"' + "k" * 2000 + '\\q"', 1),
        text.replace('"x"', '"' + "y" * 2000 + '\\u00"', 1),
        text.replace('"role":"weight"', '"role":"weight","role":"weight"', 1),
        text[: len(text) // 2],
    ]
    raws = [d.encode("utf-8") for d in docs]
    for raw in raws:
        assert direct.decode(Header, raw, HEADER_DEPTH) is None
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(200):
            for raw in raws:
                direct.decode(Header, raw, HEADER_DEPTH)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 100_000, grown


def test_many_distinct_interned_values_of_one_length_are_kept_apart() -> None:
    # 1,100 roles, formats and source files of equal length: more than the C reader's table of
    # interned strings has slots (1,024), so slots are shared and only the bytes tell values
    # apart.
    doc = copy.deepcopy(HEADER)
    entries = []
    template = json.dumps(ENTRY)
    for i in range(1100):
        entry = json.loads(template)
        entry["name"] = f"t{i}"
        entry["role"] = f"r{i:05d}"
        entry["format"] = f"F{i % 700:05d}"
        entry["provenance"]["sources"][0]["file"] = f"f{(i * 7) % 1100:05d}"
        entries.append(entry)
    doc["tensors"] = entries
    got = check(canonical_json(doc))
    assert got is not None
    assert [t.role for t in got.tensors] == [f"r{i:05d}" for i in range(1100)]


@schema("pair")
@dataclass(frozen=True, slots=True)
class _InternedPair(SchemaObject):
    """Two interned strings, the second a digest: one text can pass one spec and not the other."""

    a: str = field(metadata=js(Str(intern=True)))
    b: str = field(metadata=js(Str(intern=True, pattern=DIGEST_HEX_RE, mismatch=str)))


@pytest.mark.parametrize("text", ["g" * 32, DIGEST, ""])
def test_an_interned_value_is_checked_by_every_spec_that_reads_it(text: str) -> None:
    raw = canonical_json({"a": text, "b": text})
    accepted = check(raw, _InternedPair, 2)
    assert (accepted is not None) == (text == DIGEST)


@pytest.mark.parametrize(
    ("what", "member"),
    [
        ("StrMap", '"a.w":{"digest":"' + DIGEST + '","dtype":"BF16","shape":[1,70]}'),
        ("object", '"kind":"repo"'),
        ("object", '"shard":{"count":3,"index":2}'),
        ("config", '"nested":{"k":{"k":[[]]}}'),
        ("nested config", '"k":[[]]'),
    ],
)
def test_a_repeated_key_in_any_object_is_the_reference_refusal(what: str, member: str) -> None:
    # The repeated member is valid in itself, so only the repetition can decline it (a map
    # that kept the last value passed the other tests).
    text = _canon()
    assert member in text, what
    escaped = '"\\u00' + f"{ord(member[1]):02x}" + member[2:]
    for copy_of in (member, escaped):
        raw = text.replace(member, copy_of + "," + member, 1).encode("utf-8")
        assert check(raw) is None, what
        with pytest.raises(ArtifactError, match="repeats the JSON key"):
            parse_typed(Header, raw, "header", WHERE, HEADER_DEPTH)
    index = canonical_json(INDEX).decode("ascii")
    member = '"a":"model-00001-of-00002.ninfer"'
    raw = index.replace(member, member + "," + member, 1).encode("ascii")
    assert check(raw, IndexFile, INDEX_DEPTH) is None


@pytest.mark.parametrize("byte", [*range(0x20), 0x20, 0x7F])
def test_a_raw_control_byte_in_any_string_is_the_reference_answer(byte: int) -> None:
    # JSON refuses U+0000-U+001F unescaped in a string (all of them, up to 0x1f); 0x20 and
    # 0x7f are text.
    c = chr(byte)
    text = _canon()
    for old, new in [
        ('"x"', f'"x{c}"'),  # config value
        ('"nested":', f'"nes{c}ted":'),  # config key
        ('"name":"r"', f'"name":"r{c}"'),  # a typed string
        ('"role":"weight"', f'"role":"weight{c}"'),  # an interned one
        ('"a.w":{', f'"a.w{c}":{{'),  # a map key
    ]:
        assert old in text
        accepted = check(text.replace(old, new, 1).encode("utf-8"))
        assert (accepted is not None) == (byte >= 0x20), (old, byte)


@pytest.mark.parametrize("n", [31, 33, 64])
def test_a_hex_field_of_another_length_is_the_reference_answer(n: int) -> None:
    # A plane digest and an importance digest (32 hex digits), and the commit (40).
    text = _canon()
    hexes = "0123456789abcdef" * 5
    for old, new in [
        (f'{{"digest":"{DIGEST}","name":"codes"', f'{{"digest":"{hexes[:n]}","name":"codes"'),
        (f'"importance":"{DIGEST}"', f'"importance":"{hexes[:n]}"'),
        ('"commit":"' + "a" * 40 + '"', '"commit":"' + "a" * (n + 8) + '"'),
    ]:
        assert old in text
        assert check(text.replace(old, new, 1).encode("utf-8")) is None, (old, n)


def _byte_mutations(raw: bytes, rng: random.Random) -> bytes:
    b = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(b) + 1)
        kind = rng.randrange(4)
        if kind == 0 and at < len(b):
            b[at] = rng.choice(b'"\\{}[],:0123456789-+.eEtfnul \x1f\x00\xc3\xff')
        elif kind == 1:
            b[at:at] = rng.choice(_BYTE_TOKENS)
        elif kind == 2:
            del b[at : at + rng.randint(1, 8)]
        else:
            b[at:at] = b[at : at + rng.randint(1, 40)]  # a repeated span: keys, values
    return bytes(b)


_BYTE_TOKENS = [
    b'"', b"\\", b"\\u", b"\\ud800", b"\\udc00", b"\\ud83d\\ude00", b"\\u0000", b"\\/", b"\\x",
    b"{", b"}", b"[", b"]", b",", b":", b"-0", b"1e999", b"9223372036854775808", b"01", b"1.",
    b"true", b"null", b"nul", b"\xc3\xa9", b"\xed\xa0\x80", b'"a"', b'""', b"4.9e-324",
]  # fmt: skip


def test_byte_mutations_and_truncations_give_the_reference_answer() -> None:
    # Every prefix of a header and of an index (each escape and number cut at the end of the
    # buffer), then 1,500 random byte edits of a golden header, the rich one and its
    # ASCII-escaped spelling, all against the reference.
    rich, index = canonical_json(HEADER), canonical_json(INDEX)
    for i in range(len(rich)):
        check(rich[:i])
    for i in range(len(index)):
        check(index[:i], IndexFile, INDEX_DEPTH)
    golden = GOLDEN[0].read_bytes()
    h_off, h_len = PRELUDE.unpack(golden[:PRELUDE_SIZE])[4:6]
    bases = [rich, json.dumps(HEADER).encode("ascii"), golden[h_off : h_off + h_len]]
    rng = random.Random(12)
    accepted = 0
    for _ in range(1500):
        accepted += check(_byte_mutations(rng.choice(bases), rng)) is not None
    for _ in range(300):
        check(_byte_mutations(index, rng), IndexFile, INDEX_DEPTH)
    assert accepted > 0  # some edits (whitespace, a repeated digit) keep a valid header
