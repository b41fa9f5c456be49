"""The plan's JSON form (``--dry-run --json`` entries and skipped tensors) is generated from the
plan classes' fields by the schema machinery: every class round-trips, the form is strict (one
key set per transform op, closed name sets, one JSON type per value), and the machinery refuses a
field it does not know how to write.  The bytes themselves are pinned in
tests/test_pinned_plan_json.py."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_convert.errors import SchemaError
from ninfer_convert.jsonfields import Int, SchemaObject, js, schema
from ninfer_convert.jsonlimits import scan
from ninfer_convert.recipe import PlanEntry, RuleRef, SkippedTensor, TransformStep
from ninfer_convert.recipe.entries import PlanSource
from ninfer_convert.recipe.model import RuleKind, SourceField

_NAME = st.text(min_size=1, max_size=8)
_INTS = st.lists(st.integers(0, 2**63 - 1), max_size=3).map(tuple)
_RULES = st.builds(
    RuleRef, st.integers(0, 99), st.integers(0, 999), st.sampled_from(get_args(RuleKind)), st.text()
)
_SOURCES = st.builds(
    PlanSource, _NAME, _NAME, _INTS, _NAME, st.integers(0, 2**40),
    st.sampled_from(get_args(SourceField)),
)  # fmt: skip
_STEPS = st.one_of(
    st.builds(
        lambda a, i: TransformStep("concat", axis=a, inputs=tuple(i)),
        st.integers(0, 63),
        st.lists(_NAME, min_size=2, max_size=3),
    ),
    st.just(TransformStep("transpose")),
    _INTS.map(lambda s: TransformStep("reshape", shape=s)),
)
_ENTRIES = st.builds(
    PlanEntry,
    output=_NAME, format=_NAME, layout=_NAME,
    encoder_profile=st.none() | _NAME, conversion=st.none() | _NAME,
    keep_nonfinite=st.booleans(), copy=st.none() | _NAME, role=st.text(max_size=5),
    constraints=st.lists(st.text(max_size=5), max_size=2).map(tuple), shape=_INTS,
    sources=st.lists(_SOURCES, min_size=1, max_size=3).map(tuple),
    transforms=st.lists(_STEPS, max_size=3).map(tuple), rule=_RULES,
    evidence=st.lists(st.text(max_size=5), max_size=2).map(tuple),
    encoded_bytes=st.integers(0, 2**50), source_bytes=st.integers(0, 2**50),
)  # fmt: skip
_SKIPPED = st.builds(SkippedTensor, _NAME, _NAME, _INTS, _NAME, _RULES, st.text(max_size=9))
_BY_CLASS: dict[type[Any], st.SearchStrategy[Any]] = {
    PlanSource: _SOURCES,
    TransformStep: _STEPS,
    RuleRef: _RULES,
    PlanEntry: _ENTRIES,
    SkippedTensor: _SKIPPED,
}


@pytest.mark.parametrize("cls", list(_BY_CLASS), ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_plan_class_round_trips_through_its_json(cls: type[Any], data: st.DataObject) -> None:
    obj = data.draw(_BY_CLASS[cls])
    value = json.loads(json.dumps(obj.to_dict()))
    assert value == obj.to_dict()
    assert cls.from_dict(copy.deepcopy(value)) == obj
    assert obj.json_pairs() == scan(json.dumps(value), 100)[1]
    assert cls.checked_from_json(copy.deepcopy(value)) == obj


def test_every_plan_class_has_a_round_trip() -> None:
    import ninfer_convert.recipe.entries as entries

    defined = {
        v
        for v in vars(entries).values()
        if isinstance(v, type) and issubclass(v, SchemaObject) and dataclasses.is_dataclass(v)
    }
    assert defined == set(_BY_CLASS)


def test_a_transform_step_holds_the_keys_of_its_op_only() -> None:
    assert TransformStep("concat", axis=1, inputs=("a", "b")).to_dict() == {
        "op": "concat", "axis": 1, "inputs": ["a", "b"],
    }  # fmt: skip
    assert TransformStep("reshape", shape=(8, 4)).to_dict() == {"op": "reshape", "shape": [8, 4]}
    assert TransformStep("transpose").to_dict() == {"op": "transpose"}
    for bad in (
        {"op": "transpose", "axis": 0},
        {"op": "reshape"},
        {"op": "reshape", "shape": [2], "inputs": ["a", "b"]},
        {"op": "concat", "inputs": ["a", "b"]},
        {"op": "concat", "axis": 0, "inputs": ["a"]},
        {"op": "concat", "axis": 0, "inputs": ["a", "b"], "shape": [2]},
    ):
        with pytest.raises(SchemaError) as info:
            TransformStep.from_dict(bad)
        assert info.value.where == "transform" and f"a {bad['op']} step has" in str(info.value)


def test_plan_json_names_the_failing_field() -> None:
    entry = json.loads(
        json.dumps(
            PlanEntry(
                "w", "BF16", "contiguous-le-v1", None, None, False, None, "r", (), (2, 2),
                (PlanSource("w", "BF16", (2, 2), "m.safetensors", 8),),
                (TransformStep("transpose"),), RuleRef(0, 5, "match", "w"), (), 8, 8,
            ).to_dict()
        )
    )  # fmt: skip
    cases = [
        (("keep_nonfinite",), 0, "entry.keep_nonfinite", "expected a boolean, got an integer"),
        (("shape",), [2.0, 2], "entry.shape[0]", "expected an integer, got a number"),
        (("transforms", 0, "op"), "flip", "entry.transforms[0].op", "unknown transform op 'flip'"),
        (("rule", "kind"), "glob", "entry.rule.kind", "unknown rule kind 'glob'"),
        (("sources", 0, "field"), "scales", "entry.sources[0].field", "unknown source field"),
        (("sources", 0, "name"), "", "entry.sources[0].name", "must not be empty"),
    ]
    for path, value, where, message in cases:
        doc = copy.deepcopy(entry)
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        parent[path[-1]] = value
        with pytest.raises(SchemaError) as info:
            PlanEntry.from_dict(doc)
        assert info.value.where == where and message in str(info.value), (path, str(info.value))
    doc = copy.deepcopy(entry)
    doc["importance"] = None  # not part of the JSON form
    with pytest.raises(SchemaError, match=r"unknown key\(s\) \['importance'\]"):
        PlanEntry.from_dict(doc)


def test_a_field_without_a_json_spec_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match=r"Bad\.b: declare the field with js\(\) or not_json\(\)"):

        @schema("bad")
        @dataclasses.dataclass(frozen=True)
        class Bad(SchemaObject):
            a: int = dataclasses.field(metadata=js(Int()))
            b: int = 0
