"""The per-tensor shortcuts of the source reader and the planner: positional makers
(jsonfields/makers.py), the one-scan name check (names.py) and the planner's output name
problems it stands in for."""

from __future__ import annotations

import gc
import json
import os
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert.jsonfields.makers import instance_maker
from ninfer_convert.names import MAX_NAME_CHARS, tensor_name_problem, tensor_names_problem_free
from ninfer_convert.native import optional_module
from ninfer_convert.recipe import build_plan, loads_recipe
from ninfer_convert.recipe.claiming import Candidate
from ninfer_convert.recipe.entries import PlanEntry, PlanSource
from ninfer_convert.recipe.model import RecipeProblems
from ninfer_convert.source import open_source
from ninfer_convert.source.checkpoint import SourceTensorInfo
from ninfer_convert.source.header import TensorEntry

_native = optional_module("_jsonfast")
needs_native = pytest.mark.skipif(
    _native is None and os.environ.get("NINFER_REQUIRE_NATIVE") != "1",
    reason="the C module _jsonfast was not built",
)


@dataclass(frozen=True)
class _Plain:
    a: object
    b: object = None


@dataclass(frozen=True, slots=True)
class _Slotted:
    a: object
    b: object = None


@dataclass(frozen=True)
class _Posted:
    a: object

    def __post_init__(self) -> None:
        object.__setattr__(self, "a", [self.a])


@dataclass(frozen=True)
class _Factory:
    a: object
    b: list[int] = field(default_factory=list)


@needs_native
@pytest.mark.parametrize("cls", [_Plain, _Slotted, _Factory])
def test_makers_build_what_init_builds(cls: type) -> None:
    make = instance_maker(cls)
    assert make is not cls  # the filler passed its check
    x, y = object(), (1, "s")
    made, init = make(x, y), cls(x, y)
    assert (
        type(made) is cls and made == init and hash(made) == hash(init) and repr(made) == repr(init)
    )
    assert made.a is x and made.b is y
    if not hasattr(cls, "__slots__"):
        assert vars(made) == vars(init)
    with pytest.raises(TypeError):
        make(x)


@needs_native
def test_makers_release_what_they_hold() -> None:
    make = instance_maker(_Plain)
    token = object()
    before = sys.getrefcount(token)
    made = [make(token, token) for _ in range(1000)]
    assert sys.getrefcount(token) == before + 2000
    del made
    gc.collect()
    assert sys.getrefcount(token) == before


def test_classes_with_more_in_init_keep_their_init() -> None:
    assert instance_maker(_Posted) is _Posted
    assert instance_maker(int) is int


@needs_native
def test_the_per_tensor_classes_get_fillers() -> None:
    for cls in (TensorEntry, SourceTensorInfo, PlanEntry, PlanSource, Candidate):
        assert instance_maker(cls) is not cls, cls


NAMES = ["a", "x" * MAX_NAME_CHARS, "é名", "a b"]
BAD = ["", "x" * (MAX_NAME_CHARS + 1), "a\x00", "a\x1f", "a\x7f", "\n"]


def test_the_joined_name_check_is_the_per_name_check() -> None:
    assert tensor_names_problem_free([]) and tensor_names_problem_free(NAMES)
    for bad in BAD:
        assert tensor_name_problem(bad) is not None
        for i in range(len(NAMES) + 1):
            assert not tensor_names_problem_free([*NAMES[:i], bad, *NAMES[i:]]), (bad, i)


def test_unstorable_output_names_are_problems_in_order(tmp_path: Path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_safetensors(
        root / "model.safetensors",
        {f"l.{i}.w": ("BF16", np.zeros(4, np.uint16)) for i in range(3)},
    )
    body = textwrap.dedent(
        """\
        - derive: "out.{L}\\x01"
          inputs: ['l.{L}.w']
          format: BF16
          role: w
        """
    )
    with pytest.raises(RecipeProblems) as info:
        build_plan(loads_recipe(RECIPE_HEAD + body), open_source(root))
    messages = [p.message for p in info.value.problems]
    assert messages == [
        "rule 1 (derive 'out.{L}\x01'): "
        f"output 'out.{i}\\x01': tensor name "
        f"'out.{i}\\x01' contains a control character"
        for i in range(3)
    ]
