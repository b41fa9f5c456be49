"""Planning: claiming, identity, shapes and dtypes against formats, derived tensors, plan JSON."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from recipe_fixtures import RECIPE_HEAD, RECIPE_HEAD_LINES
from safetensors.torch import save_file

from ninfer_convert.layouts import lookup_layout
from ninfer_convert.recipe import (
    PlanEntry,
    RecipeProblems,
    build_plan,
    load_recipe,
    loads_recipe,
)
from ninfer_convert.source import SourceCheckpoint, open_source

REPO = Path(__file__).resolve().parents[1]

HEAD = RECIPE_HEAD
BASE = RECIPE_HEAD_LINES


def make_source(
    root: Path, tensors: dict[str, torch.Tensor], config: dict[str, object] | None = None
) -> SourceCheckpoint:
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(
        json.dumps(
            config
            if config is not None
            else {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
        )
    )
    return open_source(root)


def tiny(root: Path) -> SourceCheckpoint:
    bf = torch.bfloat16
    return make_source(
        root,
        {
            "model.embed_tokens.weight": torch.randn(16, 32).to(bf),
            "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 32).to(bf),
            "model.layers.0.self_attn.k_proj.weight": torch.randn(16, 32).to(bf),
            "model.layers.0.self_attn.v_proj.weight": torch.randn(16, 32).to(bf),
            "model.layers.0.input_layernorm.weight": torch.randn(32).to(bf),
            "model.norm.weight": torch.randn(32, dtype=torch.float32),
            "lm_head.weight": torch.randn(16, 32).to(bf),
        },
    )


def plan_text(body: str, source: SourceCheckpoint, head: str = HEAD, **kw: bool):  # type: ignore[no-untyped-def]
    return build_plan(loads_recipe(head + textwrap.dedent(body)), source, **kw)


def plan_problems(
    body: str, source: SourceCheckpoint, head: str = HEAD, **kw: bool
) -> list[tuple[int | None, str]]:
    with pytest.raises(RecipeProblems) as info:
        plan_text(body, source, head, **kw)
    return [(p.line, p.message) for p in info.value.problems]


GOOD = """\
- match: 're:.*norm\\.weight'
  format: FP32
  conversion: [bf16-to-f32]
  role: norm
- derive: 'model.layers.{L}.self_attn.qkv_proj.weight'
  inputs: ['model.layers.{L}.self_attn.q_proj.weight',
           'model.layers.{L}.self_attn.k_proj.weight',
           'model.layers.{L}.self_attn.v_proj.weight']
  concat_axis: 0
  format: Q4G64_F16S
  encoder_profile: MAXABS_F16_RECIP_RNE_V1
  role: attention-qkv
  evidence: [e1]
- match: model.embed_tokens.weight
  format: BF16
  role: embedding
- match: lm_head.weight
  format: W8G32_F16S
  encoder_profile: MAXABS_F16_RECIP_RNE_V1
  role: head
  transforms: [transpose]
  evidence: e1
"""


def test_good_plan(tmp_path: Path) -> None:
    src = tiny(tmp_path / "m")
    plan = plan_text(GOOD, src)
    assert [e.output for e in plan.entries] == sorted(e.output for e in plan.entries)
    by = {e.output: e for e in plan.entries}
    assert set(by) == {
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.norm.weight",
    }
    qkv = by["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == (64, 32) and qkv.format == "Q4G64_F16S"
    assert qkv.layout == "row-split-k128-v1" and qkv.encoder_profile == "MAXABS_F16_RECIP_RNE_V1"
    assert [s.name for s in qkv.sources] == [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
    ]
    assert [t.to_dict() for t in qkv.transforms] == [
        {"op": "concat", "axis": 0, "inputs": [s.name for s in qkv.sources]}
    ]
    assert (qkv.rule.index, qkv.rule.line, qkv.rule.kind) == (1, BASE + 5, "derive")
    assert qkv.evidence == ("e1",)
    assert qkv.encoded_bytes == lookup_layout("row-split-k128-v1").encoded_size(
        "Q4G64_F16S", (64, 32)
    )
    assert qkv.source_bytes == 64 * 32 * 2
    head = by["lm_head.weight"]
    assert head.shape == (32, 16) and [t.op for t in head.transforms] == ["transpose"]
    norm, fnorm = by["model.layers.0.input_layernorm.weight"], by["model.norm.weight"]
    assert (norm.conversion, fnorm.conversion) == ("bf16-to-f32", None)  # F32 source: bitwise
    emb = by["model.embed_tokens.weight"]
    assert (emb.conversion, emb.layout, emb.encoder_profile) == (None, "contiguous-le-v1", None)
    totals = {t.format: t for t in plan.totals}
    assert totals["FP32"].weights == 64 and totals["FP32"].encoded_bytes == 256
    assert totals["FP32"].bits_per_weight == 32.0
    assert plan.total_weights == sum(e.numel for e in plan.entries)
    assert plan.bits_per_weight == pytest.approx(
        8 * sum(e.encoded_bytes for e in plan.entries) / plan.total_weights
    )
    assert plan.identity_checked and plan.identity_mismatches == ()


def test_plan_json_and_entry_round_trip(tmp_path: Path) -> None:
    src = tiny(tmp_path / "m")
    plan = plan_text(GOOD, src)
    doc = json.loads(plan.to_json())
    assert doc["recipe"]["name"] == "t" and doc["recipe"]["digest"].startswith("sha256:")
    assert doc["source"]["kind"] == "hf-dir"
    assert doc["source"]["files"] == [["model.safetensors", src.files[0][1]]]
    assert len(doc["entries"]) == 5 and doc["totals"]["tensors"] == 5
    assert doc["evidence"] == [
        {"id": "e1", "citation": "somebody", "url": None, "summary": "something"}
    ]
    for e in plan.entries:
        again = PlanEntry.from_dict(json.loads(json.dumps(e.to_dict())))
        assert again == e
    # deterministic: a second plan serialises identically
    assert plan_text(GOOD, open_source(tmp_path / "m")).to_json() == plan.to_json()


def test_first_matching_rule_wins(tmp_path: Path) -> None:
    src = tiny(tmp_path / "m")
    plan = plan_text(
        """\
        - match: model.norm.weight
          format: FP32
          role: final-norm
        - match: '*'
          format: BF16
          conversion: f32-to-bf16-rne
          role: other
          evidence: e1
        """,
        src,
    )
    assert plan.entry("model.norm.weight").role == "final-norm"
    assert plan.entry("model.norm.weight").format == "FP32"
    assert all(e.role == "other" for e in plan.entries if e.output != "model.norm.weight")


def test_shadowed_and_empty_rules(tmp_path: Path) -> None:
    src = tiny(tmp_path / "m")
    found = plan_problems(
        """\
        - match: '*'
          format: BF16
          conversion: f32-to-bf16-rne
          role: all
          evidence: e1
        - match: lm_head.weight
          format: BF16
          role: head
        - match: nothing.here
          format: BF16
          role: x
        - match: also.nothing
          format: BF16
          role: x
          optional: true
        """,
        src,
    )
    assert found == [
        (
            BASE + 6,
            "rule 2 (match 'lm_head.weight'): claims nothing: every tensor it matches (1, "
            "e.g. 'lm_head.weight') is already claimed by the rule(s) at line(s) 11; "
            "reorder the rules or mark it optional: true",
        ),
        (
            BASE + 9,
            "rule 3 (match 'nothing.here'): matches no source tensor; fix the pattern or "
            "mark the rule optional: true",
        ),
    ]


def test_unclaimed_tensors_listed(tmp_path: Path) -> None:
    src = tiny(tmp_path / "m")
    found = plan_problems("- match: lm_head.weight\n  format: BF16\n  role: head\n", src)
    # The whole message: every unclaimed tensor, in name order, and not the claimed one.
    assert found == [
        (
            None,
            "6 source tensors are claimed by no rule or skip: model.embed_tokens.weight, "
            "model.layers.0.input_layernorm.weight, model.layers.0.self_attn.k_proj.weight, "
            "model.layers.0.self_attn.q_proj.weight, model.layers.0.self_attn.v_proj.weight, "
            "model.norm.weight",
        )
    ]


def test_one_unclaimed_tensor_is_named_in_the_singular(tmp_path: Path) -> None:
    src = make_source(tmp_path / "m", {"a": torch.ones(2), "b": torch.ones(2)})
    found = plan_problems("- match: a\n  format: FP32\n  role: r\n", src)
    assert found == [(None, "1 source tensor is claimed by no rule or skip: b")]


def test_many_unclaimed_tensors_show_the_first_50_and_a_count(tmp_path: Path) -> None:
    names = [f"t{i:03d}" for i in range(57)]
    src = make_source(tmp_path / "m", {n: torch.ones(1) for n in ["a", *names]})
    found = plan_problems("- match: a\n  format: FP32\n  role: r\n", src)
    assert found == [
        (
            None,
            "57 source tensors are claimed by no rule or skip: "
            + ", ".join(names[:50])
            + " ... and 7 more",
        )
    ]


def test_skips_recorded(tmp_path: Path) -> None:
    src = make_source(tmp_path / "m", {"a": torch.ones(2), "b.inv_freq": torch.ones(2)})
    plan = plan_text(
        """\
        - skip: '*.inv_freq'
          reason: recomputed
        - match: a
          format: FP32
          role: x
        """,
        src,
    )
    assert [(s.name, s.reason, s.rule.line) for s in plan.skipped] == [
        ("b.inv_freq", "recomputed", BASE + 1)
    ]
    assert json.loads(plan.to_json())["skipped"][0]["reason"] == "recomputed"


def test_dtype_and_shape_problems_all_together(tmp_path: Path) -> None:
    src = make_source(
        tmp_path / "m",
        {
            "f32": torch.ones(4, 64),
            "f8": torch.zeros(4, 64, dtype=torch.float8_e4m3fn),
            "vec": torch.ones(64, dtype=torch.bfloat16),
            "ints": torch.ones(4, 64, dtype=torch.int32),
            "big": torch.ones(4, 64, dtype=torch.int64),
            "f64": torch.ones(3, dtype=torch.float64),
            "cube": torch.ones(2, 3, 64, dtype=torch.bfloat16),
            "zero": torch.ones(0, 64, dtype=torch.bfloat16),
        },
    )
    found = plan_problems(
        """\
        - match: f32
          format: BF16
          role: a
        - match: f8
          format: BF16
          role: a
        - match: vec
          format: Q4G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: a
          evidence: e1
        - match: ints
          format: W8G32_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: a
          evidence: e1
        - match: big
          format: I32
          role: a
        - match: f64
          format: FP32
          role: a
        - match: cube
          format: Q6G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: a
          evidence: e1
        - match: zero
          format: Q5G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: a
          evidence: e1
        """,
        src,
    )
    lines = {line: msg for line, msg in found}
    assert len(found) == 8
    assert (
        "'f32' is F32; storing it as BF16 needs an explicit conversion (add conversion: "
        "f32-to-bf16-rne)" in lines[BASE + 1]
    )
    assert "no conversion from F8_E4M3 to BF16 exists" in lines[BASE + 4]
    assert "takes positive rank-two matrices" in lines[BASE + 7]
    assert "'ints' is I32; W8G32_F16S encodes only BF16, F16 or F32" in lines[BASE + 12]
    assert "add conversion: int-to-i32" in lines[BASE + 17]
    assert "no conversion from F64 to FP32 exists" in lines[BASE + 20]
    assert "[2, 3, 64]" in lines[BASE + 23]
    assert "[0, 64]" in lines[BASE + 28]


def test_load_and_plan_problems_reported_together(tmp_path: Path) -> None:
    src = tiny(tmp_path / "m")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        HEAD
        + textwrap.dedent("""\
        - match: lm_head.weight
          format: FP16
          role: head
        - match: model.embed_tokens.weight
          format: Q4G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: emb
        - match: no.such.tensor
          format: BF16
          role: x
        - match: 're:.*norm\\.weight'
          format: BF16
          role: norm
        """)
    )
    with pytest.raises(RecipeProblems) as info:
        build_plan(recipe, src)
    got = [(p.line, p.message) for p in info.value.problems]
    assert [line for line, _ in got] == [BASE + 2, BASE + 4, BASE + 8, BASE + 11, None]
    assert "unknown numeric format 'FP16'" in got[0][1]
    assert "needs cited evidence" in got[1][1]
    assert "matches no source tensor" in got[2][1]
    assert (
        "'model.norm.weight' is F32; storing it as BF16 needs an explicit conversion" in got[3][1]
    )
    # A rule with an unknown format still claims its tensors: exactly q/k/v are unclaimed.
    assert got[4][1] == (
        "3 source tensors are claimed by no rule or skip: "
        "model.layers.0.self_attn.k_proj.weight, model.layers.0.self_attn.q_proj.weight, "
        "model.layers.0.self_attn.v_proj.weight"
    )
    text = str(info.value)
    assert text.startswith(f"{recipe}: 5 problems applying the recipe to ")
    assert re.search(rf"line {BASE + 8}: rule 3 \(match 'no.such.tensor'\)", text)


def test_identity_checks_and_override(tmp_path: Path) -> None:
    src = make_source(
        tmp_path / "m",
        {"w": torch.ones(2, 3)},
        {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "text_config": {"num_hidden_layers": 4},
            "tie_word_embeddings": True,
        },
    )
    head = HEAD.replace(
        "  model_type: llama\n",
        (
            "  model_type: [llama, mistral]\n"
            "  architectures: LlamaForCausalLM\n"
            "  config:\n"
            "    text_config.num_hidden_layers: 64\n"
            "    tie_word_embeddings: 1\n"
            "    hidden_size: 5120\n"
            "  tensor_count: 7\n"
            "  shapes:\n"
            "    w: [3, 2]\n"
            "    v: [1]\n"
        ),
    )
    body = "- match: w\n  format: FP32\n  role: r\n"
    found = plan_problems(body, src, head=head)
    msgs = [m for _l, m in found]
    assert len(found) == 8
    assert all(m.startswith("source identity: ") for m in msgs)
    assert "model_type is 'qwen3', the recipe is for 'llama' or 'mistral'" in msgs[0]
    assert "architectures are ['Qwen3ForCausalLM']" in msgs[1]
    assert "text_config.num_hidden_layers is 4, the recipe expects 64" in msgs[2]
    assert "tie_word_embeddings is True, the recipe expects 1" in msgs[3]  # JSON types kept apart
    assert "config.json has no 'hidden_size'" in msgs[4]
    assert "the source has 1 tensors, the recipe expects 7" in msgs[5]
    assert "'w' has shape [2, 3], the recipe expects [3, 2]" in msgs[6]
    assert "the source has no tensor 'v'" in msgs[7]
    assert [line for line, _m in found] == [5, 6, 8, 9, 10, 11, 13, 14]

    plan = plan_text(body, src, head=head, check_identity=False)
    assert not plan.identity_checked and len(plan.identity_mismatches) == 8
    doc = json.loads(plan.to_json())
    assert doc["identity"]["checked"] is False and len(doc["identity"]["mismatches"]) == 8


def test_identity_needs_config(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(2)}, str(path))
    found = plan_problems("- match: w\n  format: FP32\n  role: r\n", open_source(path))
    assert found == [
        (
            5,
            "source identity: the recipe checks config.json but the source "
            "(safetensors-file) has none",
        )
    ]


def test_derive_errors(tmp_path: Path) -> None:
    bf = torch.bfloat16
    src = make_source(
        tmp_path / "m",
        {
            "l.0.a": torch.ones(2, 4, dtype=bf),
            "l.0.b": torch.ones(2, 5, dtype=bf),
            "l.1.a": torch.ones(2, 4, dtype=bf),
            "l.2.a": torch.ones(2, 4, dtype=bf),
            "l.2.b": torch.ones(2, 4),
            "l.3.a": torch.ones(2, 4, dtype=bf),
            "l.3.b": torch.ones(2, 4, dtype=bf),
        },
    )
    found = plan_problems(
        """\
        - match: l.3.b
          format: BF16
          role: r
        - derive: 'l.{L}.ab'
          inputs: ['l.{L}.a', 'l.{L}.b']
          concat_axis: 0
          format: BF16
          role: r
        """,
        src,
    )
    msgs = sorted(m for _l, m in found)
    assert len(found) == 4 and {line for line, _m in found} == {BASE + 4}
    assert any("'l.0.ab': cannot concatenate on axis 0: dimension 1 differs" in m for m in msgs)
    assert any("'l.1.ab': input 'l.1.b' is missing from the source" in m for m in msgs)
    assert any("'l.2.ab': inputs have different dtypes" in m for m in msgs)
    assert any(
        "'l.3.ab': input 'l.3.b' is already claimed by the rule at line 11" in m for m in msgs
    )


def test_transforms_and_duplicate_outputs(tmp_path: Path) -> None:
    bf = torch.bfloat16
    src = make_source(
        tmp_path / "m",
        {
            "conv": torch.ones(8, 1, 4, dtype=bf),
            "t": torch.ones(3, 5, dtype=bf),
            "x": torch.ones(2, 2, dtype=bf),
            "y": torch.ones(2, 2, dtype=bf),
        },
    )
    plan = plan_text(
        """\
        - match: conv
          format: Q4G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: conv
          transforms: [{reshape: [-1, 4]}, transpose]
          evidence: e1
        - derive: 'renamed.{A}'
          inputs: ['{A}']
          transforms: [transpose]
          format: BF16
          role: r
        """,
        src,
    )
    conv = plan.entry("conv")
    assert conv.shape == (4, 8)
    assert [t.to_dict() for t in conv.transforms] == [
        {"op": "reshape", "shape": [8, 4]},
        {"op": "transpose"},
    ]
    assert plan.entry("renamed.t").shape == (5, 3)
    assert {e.output for e in plan.entries} == {"conv", "renamed.t", "renamed.x", "renamed.y"}

    found = plan_problems(
        """\
        - match: conv
          format: BF16
          role: r
          transforms: [transpose]
        - match: t
          format: BF16
          role: r
          transforms: [{reshape: [4, -1]}]
        - derive: 'x'
          inputs: ['y']
          format: BF16
          role: r
        - match: x
          format: BF16
          role: r
        """,
        src,
    )
    assert found == [
        (
            BASE + 4,
            "rule 1 (match 'conv'): 'conv': transpose needs rank two, the tensor has "
            "shape [8, 1, 4]",
        ),
        (BASE + 8, "rule 2 (match 't'): 't': cannot reshape [3, 5] to [4, -1]"),
        (BASE + 13, "rule 4 (match 'x'): output 'x' is also produced by the rule at line 19"),
    ]


def test_conversion_lists_pick_by_dtype(tmp_path: Path) -> None:
    src = make_source(
        tmp_path / "m",
        {
            "a": torch.ones(2),
            "b": torch.ones(2, dtype=torch.float16),
            "c": torch.ones(2, dtype=torch.bfloat16),
            "i8": torch.ones(2, dtype=torch.int8),
            "i32": torch.ones(2, dtype=torch.int32),
        },
    )
    plan = plan_text(
        """\
        - match: '[abc]'
          format: BF16
          conversion: [f32-to-bf16-rne, f16-to-bf16-rne]
          keep_nonfinite: true
          role: r
          evidence: e1
        - match: 'i*'
          format: I32
          conversion: int-to-i32
          role: idx
        """,
        src,
    )
    conv = {e.output: (e.conversion, e.keep_nonfinite) for e in plan.entries}
    assert conv == {
        "a": ("f32-to-bf16-rne", True),
        "b": ("f16-to-bf16-rne", True),
        "c": (None, False),
        "i8": ("int-to-i32", False),
        "i32": (None, False),
    }


# ---------------------------------------------------------------------------------------------
# transformers-made checkpoints and the shipped recipe


def _hf_model(root: Path, arch: str, tie: bool) -> SourceCheckpoint:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    common = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": tie,
    }
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    model.to(torch.bfloat16).save_pretrained(root, max_shard_size="30KB")
    return open_source(root)


@pytest.mark.interop
@pytest.mark.parametrize(("arch", "tie"), [("llama", False), ("qwen3", True)])
def test_generic_recipe_on_transformers_checkpoints(tmp_path: Path, arch: str, tie: bool) -> None:
    src = _hf_model(tmp_path / arch, arch, tie)
    assert len(src.files) > 1  # sharded with an index
    plan = build_plan(REPO / "recipes" / "generic-dense.yaml", src)
    fmt = {e.output: e.format for e in plan.entries}
    assert fmt["model.embed_tokens.weight"] == "Q6G64_F16S"
    assert fmt["model.layers.1.self_attn.v_proj.weight"] == "Q6G64_F16S"
    assert fmt["model.layers.0.mlp.down_proj.weight"] == "Q6G64_F16S"
    assert fmt["model.layers.0.mlp.up_proj.weight"] == "Q4G64_F16S"
    assert fmt["model.layers.0.self_attn.q_proj.weight"] == "Q4G64_F16S"
    assert fmt["model.norm.weight"] == "FP32"
    assert ("lm_head.weight" in fmt) is (not tie)
    if arch == "qwen3":
        assert fmt["model.layers.0.self_attn.q_norm.weight"] == "FP32"
    assert set(fmt) == set(src.tensors)
    assert all(e.conversion in (None, "bf16-to-f32") for e in plan.entries)


@pytest.mark.interop
def test_docs_example_recipe_plans(tmp_path: Path) -> None:
    """The complete example in docs/recipes.md must stay valid."""
    doc = (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")
    block = doc.split("## 8. A complete small example", 1)[1].split("```yaml\n", 1)[1]
    recipe = loads_recipe(block.split("```", 1)[0])
    src = _hf_model(tmp_path / "llama", "llama", False)
    plan = build_plan(recipe, src)
    qkv = plan.entry("model.layers.1.self_attn.qkv_proj.weight")
    assert qkv.shape == (64 + 32 + 32, 64)
    assert plan.entry("model.layers.1.mlp.down_proj.weight").role == "layer-matrix"
    assert plan.entry("lm_head.weight").format == "W8G32_F16S"


def test_load_recipe_matches_loads(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(HEAD + GOOD)
    a, b = load_recipe(p), loads_recipe(HEAD + GOOD, path=str(p))
    assert a == b
