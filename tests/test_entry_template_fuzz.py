"""The entry templates against canonical_json under hypothesis: any names (every code point,
escapes, surrogates, marker look-alikes), any offsets, and fixed values that are equal but not
of one type (1, 1.0, True, -0.0 compare and hash equal and encode differently) give the same
bytes, or the same exception, as encoding the entry whole."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer_convert.container.entry_template import EntryTemplates
from ninfer_convert.container.schema import (
    PlaneEntry,
    Provenance,
    RuleRef,
    SourceRef,
    TensorEntry,
)
from ninfer_convert.container.wire import MAX_INT, canonical_json

_MARKERS = ["\x00\x01name\x01\x00", "\x00\x01source0\x01\x00", "\x00\x01source1\x01\x00"]
_names = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(alphabet=st.characters(codec=None), min_size=1, max_size=8),  # surrogates too
    st.sampled_from([*_MARKERS, '"', "\\", "\\u0000", str(MAX_INT - 4096)]),
    st.lists(st.sampled_from([*_MARKERS, "a", '"', "\x1f", "\u2028", "\ud800"]), min_size=1).map(
        "".join
    ),
    st.integers(300, 3000).map(lambda n: "x" * n),
)
_offsets = st.integers(-(2**64), 2**64) | st.sampled_from(
    [0, 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63, MAX_INT - 4096, MAX_INT - 4095]
)
# Values equal to a small int that json spells otherwise.
_dim = st.sampled_from([4, 4.0, 2, 2.0, 1, 1.0, True, 0, 0.0, -0.0, False])


def _entry(
    name: str,
    offsets: list[int],
    sources: list[str],
    dims: tuple[object, object],
    line: object,
) -> TensorEntry:
    prov = Provenance(
        sources=tuple(SourceRef(s, "BF16", dims, "model.safetensors") for s in sources),  # type: ignore[arg-type]
        conversion=None,
        transforms=(),
        encoder_profile=None,
        rule=RuleRef(0, line, "re:.*"),  # type: ignore[arg-type]
        constraints=(),
    )
    planes = tuple(PlaneEntry(f"p{i}", o, 8, "0" * 32) for i, o in enumerate(offsets))
    return TensorEntry(name, "BF16", "contiguous-le-v1", dims, dims, planes, "weight", prov)  # type: ignore[arg-type]


def _encoded(templates: EntryTemplates, e: TensorEntry) -> tuple[str, object]:
    try:
        got = templates.encode(e)
    except Exception as exc:  # the same exception type is the contract
        return "raised", type(exc)
    return "bytes", got


def _whole(e: TensorEntry) -> tuple[str, object]:
    try:
        got = canonical_json(e.to_json())
    except Exception as exc:
        return "raised", type(exc)
    return "bytes", got


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            _names,
            st.lists(_offsets, min_size=0, max_size=3),
            st.lists(_names, min_size=0, max_size=2),
            st.tuples(_dim, _dim),
            _dim,
        ),
        min_size=1,
        max_size=12,
    )
)
def test_templates_match_canonical_json(
    specs: list[tuple[str, list[int], list[str], tuple[object, object], object]],
) -> None:
    templates = EntryTemplates()
    for name, offsets, sources, dims, line in specs:
        e = _entry(name, offsets, sources, dims, line)
        assert _encoded(templates, e) == _whole(e), e


def test_equal_fixed_values_of_other_types_are_not_confused() -> None:
    # 1 == 1.0 == True: one template for all three would spell the later entries' shape,
    # physical extents, source shape and rule line as the first one's.
    for first, later in [(1, True), (1, 1.0), (0, -0.0), (1.0, 1), (0, False)]:
        templates = EntryTemplates()
        a = _entry("a", [64], ["s"], (first, 2), 3)
        b = _entry("b", [128], ["t"], (later, 2), 3)
        c = _entry("c", [192], ["u"], (4, 2), later if isinstance(later, int) else 3)
        templates.encode(a)
        templates.encode(_entry("d", [256], ["v"], (4, 2), first))
        for e in (b, c):
            assert templates.encode(e) == canonical_json(e.to_json()), (first, later, e)


def test_equal_fixed_strings_and_numbers_of_other_types_are_not_confused() -> None:
    # A fixed field of a str-typed slot holding an equal number of another type.
    for first, later in [(1, True), (0, 0.0), (2, 2.0)]:
        templates = EntryTemplates()
        a = _entry("a", [64], ["s"], (4, 2), 3)
        b = _entry("b", [64], ["s"], (4, 2), 3)
        a = TensorEntry(
            a.name, a.format, a.layout, a.shape, a.physical, a.planes, first, a.provenance
        )  # type: ignore[arg-type]
        b = TensorEntry(
            b.name, b.format, b.layout, b.shape, b.physical, b.planes, later, b.provenance
        )  # type: ignore[arg-type]
        templates.encode(a)
        assert templates.encode(b) == canonical_json(b.to_json()), (first, later)
