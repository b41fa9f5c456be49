"""The header reader's C helpers (ninfer_convert/_jsonfast.c) give what their Python paths give.

``jsonlimits.scan`` is the C module's one pass when it is built and must return exactly what
``scan_python`` (the regular expressions) returns, on any text, valid JSON or not; with it the
header reader runs the documented order of checks first instead of its parse-first shortcut,
and every document must be refused with the same message either way.  The compiled decoders
build their instances with ``slot_maker`` instead of the frozen ``__init__``: the instances
must be the ones ``__init__`` builds.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from artifact_fixtures import write_raw_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer_convert import jsonlimits
from ninfer_convert.container import open_artifact, typed_json
from ninfer_convert.container.schema import SCHEMA_CLASSES, PlaneEntry, RuleRef, TensorEntry
from ninfer_convert.container.wire import SINGLE_NAME
from ninfer_convert.errors import ArtifactError
from ninfer_convert.jsonlimits import scan, scan_python
from ninfer_convert.native import optional_module

_native = optional_module("_jsonfast")
needs_native = pytest.mark.skipif(
    _native is None and os.environ.get("NINFER_REQUIRE_NATIVE") != "1",
    reason="the C module _jsonfast was not built",
)
_GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.ninfer"))


# ---------------------------------------------------------------------------------------------
# scan


@needs_native
def test_native_scan_is_the_python_scan_on_every_short_text() -> None:
    # Every text of up to 5 characters over the characters the scan acts on (strings,
    # escapes, brackets, colons) plus one it does not: unterminated strings, trailing
    # backslashes, unbalanced brackets, colons inside and outside strings.
    assert jsonlimits.NATIVE_SCAN
    alphabet = '"\\[]{}:a'
    for n in range(6):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            for limit in (1, 2):
                assert _native.scan(text, limit) == scan_python(text, limit), (text, limit)


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    st.text(st.sampled_from('"\\[]{}:, a\u00e9\u4e00\U0001f600\ud800'), max_size=60),
    st.integers(1, 4),
)
def test_native_scan_is_the_python_scan_on_random_text_of_every_width(
    text: str, limit: int
) -> None:
    # One-, two- and four-byte strings (the C loop reads each width), lone surrogates too.
    assert scan(text, limit) == scan_python(text, limit)


@needs_native
@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.integers() | st.text('"\\[]{}: a\u00e9'),
        lambda c: st.lists(c) | st.dictionaries(st.text('"\\[]{}: a'), c),
        max_leaves=40,
    ),
    st.booleans(),
)
def test_native_scan_counts_the_members_of_json(value: object, spaced: bool) -> None:
    text = json.dumps(value, separators=(", ", ": ") if spaced else (",", ":"))
    members, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            members += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    assert scan(text, 100) == (None, members) == scan_python(text, 100)


@needs_native
def test_native_scan_finds_the_first_deep_bracket_past_one_mebibyte() -> None:
    pad = '"' + "[" * (1 << 20) + '"'  # brackets inside one long string: not counted
    text = "[" + pad + "," + "{" * 70 + "}" * 70 + "]"
    assert scan(text, 64) == scan_python(text, 64) == (len(pad) + 2 + 63, 0)
    with pytest.raises(ValueError):
        scan(text, 0)


# ---------------------------------------------------------------------------------------------
# The reader's order of checks with and without the C scan


def _outcome(path: Path) -> tuple[str, str]:
    try:
        art = open_artifact(path)
    except ArtifactError as exc:
        return ("refused", str(exc))
    try:
        return ("opened", repr([t.entry for t in art.tensors.values()]) + repr(art.meta))
    finally:
        art.close()


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[str, str], ...]:
    native = _outcome(path)
    with monkeypatch.context() as m:
        m.setattr(typed_json, "NATIVE_SCAN", False)
        m.setattr(jsonlimits, "_native", None)
        python = _outcome(path)
    return native, python


_RAW = [
    b'{"a":1,"a":2}',
    b'{"a" :1,"a":2}',
    b'{"a":{"b":1,"b":2}}',
    b"\xff\xfe{}",
    b'{"x": NaN}',
    b"[" * 100000 + b"]" * 100000,
    b'"' + b"[" * 5000,  # an unterminated string: its brackets count
    b'["' + b"[" * 5000 + b'"]',  # a terminated one: they do not
    b'{"x": "\\' + b"[" * 5000,
    b'{"x": ' + b"9" * 5000 + b"}",
    b"",
    b"null",
    b'"\\ud800"',
    b'{":":1}',
    b'{"a\\":":1}',
]


@needs_native
@pytest.mark.parametrize("raw", _RAW)
def test_raw_headers_are_refused_with_the_same_message_with_and_without_the_c_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: bytes
) -> None:
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, bytes(48), raw)
    native, python = _both(path, monkeypatch)
    assert native[0] == "refused"
    assert native == python


@needs_native
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_mutated_golden_headers_open_alike_with_and_without_the_c_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    blob = data.draw(st.sampled_from(_GOLDEN)).read_bytes()
    h_off, h_len = struct.unpack_from("<QQ", blob, 16)
    text = blob[h_off : h_off + h_len].decode()
    # Cut, repeat or insert JSON punctuation at one place of the real header text.
    at = data.draw(st.integers(0, len(text)))
    piece = data.draw(st.sampled_from(['"', "\\", "[", "]", "{", "}", ":", ",", ' ":', '"a":1,']))
    how = data.draw(st.sampled_from(["insert", "replace", "duplicate-member"]))
    if how == "insert":
        text = text[:at] + piece + text[at:]
    elif how == "replace":
        text = text[:at] + piece + text[at + 1 :]
    else:
        text = text.replace('"role":"weight"', '"role":"weight","role":"weight"', 1)
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, blob[:h_off], text.encode())
    native, python = _both(path, monkeypatch)
    assert native == python, (at, piece, how)


# ---------------------------------------------------------------------------------------------
# slot_maker


def _fast_classes() -> list[type[Any]]:
    return [c for c in SCHEMA_CLASSES if c._FAST_NAME is not None]


@needs_native
@pytest.mark.parametrize("cls", _fast_classes(), ids=lambda c: c.__name__)
def test_compiled_decoders_build_with_the_slot_maker_what_init_builds(cls: type[Any]) -> None:
    names = tuple(f.name for f in dataclasses.fields(cls))
    maker = _native.slot_maker(cls, names)
    assert type(cls._compiled.__globals__[_ctor_name(cls)]) is type(maker)
    values = tuple(object() for _ in names)
    made, init = maker(*values), cls(*values)
    assert type(made) is cls
    assert all(getattr(made, n) is v for n, v in zip(names, values, strict=True))
    assert made == init and hash(made) == hash(init) and repr(made) == repr(init)
    if names:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(made, names[0], 1)


def _ctor_name(cls: type[Any]) -> str:
    # The decoder's source names its constructor _clsN (objects._compile_decoder).
    found = re.search(r"_cls\d+", cls._compiled.__doc__)
    assert found is not None
    return found.group()


@needs_native
def test_slot_maker_refuses_what_is_not_a_writable_slot() -> None:
    with pytest.raises(TypeError, match="is not a slot"):
        _native.slot_maker(PlaneEntry, ("name", "bogus"))
    with pytest.raises(TypeError, match="is not a slot"):
        _native.slot_maker(TensorEntry, ("to_json",))
    with pytest.raises(TypeError, match="not a class defined in Python"):
        _native.slot_maker(int, ())
    with pytest.raises(TypeError, match="slot names must be strings"):
        _native.slot_maker(PlaneEntry, (1,))
    maker = _native.slot_maker(RuleRef, ("index", "line", "pattern"))
    with pytest.raises(TypeError, match="takes 3 arguments, got 2"):
        maker(1, 2)
    with pytest.raises(TypeError, match="positional"):
        maker(1, 2, pattern="x")
    assert maker(1, 2, "x") == RuleRef(1, 2, "x")


@needs_native
def test_slot_maker_untracks_only_instances_that_cannot_reach_a_cycle() -> None:
    import gc

    maker = _native.slot_maker(PlaneEntry, ("name", "offset", "nbytes", "digest"))
    atoms = maker("words", 0, 2, "0" * 32)
    assert not gc.is_tracked(atoms)
    shape = tuple([1, 2])  # a fresh tuple of ints: untracked along with its holder
    rule = _native.slot_maker(RuleRef, ("index", "line", "pattern"))
    assert gc.is_tracked(shape)
    held = rule(0, 1, shape)
    assert not gc.is_tracked(held) and not gc.is_tracked(shape)
    cyclic: list[Any] = []
    via_list = maker("words", 0, 2, cyclic)
    via_tuple = maker("words", 0, 2, (1, cyclic))
    assert gc.is_tracked(via_list) and gc.is_tracked(via_tuple)
    # A real cycle through a tracked instance is still found by the collector.
    freed: list[bool] = []

    class Flag:
        def __del__(self) -> None:
            freed.append(True)

    cyclic += [via_list, Flag()]
    del cyclic, via_list, via_tuple
    gc.collect()
    assert freed == [True]


# ---------------------------------------------------------------------------------------------
# Bulk header checks (checks.check_header_tensors)


def _entries(count: int) -> tuple[dict[str, Any], int]:
    """A valid header of ``count`` BF16 [2, 3] tensors at alignment 64, and its payload end."""
    tensors, cursor = [], 48
    for i in range(count):
        offset = -(-cursor // 64) * 64
        tensors.append({
            "name": f"t{i}", "format": "BF16", "layout": "contiguous-le-v1",
            "shape": [2, 3], "physical": [2, 3], "role": "weight",
            "planes": [{"name": "words", "offset": offset, "nbytes": 12, "digest": "0" * 32}],
            "provenance": {
                "sources": [{"name": f"t{i}", "dtype": "BF16", "shape": [2, 3], "file": "m"}],
                "conversion": None, "transforms": [], "encoder_profile": None,
                "rule": {"index": 0, "line": 3, "pattern": "t"}, "constraints": [],
            },
        })  # fmt: skip
        cursor = offset + 12
    artifact = {
        "alignment": 64,
        "producer": {"name": "ninfer-convert", "version": "test"},
        "recipe": {"digest": "", "evidence": [], "name": "t", "text": "t: 1\n"},
        "source": {"config": None, "files": [], "kind": "synthetic", "path": "", "tensors": {}},
    }
    header = {"artifact": artifact, "files": [], "shard": {"count": 1, "index": 1},
              "tensors": tensors}  # fmt: skip
    return header, cursor


def test_a_valid_header_is_cleared_in_bulk_without_the_per_entry_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ninfer_convert.container import checks

    header, end = _entries(5)
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, bytes(end), json.dumps(header).encode())

    def walked(*args: object) -> None:
        raise AssertionError("the per-entry walk ran for a valid header")

    monkeypatch.setattr(checks, "check_tensor_geometry", walked)
    monkeypatch.setattr(checks, "check_placement", walked)
    with open_artifact(path) as art:
        assert list(art.tensors) == [f"t{i}" for i in range(5)]


_GEOMETRY_VALUES = st.sampled_from(
    [0, 1, 11, 12, 13, 47, 48, 63, 64, 65, 128, 192, 256, 2**62, 2**63 - 1, "t0", "t1", "",
     "a\x01", "words", "codes", [2, 3], [3, 2], [6], [], "BF16", "FP32", "Q4G64_F16S",
     "contiguous-le-v1", "MAXABS_F16_RECIP_RNE_V1"]
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_bulk_checks_refuse_what_the_per_entry_walk_refuses_with_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    # One or two geometry values of a 4-tensor header replaced (names, formats, layouts,
    # shapes, plane names, offsets, sizes, encoder profiles): opened with the bulk pass and
    # with it answering "maybe not" always, the outcome must be the same.
    from ninfer_convert.container import checks

    header, end = _entries(4)
    for _ in range(data.draw(st.integers(1, 2))):
        t = header["tensors"][data.draw(st.integers(0, 3))]
        field = data.draw(
            st.sampled_from(["name", "format", "layout", "shape", "physical", "plane.name",
                             "plane.offset", "plane.nbytes", "encoder_profile"])
        )  # fmt: skip
        value = data.draw(_GEOMETRY_VALUES)
        if field.startswith("plane."):
            t["planes"][0][field[6:]] = value
        elif field == "encoder_profile":
            t["provenance"]["encoder_profile"] = value
        else:
            t[field] = value
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, bytes(end), json.dumps(header).encode())
    bulk = _outcome(path)
    with monkeypatch.context() as m:
        m.setattr(checks, "_all_clear", lambda *args: False)
        walked = _outcome(path)
    assert bulk == walked


@pytest.mark.parametrize("which", [0, 2, 3])
def test_a_consistent_tensor_larger_than_the_file_is_refused_as_the_walk_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: int
) -> None:
    # Shape, physical extents and plane size agree (2**40 BF16 words), so only placement can
    # refuse it: the plane ends beyond the payload, whatever tensor it is.
    from ninfer_convert.container import checks

    header, end = _entries(4)
    t = header["tensors"][which]
    t["shape"] = t["physical"] = [2**40]
    t["planes"][0]["nbytes"] = 2**41
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, bytes(end), json.dumps(header).encode())
    bulk = _outcome(path)
    with monkeypatch.context() as m:
        m.setattr(checks, "_all_clear", lambda *args: False)
        walked = _outcome(path)
    assert bulk == walked
    assert bulk[0] == "refused" and "lies beyond the payload region" in bulk[1]


@needs_native
def test_dict_values_reads_exactly_the_key_set_or_declines() -> None:
    keys = ("a", "b")
    assert _native.dict_values({"b": 2, "a": 1}, keys) == (1, 2)
    assert _native.dict_values({"a": 1}, keys) is None  # a key missing
    assert _native.dict_values({"a": 1, "b": 2, "c": 3}, keys) is None  # one more
    assert _native.dict_values({"a": 1, "c": 3}, keys) is None  # as many, another one
    assert _native.dict_values({"a": 1, 2: 3}, keys) is None  # a key that is not a string
    assert _native.dict_values([("a", 1), ("b", 2)], keys) is None  # not a dict
    assert _native.dict_values({}, ()) == ()

    class Sub(dict):  # type: ignore[type-arg]
        pass

    assert _native.dict_values(Sub(a=1, b=2), keys) is None  # only exactly a dict
    with pytest.raises(TypeError):
        _native.dict_values({}, ["a"])
    with pytest.raises(TypeError):  # an unhashable key is the caller's error, not None
        _native.dict_values({"a": 1}, ([],))


def test_a_rule_reference_is_one_instance_whichever_path_decoded_its_entry() -> None:
    # The memo key of a shared class names the class on both paths: an entry the fast path
    # took and one only the checked path takes (an extra key) share their equal RuleRef.
    rule = {"index": 0, "line": 3, "pattern": "re:.*"}
    memo: dict[Any, Any] = {}
    fast = RuleRef.from_json(dict(rule), "rule", memo)
    checked = RuleRef.checked_from_json(dict(rule), "rule", memo)
    assert fast is checked


def _nest(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


_OPENS = {"escaped key", "config at the schema's depth bound"}


def _golden_variants() -> list[tuple[str, bytes]]:
    """Hostile edits of a real header at the byte level, each reaching a different check."""
    blob = (Path(__file__).parent / "golden" / "BF16.ninfer").read_bytes()
    h_off, h_len = struct.unpack_from("<QQ", blob, 16)
    text = blob[h_off : h_off + h_len]
    name, config = b'"name":"w"', b'"config":null'
    assert name in text and config in text
    deep = typed_json.HEADER_DEPTH - 3  # config's own level and those below it
    out = [
        ("bom", b"\xef\xbb\xbf" + text),
        ("trailing garbage", text + b"x"),
        ("trailing object", text + b"{}"),
        ("trailing NUL", text + b"\x00"),
        (
            "config at the schema's depth bound",
            text.replace(config, b'"config":' + _nest(deep - 1)),
        ),
        ("config at the scan's depth bound", text.replace(config, b'"config":' + _nest(deep))),
        ("config past it", text.replace(config, b'"config":' + _nest(deep + 1))),
        ("unclosed config", text.replace(config, b'"config":' + b"[" * (deep + 1))),
        ("repeated key", text.replace(name, name + b"," + name)),
        ("repeated key, other value", text.replace(name, name + b',"name":"v"')),
        ("escaped key", text.replace(name, b'"n\\u0061me":"w"')),
        ("lone surrogate", text.replace(name, b'"name":"\\ud800"')),
        ("reversed pair", text.replace(name, b'"name":"\\udc00\\ud800"')),
        ("escaped control", text.replace(name, b'"name":"\\u0001"')),
        ("raw tab", text.replace(name, b'"name":"\t"')),
        ("overlong UTF-8", text.replace(name, b'"name":"\xc0\xaf"')),
        ("UTF-8 surrogate", text.replace(name, b'"name":"\xed\xa0\x80"')),
        ("name too long", text.replace(name, b'"name":"' + "\U0001f600".encode() * 4097 + b'"')),
    ]
    for literal in [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 5000, b"-0", b"1.0",
                    b"true", b"01", b"+1"]:  # fmt: skip
        out.append(
            (
                f"alignment {literal[:8]!r}",
                text.replace(b'"alignment":64', b'"alignment":' + literal),
            )
        )
        out.append((f"config {literal[:8]!r}", text.replace(config, b'"config":' + literal)))
    return out


@needs_native
@pytest.mark.parametrize(
    ("what", "raw"), _golden_variants(), ids=[w for w, _ in _golden_variants()]
)
def test_hostile_edits_of_a_real_header_get_the_message_they_got_before_the_c_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, raw: bytes
) -> None:
    # Each edit reaches a different check (encoding, nesting, JSON syntax, repeated keys,
    # literals, the schema); with the C scan the reader runs them in the documented order
    # and must give the very outcome the parse-first order gives.
    path = tmp_path / SINGLE_NAME
    blob = (Path(__file__).parent / "golden" / "BF16.ninfer").read_bytes()
    write_raw_header(path, blob[: struct.unpack_from("<Q", blob, 16)[0]], raw)
    native, python = _both(path, monkeypatch)
    assert native == python, what
    assert native[0] == ("opened" if what in _OPENS else "refused"), (what, native)
