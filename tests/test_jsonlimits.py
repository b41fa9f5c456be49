"""The JSON nesting bound: exact offsets, strings ignored, no recursion on deep input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ninfer_convert.jsonlimits import MAX_JSON_DEPTH, nesting_problem


def test_depth_at_the_limit_is_accepted_and_one_more_is_refused_at_its_bracket() -> None:
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert nesting_problem(ok) is None
    deep = '{"a": ' + "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH + "}"
    assert nesting_problem(deep) == len('{"a": ') + MAX_JSON_DEPTH - 1


def test_brackets_inside_strings_and_escaped_quotes_do_not_count() -> None:
    text = json.dumps({"k": "[[[[" * 100 + '\\"{{{{' * 100, "n": [[1]]})
    assert nesting_problem(text, limit=3) is None
    assert nesting_problem(text, limit=2) == text.index("[[1") + 1


def test_a_million_levels_is_refused_without_recursion() -> None:
    text = "[" * 1_000_000
    assert nesting_problem(text) == MAX_JSON_DEPTH


def test_lone_surrogates_in_text_do_not_break_the_scan() -> None:
    assert nesting_problem('["\ud800", [1]]', limit=1) == 6


@given(
    st.recursive(
        st.none() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=30,
    )
)
def test_agrees_with_the_parsed_depth(value: object) -> None:
    def depth(v: object) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    text = json.dumps(value)
    d = depth(value)
    if d:
        assert nesting_problem(text, limit=d) is None
        assert nesting_problem(text, limit=d - 1) is not None if d > 1 else True
    else:
        assert nesting_problem(text, limit=1) is None


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        nesting_problem("[]", limit=0)


def test_depth_carries_across_scan_chunks() -> None:
    from ninfer_convert import jsonlimits

    pad = " " * (jsonlimits._CHUNK - 3)
    text = "[[" + pad + "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert nesting_problem(text) == 2 + len(pad) + MAX_JSON_DEPTH - 2
    assert nesting_problem(text, limit=MAX_JSON_DEPTH + 1) is None
