"""The planner builds one entry per (rule, dtype, shape) the whole way and the others of that key
from it (recipe/plan_entries.py, ``_from_template``): every entry and every problem must be what
planning each candidate alone (no reuse) gives."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert.recipe import loads_recipe, plan_entries
from ninfer_convert.recipe.claiming import Claims
from ninfer_convert.recipe.entries import PlanEntry
from ninfer_convert.recipe.model import Problem, SourceField
from ninfer_convert.recipe.plan_entries import EntryBuilder
from ninfer_convert.source import SourceTensorInfo, open_source

RULES = """\
- match: 're:.*\\.up\\.weight'
  format: Q4G64_F16S
  encoder_profile: MAXABS_F16_RECIP_RNE_V1
  role: mlp-up
  evidence: [e1]
  transforms: [transpose]
- match: 're:.*\\.norm\\.weight'
  format: BF16
  conversion: [f32-to-bf16-rne]
  keep_nonfinite: true
  role: norm
  evidence: [e1]
- derive: 'model.layers.{L}.flat.weight'
  inputs: ['model.layers.{L}.down.weight']
  format: FP32
  conversion: [bf16-to-f32]
  transforms: [{reshape: [-1, 2]}]
  role: down
- match: 're:.*\\.gate\\.weight'
  format: BF16
  role: gate
  constraints: [finite-only]
- skip: 're:.*\\.bias'
  reason: unused
"""


def _source(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    t: dict[str, tuple[str, np.ndarray]] = {}
    for i in range(6):
        p = f"model.layers.{i}"
        # Two shapes per rule, so that a key holds several tensors and a rule several keys.
        rows = 64 if i % 2 else 128
        t[f"{p}.up.weight"] = ("BF16", np.zeros((rows, 64), np.uint16))
        t[f"{p}.norm.weight"] = (("F32", np.zeros(rows, np.uint32)) if i % 3 else
                                 ("BF16", np.zeros(rows, np.uint16)))  # fmt: skip
        t[f"{p}.down.weight"] = ("BF16", np.zeros((2, rows), np.uint16))
        # A gate of F32 needs a conversion its rule lacks: a problem for each such tensor.
        t[f"{p}.gate.weight"] = (("F32", np.zeros(4, np.uint32)) if i in (1, 4) else
                                 ("BF16", np.zeros(4, np.uint16)))  # fmt: skip
        t[f"{p}.bias"] = ("BF16", np.zeros(4, np.uint16))
    # An up tensor of rank one (transpose refuses it), twice.
    t["model.layers.8.up.weight"] = ("BF16", np.zeros(64, np.uint16))
    t["model.layers.9.up.weight"] = ("BF16", np.zeros(64, np.uint16))
    write_safetensors(root / "model.safetensors", t)
    return root


def test_reused_entries_and_problems_equal_planning_each_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = open_source(_source(tmp_path / "m"))
    recipe = loads_recipe(RECIPE_HEAD + textwrap.dedent(RULES))
    claimed: list[Problem] = []
    claims = Claims(recipe, src, claimed)
    claims.claim_all()
    assert claimed == []

    problems: list[Problem] = []
    reused: list[str] = []
    real = plan_entries._from_template

    def counted(t: PlanEntry, output: str, info: SourceTensorInfo, fld: SourceField) -> PlanEntry:
        reused.append(output)
        return real(t, output, info, fld)

    with monkeypatch.context() as m:
        m.setattr(plan_entries, "_from_template", counted)
        together = EntryBuilder(claims.candidates, problems).entries()
    alone: list = []
    alone_problems: list[Problem] = []
    for cand in claims.candidates:
        alone += EntryBuilder([cand], alone_problems).entries()
    alone.sort(key=lambda e: e.output)

    assert together == alone
    assert [e.to_dict() for e in together] == [e.to_dict() for e in alone]
    assert problems == alone_problems
    assert len(problems) == 4  # two F32 gates, two rank-one ups
    # The reuse path ran: one entry per (rule, dtype, shape) planned, the others copied.
    keys = {(e.rule.index, e.source_dtype, e.sources[0].shape) for e in together}
    assert len(reused) == len(together) - len(keys) > 0


def test_reused_entries_name_their_own_shard(tmp_path: Path) -> None:
    # Tensors of one (rule, dtype, shape) in two shard files: each entry's source names the
    # file that holds its own tensor, not the file of the tensor its entry was copied from.
    root = tmp_path / "m"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    weight_map = {}
    for n in (1, 2):
        file = f"model-{n:05d}-of-00002.safetensors"
        names = [f"model.layers.{2 * n + i}.gate.weight" for i in range(2)]
        write_safetensors(root / file, {k: ("BF16", np.zeros(4, np.uint16)) for k in names})
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    src = open_source(root)
    recipe = loads_recipe(RECIPE_HEAD + textwrap.dedent(RULES))
    claimed: list[Problem] = []
    claims = Claims(recipe, src, claimed)
    claims.claim_all()
    problems: list[Problem] = []
    entries = EntryBuilder(claims.candidates, problems).entries()
    assert problems == [] and len(entries) == 4
    for e in entries:
        (s,) = e.sources
        assert (s.name, s.file) == (e.output, weight_map[e.output])
