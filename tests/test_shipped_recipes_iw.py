"""The importance-weighted variants of the shipped recipes (recipes/*-iw.yaml): the same formats,
bits and roles as their canonical recipe on every tensor, MSE_F16_SEARCH_IW_V1 on each Linear
weight, MSE_F16_SEARCH_V1 on the token embedding, and never picked by source identity."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from recipe_fixtures import RECIPE_HEAD
from test_examples import MIXTURE_BF16, REAL_CONFIG, REAL_TENSORS, expected_shapes
from test_recipe_plan import make_source

from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import UsageError
from ninfer_convert.importance import attach_importance, write_importance_file
from ninfer_convert.recipe import (
    Plan,
    build_plan,
    lookup_shipped,
    matching_recipes,
    resolve_recipe,
)
from ninfer_convert.source import SourceCheckpoint, open_source
from ninfer_convert.source.checkpoint import SourceTensorInfo
from ninfer_convert.verify import verify_artifact

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
TINY_QWEN = ROOT / "examples" / "tiny-qwen3.5"
VARIANTS = {"generic-dense-iw": "generic-dense", "qwen3.6-27b-iw": "qwen3.6-27b"}
IW, MSE, CANONICAL = "MSE_F16_SEARCH_IW_V1", "MSE_F16_SEARCH_V1", "MAXABS_F16_RECIP_RNE_V1"
# The tensors without a Linear input (no importance vector from `ninfer calibrate`).
EMBEDDINGS = re.compile(r"model\.(language_model\.)?embed_tokens\.weight")


def _real_qwen_source(root: Path) -> SourceCheckpoint:
    """Qwen3.6-27B's 1199 tensors (names, shapes, BF16) as a metadata-only source: planning
    reads no tensor data, so the real inventory can be planned without the 55 GB of weights."""
    config = json.loads((TINY_QWEN / "config.json").read_text())
    for part in ("text_config", "vision_config"):
        config[part].update(REAL_CONFIG[part])
    infos, offset = {}, 0
    for name, shape in expected_shapes(config).items():
        n = 2 * int(np.prod(shape))
        infos[name] = SourceTensorInfo(name, "BF16", tuple(shape), "model.safetensors", n, offset)
        offset += n
    root.mkdir(parents=True, exist_ok=True)
    return SourceCheckpoint(
        path=root,
        kind="hf-dir",
        config=config,
        tensors=infos,
        files=(("model.safetensors", offset),),
        side_files=(),
        root=root,
    )


def _llama_source(root: Path, *, tied: bool) -> SourceCheckpoint:
    g = torch.Generator().manual_seed(0)
    h, inter, vocab = 64, 128, 96

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": w(vocab, h), "model.norm.weight": w(h)}
    for i in range(2):
        p = f"model.layers.{i}."
        tensors |= {p + f"self_attn.{x}_proj.weight": w(h, h) for x in "qkvo"}
        tensors |= {p + f"mlp.{x}_proj.weight": w(inter, h) for x in ("gate", "up")}
        tensors |= {p + "mlp.down_proj.weight": w(h, inter)}
        tensors |= {p + "input_layernorm.weight": w(h), p + "post_attention_layernorm.weight": w(h)}
    if not tied:
        tensors["lm_head.weight"] = w(vocab, h)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    return make_source(root, tensors, config | {"tie_word_embeddings": tied})


def _assert_variant_of(
    variant: Plan,
    canonical: Plan,
    embedding: str = MSE,
    linear: Callable[[str], str] = lambda _name: IW,
) -> None:
    """Same tensors, formats, roles, shapes and layouts; only the encoder profile differs, and
    it is ``linear(name)`` exactly where a Linear weight is grouped (the token embedding:
    ``embedding``)."""
    assert [e.output for e in variant.entries] == [e.output for e in canonical.entries]
    grouped = 0
    for v, c in zip(variant.entries, canonical.entries, strict=True):
        assert (v.format, v.role, v.shape, v.conversion) == (
            c.format,
            c.role,
            c.shape,
            c.conversion,
        )
        assert [s.name for s in v.sources] == [s.name for s in c.sources]
        if c.encoder_profile is None:
            assert v.encoder_profile is None, v.output
            continue
        grouped += 1
        assert c.encoder_profile == CANONICAL, c.output
        want = embedding if EMBEDDINGS.fullmatch(v.output) else linear(v.output)
        assert v.encoder_profile == want, v.output
    assert grouped > 0
    assert variant.skipped == canonical.skipped


# ---------------------------------------------------------------------------------------------
# the variants plan like their canonical recipe


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "own-head"])
def test_generic_iw_variant_plans_a_llama_like_the_generic_recipe(
    tmp_path: Path, tied: bool
) -> None:
    src = _llama_source(tmp_path / "m", tied=tied)
    variant = build_plan(RECIPES / "generic-dense-iw.yaml", src)
    canonical = build_plan(RECIPES / "generic-dense.yaml", src)
    # Planned: the embedding's rule selects the weighted profile (with a fallback_profile).
    _assert_variant_of(variant, canonical, embedding=IW)
    assert ("lm_head.weight" in {e.output for e in variant.entries}) is (not tied)
    assert {s.name for e in variant.entries for s in e.sources} == set(src.tensors)
    # With the vectors calibrate writes: a tied table has the head's vector under its own
    # name, so it is weighted; an own-head model has none for it, so the fallback applies.
    vectors = {e.output: _vector(e.shape[-1], i) for i, e in enumerate(variant.entries)}
    vectors["lm_head.weight"] = _vector(64, 99)
    if tied:
        vectors["model.embed_tokens.weight"] = vectors["lm_head.weight"]
    else:
        del vectors["model.embed_tokens.weight"]
    attached = attach_importance(variant, vectors, "imp.safetensors")
    _assert_variant_of(attached, canonical, embedding=IW if tied else MSE)
    embed = next(e for e in attached.entries if e.output == "model.embed_tokens.weight")
    assert (embed.importance is not None) is tied
    if tied:
        assert embed.importance.tobytes() == vectors["lm_head.weight"].tobytes()


def _vector(k: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(k, dtype=np.float32) + 0.01).view(np.uint32)


def test_qwen_iw_variant_plans_the_real_qwen36_27b_inventory(tmp_path: Path) -> None:
    src = _real_qwen_source(tmp_path / "real")
    assert len(src.tensors) == REAL_TENSORS
    variant = build_plan(RECIPES / "qwen3.6-27b-iw.yaml", src)
    assert variant.identity_checked and not variant.identity_mismatches and not variant.skipped
    claimed = [s.name for e in variant.entries for s in e.sources]
    assert sorted(claimed) == sorted(src.tensors), "every tensor claimed exactly once"
    _assert_variant_of(variant, build_plan(RECIPES / "qwen3.6-27b.yaml", src))
    patterns = {re.compile(k): v for k, v in MIXTURE_BF16.items()}
    for e in variant.entries:
        assert [v for p, v in patterns.items() if p.fullmatch(e.output)] == [(e.format, e.role)]
    weighted = [e for e in variant.entries if e.encoder_profile == IW]
    assert len(weighted) == 64 * 3 + 48 * 3 + 16 * 4 + 1  # MLP; DeltaNet qkv/z/out; attention; head


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_keeps_its_canonical_recipes_identity_bits_and_evidence(name: str) -> None:
    variant, canonical = lookup_shipped(name), lookup_shipped(VARIANTS[name])
    assert variant.to_dict()["identity"] == canonical.to_dict()["identity"]
    assert variant.formats() == canonical.formats()
    v_rec, c_rec = variant.recipe, canonical.recipe
    assert [(e.id, e.citation) for e in v_rec.evidence] == [
        (e.id, e.citation) for e in c_rec.evidence
    ]
    for v, c in zip(v_rec.rules, c_rec.rules, strict=True):
        pv, pc = (r.pattern.text if r.pattern else None for r in (v, c))
        assert (v.kind, pv, v.format, v.role, v.evidence, v.optional, v.conversions) == (
            c.kind, pc, c.format, c.role, c.evidence, c.optional, c.conversions
        )  # fmt: skip
        assert (v.encoder_profile is None) is (c.encoder_profile is None)
        assert v.fallback_profile in (None, MSE), v.describe()
    profiles = {r.encoder_profile for r in v_rec.rules} - {None}
    assert profiles == ({IW} if name == "generic-dense-iw" else {IW, MSE})


# ---------------------------------------------------------------------------------------------
# identity: a variant is used by name only


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_needs_importance_and_is_never_picked_by_identity(name: str) -> None:
    assert lookup_shipped(name).needs_importance
    assert not lookup_shipped(VARIANTS[name]).needs_importance
    src = open_source(TINY_QWEN)
    assert [s.name for s in matching_recipes(src)] == ["qwen3.6-27b"]
    assert resolve_recipe(name).name == name  # by name it resolves


def test_identity_pick_skips_an_importance_recipe_that_matches(tmp_path: Path) -> None:
    d = tmp_path / "shipped"
    d.mkdir()
    body = "- match: w\n  format: Q4G64_F16S\n  encoder_profile: {p}\n  role: r\n  evidence: [e1]\n"
    (d / "a.yaml").write_text(RECIPE_HEAD.replace("name: t", "name: a") + body.format(p=CANONICAL))
    (d / "a-iw.yaml").write_text(RECIPE_HEAD.replace("name: t", "name: a-iw") + body.format(p=IW))
    src = make_source(tmp_path / "m", {"w": torch.ones(2, 64)})
    picked = resolve_recipe(None, src, directory=d)
    assert (picked.how, picked.name) == ("identity", "a")
    (d / "a.yaml").unlink()
    with pytest.raises(UsageError) as info:
        resolve_recipe(None, src, directory=d)
    text = str(info.value)
    assert "no shipped recipe matches the source" in text
    assert "a-iw: needs calibration files" in text and "--recipe a-iw --importance FILE)" in text


# ---------------------------------------------------------------------------------------------
# end to end on the committed example


def test_qwen_iw_variant_converts_and_verifies_the_tiny_example(tmp_path: Path) -> None:
    plan = build_plan(RECIPES / "qwen3.6-27b-iw.yaml", open_source(TINY_QWEN))
    rng = np.random.default_rng(0)
    vectors = {
        e.output: (rng.random(e.shape[-1], dtype=np.float32) + 0.01).view(np.uint32)
        for e in plan.entries
        if e.encoder_profile == IW
    }
    imp = tmp_path / "imp.safetensors"
    write_importance_file(imp, vectors, {"ninfer.texts_origin": "test"})
    out = tmp_path / "out"
    report = convert_checkpoint(
        TINY_QWEN, RECIPES / "qwen3.6-27b-iw.yaml", out, device="cpu", jobs=1, importance=imp
    )
    assert {e.output for e in report.plan.entries if e.importance is not None} == set(vectors)
    result = verify_artifact(out, source=TINY_QWEN, device="cpu", jobs=1, oracle_groups=16)
    assert result.passed, [(f.check, f.tensor, f.message) for f in result.findings]


@pytest.mark.slow
@pytest.mark.interop
def test_calibrate_gives_every_weighted_rule_of_the_qwen_variant_a_vector(tmp_path: Path) -> None:
    """`ninfer calibrate` on the example (transformers' Qwen3.5 model) names a vector for every
    MSE_F16_SEARCH_IW_V1 tensor, so the variant converts with a real calibration (~30 s)."""
    pytest.importorskip("transformers")
    from ninfer_convert.calibrate import calibrate_source

    cal = calibrate_source(TINY_QWEN, texts=["one short calibration text", "and another"])
    plan = build_plan(RECIPES / "qwen3.6-27b-iw.yaml", open_source(TINY_QWEN))
    weighted = {e.output for e in plan.entries if e.encoder_profile == IW}
    assert weighted <= set(cal.vectors)
    assert "lm_head.weight" in weighted
