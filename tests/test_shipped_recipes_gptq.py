"""The block-compensated variants of the shipped recipes (recipes/*-gptq.yaml): the same
formats, bits and roles as their canonical recipe on every tensor, GPTQ_F16_SEARCH_IW_V1 where
the recipe says, both calibration files needed, shown by `ninfer recipes`, never picked by
source identity; end to end with a real calibration of a tied and an untied model."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_examples import REAL_TENSORS
from test_shipped_recipes_iw import (
    CANONICAL,
    EMBEDDINGS,
    IW,
    MSE,
    RECIPES,
    TINY_QWEN,
    _assert_variant_of,
    _llama_source,
    _real_qwen_source,
)

from ninfer_convert.cli import main
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.factors import write_factor_file
from ninfer_convert.importance import write_importance_file
from ninfer_convert.recipe import build_plan, lookup_shipped, matching_recipes, shipped_recipes
from ninfer_convert.source import open_source
from ninfer_convert.verify import verify_artifact

GPTQ = "GPTQ_F16_SEARCH_IW_V1"
VARIANTS = {"generic-dense-gptq": "generic-dense", "qwen3.6-27b-gptq": "qwen3.6-27b"}
# The Qwen variant compensates its 4- to 6-bit Linear weights, and weights the W8G32 ones.
QWEN_GPTQ = re.compile(
    r"model\.language_model\.layers\.\d+\.(mlp\.(gate|up|down)_proj"
    r"|linear_attn\.in_proj_(qkv|z))\.weight"
)


def _qwen_linear(name: str) -> str:
    return GPTQ if QWEN_GPTQ.fullmatch(name) else IW


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "own-head"])
def test_generic_gptq_variant_plans_a_llama_like_the_generic_recipe(
    tmp_path: Path, tied: bool
) -> None:
    src = _llama_source(tmp_path / "m", tied=tied)
    variant = build_plan(RECIPES / "generic-dense-gptq.yaml", src)
    _assert_variant_of(
        variant, build_plan(RECIPES / "generic-dense.yaml", src), IW, lambda _n: GPTQ
    )
    assert ("lm_head.weight" in {e.output for e in variant.entries}) is (not tied)
    assert {s.name for e in variant.entries for s in e.sources} == set(src.tensors)


def test_qwen_gptq_variant_plans_the_real_qwen36_27b_inventory(tmp_path: Path) -> None:
    src = _real_qwen_source(tmp_path / "real")
    assert len(src.tensors) == REAL_TENSORS
    variant = build_plan(RECIPES / "qwen3.6-27b-gptq.yaml", src)
    assert variant.identity_checked and not variant.identity_mismatches and not variant.skipped
    claimed = [s.name for e in variant.entries for s in e.sources]
    assert sorted(claimed) == sorted(src.tensors), "every tensor claimed exactly once"
    _assert_variant_of(variant, build_plan(RECIPES / "qwen3.6-27b.yaml", src), MSE, _qwen_linear)
    gptq = [e for e in variant.entries if e.encoder_profile == GPTQ]
    assert len(gptq) == 64 * 3 + 48 * 2  # MLP gate/up/down; DeltaNet in_proj_qkv / in_proj_z
    assert {e.format for e in gptq} == {"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S"}
    # The recommended B = 128: the factors this recipe reads (docs: about 1.15 GB).
    factor_bytes = sum(e.shape[-1] * 128 * 4 for e in gptq)
    assert 1.1e9 < factor_bytes < 1.2e9


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_keeps_its_canonical_recipes_identity_bits_and_evidence(name: str) -> None:
    variant, canonical = lookup_shipped(name), lookup_shipped(VARIANTS[name])
    assert variant.to_dict()["identity"] == canonical.to_dict()["identity"]
    assert variant.formats() == canonical.formats()
    assert [(e.id, e.citation) for e in variant.recipe.evidence] == [
        (e.id, e.citation) for e in canonical.recipe.evidence
    ]
    for v, c in zip(variant.recipe.rules, canonical.recipe.rules, strict=True):
        pv, pc = (r.pattern.text if r.pattern else None for r in (v, c))
        assert (v.kind, pv, v.format, v.role, v.evidence, v.optional) == (
            c.kind, pc, c.format, c.role, c.evidence, c.optional
        )  # fmt: skip
        assert (v.encoder_profile is None) is (c.encoder_profile is None)
    assert GPTQ in {r.encoder_profile for r in variant.recipe.rules}


def test_which_recipes_need_which_calibration_files() -> None:
    needs = {s.name: s.calibration for s in shipped_recipes()}
    assert needs["generic-dense"] == () and needs["qwen3.6-27b"] == ()
    assert needs["generic-dense-iw"] == needs["qwen3.6-27b-iw"] == ("--importance",)
    both = ("--importance", "--factors")
    assert needs["generic-dense-gptq"] == needs["qwen3.6-27b-gptq"] == both
    assert [s.name for s in matching_recipes(open_source(TINY_QWEN))] == ["qwen3.6-27b"]


def test_ninfer_recipes_shows_the_calibration_files() -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["recipes", "--json"]) == 0
    doc = {r["name"]: r["calibration"] for r in json.loads(buf.getvalue())["recipes"]}
    assert doc["generic-dense"] == []
    assert doc["generic-dense-iw"] == ["--importance"]
    assert doc["generic-dense-gptq"] == ["--importance", "--factors"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["recipes"]) == 0
    rows = {line.split()[1]: line for line in buf.getvalue().splitlines() if "generic" in line}
    assert "--importance FILE --factors FILE" in rows["generic-dense-gptq"]
    assert "--importance FILE" in rows["generic-dense-iw"]
    assert "FILE" not in rows["generic-dense"]


def _identity_factor(k: int, block: int = 128) -> np.ndarray:
    f = np.zeros((k, block), dtype=np.float32)
    f[np.arange(k), np.arange(k) % block] = 1.0
    return f.view(np.uint32)


def test_qwen_gptq_variant_converts_and_verifies_the_tiny_example(tmp_path: Path) -> None:
    recipe = RECIPES / "qwen3.6-27b-gptq.yaml"
    plan = build_plan(recipe, open_source(TINY_QWEN))
    rng = np.random.default_rng(0)
    weighted = [e for e in plan.entries if e.encoder_profile in (IW, GPTQ)]
    vectors = {
        e.output: (rng.random(e.shape[-1], dtype=np.float32) + 0.01).view(np.uint32)
        for e in weighted
    }
    factors = {
        e.output: _identity_factor(e.shape[-1]) for e in weighted if e.encoder_profile == GPTQ
    }
    assert factors and len(factors) < len(vectors)
    imp, fac = tmp_path / "imp.safetensors", tmp_path / "fac.safetensors"
    write_importance_file(imp, vectors)
    write_factor_file(fac, factors)
    out = tmp_path / "out"
    report = convert_checkpoint(
        TINY_QWEN, recipe, out, device="cpu", jobs=1, importance=imp, factors=fac
    )
    assert {e.output for e in report.plan.entries if e.factor is not None} == set(factors)
    result = verify_artifact(out, source=TINY_QWEN, device="cpu", jobs=1, oracle_groups=8)
    assert result.passed, [(f.check, f.tensor, f.message) for f in result.findings]


@pytest.mark.interop
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "own-head"])
def test_generic_variants_convert_and_verify_a_real_calibration(tmp_path: Path, tied: bool) -> None:
    """`ninfer calibrate --compensation-block 128` on a transformers Llama, then both generic
    variants: with a tied head the embedding is weighted by the head's vector, without one it
    takes the fallback; every artifact verifies (a few seconds)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from ninfer_convert.calibrate import calibrate_source, write_calibration

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=tied, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    src = tmp_path / "model"
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(src)
    cal = calibrate_source(src, texts=["one two three four", "five six seven"], max_tokens=16,
                           compensation_block=128)  # fmt: skip
    imp, fac = tmp_path / "imp.safetensors", tmp_path / "fac.safetensors"
    write_calibration(cal, imp, fac)
    embed = "model.embed_tokens.weight"
    for name, files in (("generic-dense-iw", {}), ("generic-dense-gptq", {"factors": fac})):
        out = tmp_path / name
        report = convert_checkpoint(
            src, RECIPES / f"{name}.yaml", out, device="cpu", jobs=1, importance=imp, **files
        )
        entries = {e.output: e for e in report.plan.entries}
        assert entries[embed].encoder_profile == (IW if tied else MSE)
        if tied:
            got = entries[embed].importance
            assert got is not None and got.tobytes() == cal.vectors["lm_head.weight"].tobytes()
        linear = GPTQ if name.endswith("gptq") else IW
        for e in entries.values():
            if e.encoder_profile not in (None, CANONICAL) and not EMBEDDINGS.fullmatch(e.output):
                assert e.encoder_profile == linear, e.output
        result = verify_artifact(out, source=src, device="cpu", jobs=1, oracle_groups=8)
        assert result.passed, [(f.check, f.tensor, f.message) for f in result.findings]
