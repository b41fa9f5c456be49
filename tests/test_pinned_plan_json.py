"""Pinned bytes of plan JSON (``ninfer convert --dry-run --json`` prints ``Plan.to_dict()``):
the committed examples with their shipped recipes, each copy path, and one small checkpoint whose
plan holds every transform op, a conversion with ``keep_nonfinite``, a skipped tensor and both
kinds of rule, so a refactoring of how plan entries are serialised cannot change a byte.

The plan records the absolute paths of the source and the recipe; the test maps them to fixed
ones (``/pinned/...``) so that the digests do not depend on where the checkout lives."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
import xxhash
from recipe_fixtures import RECIPE_HEAD
from safetensors.torch import save_file
from test_pinned_outputs import _copy_source

from ninfer_convert.recipe import PlanEntry, build_plan, load_recipe
from ninfer_convert.source import open_source

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE_PLAN_DIGESTS = {
    ("tiny-qwen3.5", "qwen3.6-27b"): "67c41f2f6156e68a42ef6d4804cee133",
    ("tiny-qwen3.5-nvfp4", "qwen3.6-27b-nvfp4"): "6566000096f27e488acd281d4c104a20",
}

COPY_PLAN_DIGESTS = {
    "compressed-tensors-nvfp4": "c8a3770ea48890a6baaf1ec1d63fa5a8",
    "modelopt-nvfp4": "427fb94fe4e28fb73e24cf9450eb18eb",
    "compressed-tensors-fp8-channel": "4f8eb99328c7ccbca8e31ca4b0bc9965",
}

EVERY_OP_PLAN_DIGEST = "a6c764222d7934dd1c52b33a678d5147"

_EVERY_OP_RULES = """\
- skip: 're:.*\\.rotary_emb\\.inv_freq'
  reason: recomputed at load time
- derive: 'model.layers.{L}.self_attn.qkv_proj.weight'
  inputs: ['model.layers.{L}.self_attn.q_proj.weight',
           'model.layers.{L}.self_attn.k_proj.weight']
  concat_axis: 0
  format: Q4G64_F16S
  encoder_profile: MAXABS_F16_RECIP_RNE_V1
  role: attention-qkv
  evidence: [e1]
- match: conv
  format: Q4G64_F16S
  encoder_profile: MAXABS_F16_RECIP_RNE_V1
  role: conv
  transforms: [{reshape: [-1, 4]}, transpose]
  evidence: e1
- match: 're:.*norm\\.weight'
  format: BF16
  conversion: [f32-to-bf16-rne]
  keep_nonfinite: true
  role: norm
  evidence: e1
- match: lm_head.weight
  format: W8G32_F16S
  encoder_profile: MAXABS_F16_RECIP_RNE_V1
  role: head
  transforms: [transpose]
  constraints: [finite-only]
  evidence: [e1]
"""


def _plan_json(source: Path, recipe: Path) -> str:
    """The ``--dry-run --json`` document of a plan (without ``output``), paths pinned."""
    plan = build_plan(load_recipe(recipe), open_source(source))
    doc = plan.to_dict()
    assert doc["source"]["path"] == str(source) and doc["recipe"]["path"] == str(recipe)  # type: ignore[index]
    doc["source"]["path"] = "/pinned/source"  # type: ignore[index]
    doc["recipe"]["path"] = "/pinned/recipe.yaml"  # type: ignore[index]
    for e in plan.entries:  # the typed entries round-trip through their JSON form
        assert PlanEntry.from_dict(json.loads(json.dumps(e.to_dict()))) == e
    return json.dumps(doc, indent=2)


def _digest(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode())


@pytest.mark.parametrize(("example", "recipe"), list(EXAMPLE_PLAN_DIGESTS))
def test_example_plan_json_is_pinned(example: str, recipe: str) -> None:
    text = _plan_json(ROOT / "examples" / example, ROOT / "recipes" / f"{recipe}.yaml")
    assert _digest(text) == EXAMPLE_PLAN_DIGESTS[(example, recipe)]


@pytest.mark.parametrize("path", list(COPY_PLAN_DIGESTS))
def test_copy_path_plan_json_is_pinned(tmp_path: Path, path: str) -> None:
    (tmp_path / "recipe.yaml").write_text(_copy_source(tmp_path / "src", path))
    text = _plan_json(tmp_path / "src", tmp_path / "recipe.yaml")
    assert _digest(text) == COPY_PLAN_DIGESTS[path]


def every_op_source(root: Path) -> tuple[Path, Path]:
    """A small checkpoint and recipe whose plan holds every transform op, a conversion with
    ``keep_nonfinite``, a skipped tensor and both kinds of rule: (source, recipe)."""
    src = root / "src"
    src.mkdir(parents=True)
    g = torch.Generator().manual_seed(13)
    bf, f32 = torch.bfloat16, torch.float32
    save_file(
        {
            "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 64, generator=g).to(bf),
            "model.layers.0.self_attn.k_proj.weight": torch.randn(16, 64, generator=g).to(bf),
            "model.layers.0.self_attn.rotary_emb.inv_freq": torch.randn(8, generator=g),
            "model.layers.0.input_layernorm.weight": torch.randn(64, generator=g, dtype=f32),
            "conv": torch.randn(8, 1, 4, generator=g).to(bf),
            "lm_head.weight": torch.randn(64, 16, generator=g).to(bf),
        },
        str(src / "model.safetensors"),
    )
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "recipe.yaml").write_text(RECIPE_HEAD + textwrap.dedent(_EVERY_OP_RULES))
    return src, root / "recipe.yaml"


def test_plan_json_with_every_transform_skip_and_conversion_is_pinned(tmp_path: Path) -> None:
    text = _plan_json(*every_op_source(tmp_path))
    doc = json.loads(text)
    ops = {t["op"] for e in doc["entries"] for t in e["transforms"]}
    assert ops == {"concat", "reshape", "transpose"}
    assert [s["reason"] for s in doc["skipped"]] == ["recomputed at load time"]
    assert any(e["keep_nonfinite"] and e["conversion"] for e in doc["entries"])
    assert _digest(text) == EVERY_OP_PLAN_DIGEST
