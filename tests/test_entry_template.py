"""The size plan's entry templates: every entry's JSON is canonical_json of that entry, byte for
byte, whatever its names hold, and entries of one kind share one template."""

from __future__ import annotations

import itertools

import pytest

import ninfer_convert.container.entry_template as entry_template
from ninfer_convert.container.entry_template import EntryTemplates
from ninfer_convert.container.schema import (
    ConcatTransform,
    PlaneEntry,
    Provenance,
    ReshapeTransform,
    RuleRef,
    SourceRef,
    TensorEntry,
    TransposeTransform,
)
from ninfer_convert.container.wire import MAX_INT, canonical_json

# Names that need escaping, look like the markers or the JSON around them.
NAMES = [
    "model.layers.0.w.weight",
    'quote"d',
    "back\\slash\\",
    "tab\tnew\nline\x00nul\x1f",
    "ünï/códe.weight ✓ 𝄞",
    "\x00\x01name\x01\x00",
    "\x00\x01source0\x01\x00",
    '"\\u0000\\u0001name\\u0001\\u0000"',
    str(MAX_INT - 4096),
    "x" * 300,
    '","name":"',
]
PATTERNS = [
    "re:.*\\.weight",
    "\x00\x01name\x01\x00",
    "\x00\x01source1\x01\x00",
    str(MAX_INT - 4096),
]


def _entry(
    name: str, offsets: tuple[int, ...], sources: tuple[str, ...], **kw: object
) -> TensorEntry:
    prov = Provenance(
        sources=tuple(
            SourceRef(s, "BF16", kw.get("src_shape", (4, 2)), "model.safetensors")  # type: ignore[arg-type]
            for s in sources
        ),
        conversion=kw.get("conversion"),  # type: ignore[arg-type]
        transforms=kw.get("transforms", ()),  # type: ignore[arg-type]
        encoder_profile=None,
        rule=RuleRef(0, 7, str(kw.get("pattern", PATTERNS[0]))),
        constraints=('c"1',),
        importance=kw.get("importance"),  # type: ignore[arg-type]
    )
    planes = tuple(
        PlaneEntry(f"plane{i}", off, 8 + i, f"{i:032x}") for i, off in enumerate(offsets)
    )
    shape = kw.get("shape", (4, 2))
    return TensorEntry(name, "BF16", "contiguous-le-v1", shape, shape, planes, "weight", prov)  # type: ignore[arg-type]


def _entries() -> list[TensorEntry]:
    out = []
    for i, (name, pattern) in enumerate(itertools.product(NAMES, PATTERNS)):
        offsets = (64 * i, 64 * i + 4096)[: 1 + i % 2]
        sources = (name, NAMES[(i + 1) % len(NAMES)])[: 1 + i % 3 // 2]
        kw: dict[str, object] = {"pattern": pattern}
        if i % 4 == 1:
            kw["transforms"] = (ConcatTransform(0), TransposeTransform(), ReshapeTransform((8,)))
        if i % 5 == 2:
            kw["conversion"] = "f32-to-bf16-rne"
            kw["importance"] = "a" * 32
        if i % 3 == 1:
            kw["src_shape"] = (2, 4)
        if i % 7 == 3:
            kw["shape"] = (MAX_INT - 4096, 1)  # a dimension equal to an offset marker
        out.append(_entry(name, offsets, sources, **kw))
    return out


def test_every_entry_is_its_canonical_json() -> None:
    templates = EntryTemplates()
    entries = _entries()
    for _ in range(2):  # the second round takes every template from the cache
        for e in entries:
            assert templates.encode(e) == canonical_json(e.to_json()), e.name


def test_entries_of_one_kind_share_a_template(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = entry_template.canonical_json

    def counted(value: object) -> bytes:
        calls.append(1)
        return real(value)

    monkeypatch.setattr(entry_template, "canonical_json", counted)
    templates = EntryTemplates()
    for i, name in enumerate(NAMES * 20):
        e = _entry(f"{name}.{i}", (4096 * i,), (f"src.{name}.{i}",))
        assert templates.encode(e) == real(e.to_json())
    assert len(calls) == 1


def test_a_marker_in_the_fixed_values_encodes_the_entry_whole() -> None:
    templates = EntryTemplates()
    for pattern in PATTERNS[1:]:
        for i in range(3):
            e = _entry(f"n{i}", (64 * i,), (f"s{i}", "t"), pattern=pattern)
            assert templates.encode(e) == canonical_json(e.to_json())
    # The rule patterns holding a marker's text made no template.
    assert all(t is None for t in templates._templates.values())


def test_inexact_types_encode_the_entry_whole() -> None:
    class Name(str):
        pass

    e = _entry("a", (64,), ("s",))
    odd = [
        _entry(Name("a"), (64,), ("s",)),
        _entry("a", (True,), ("s",)),  # a bool offset: json says true
        _entry("a", (64,), (Name("s"),)),
    ]
    templates = EntryTemplates()
    templates.encode(e)
    for x in odd:
        assert templates.encode(x) == canonical_json(x.to_json())


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry_template, "MAX_TEMPLATES", 3)
    templates = EntryTemplates()
    for i in range(10):  # a per-tensor importance digest: every entry a kind of its own
        e = _entry(f"n{i}", (64 * i,), (f"s{i}",), importance=f"{i:032x}")
        assert templates.encode(e) == canonical_json(e.to_json())
    assert len(templates._templates) == 3
