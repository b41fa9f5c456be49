"""The committed examples: structure, shard index, and agreement with docs/targets/qwen3.6-27b.md.

The tiny checkpoints under ``examples/`` stand in for Qwen3.6-27B in every end-to-end test, so
these tests pin what makes them faithful: the real tensor names (the anchored patterns of the
target document), shapes that follow from ``config.json`` by the same formulas that give the real
model's documented parameter total, a consistent multi-shard index, and -- for the NVFP4 export --
the compressed-tensors companion layout with every unquantized word identical to the BF16 example.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parent.parent
BF16_DIR = ROOT / "examples" / "tiny-qwen3.5"
NVFP4_DIR = ROOT / "examples" / "tiny-qwen3.5-nvfp4"
TARGET_DOC = ROOT / "docs" / "targets" / "qwen3.6-27b.md"
RECIPE_BF16 = ROOT / "recipes" / "qwen3.6-27b.yaml"
RECIPE_NVFP4 = ROOT / "recipes" / "qwen3.6-27b-nvfp4.yaml"

# The published Qwen3.6-27B configuration as documented in docs/targets/qwen3.6-27b.md, Section 1.1.
REAL_CONFIG: dict[str, dict[str, object]] = {
    "text_config": {
        "vocab_size": 248320,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 64,
        "layer_types": ["linear_attention"] * 3 * 16,  # replaced below by the real pattern
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "mtp_num_hidden_layers": 1,
    },
    "vision_config": {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "in_channels": 3,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "out_hidden_size": 5120,
        "num_position_embeddings": 2304,
    },
}
REAL_CONFIG["text_config"]["layer_types"] = [
    "full_attention" if i % 4 == 3 else "linear_attention" for i in range(64)
]
REAL_PARAMETERS = 27_781_427_952  # docs/targets/qwen3.6-27b.md, Section 2
REAL_TENSORS = 1199


# ---------------------------------------------------------------------------------------------
# helpers


def _config(directory: Path) -> dict[str, object]:
    return json.loads((directory / "config.json").read_text())


def _index(directory: Path) -> dict[str, object]:
    return json.loads((directory / "model.safetensors.index.json").read_text())


def _headers(directory: Path) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """name -> (shard, safetensors dtype, shape) read from the shard headers."""
    out: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(shard, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                view = handle.get_slice(name)
                assert name not in out, f"{name} appears in {out[name][0]} and {shard.name}"
                out[name] = (shard.name, view.get_dtype(), tuple(view.get_shape()))
    return out


def _target_patterns() -> list[tuple[re.Pattern[str], int]]:
    """The anchored name patterns and real-model counts of the target document, Section 2.1."""
    text = TARGET_DOC.read_text()
    block = text.split("<!-- name-patterns:begin -->", 1)[1].split("<!-- name-patterns:end -->")[0]
    patterns = []
    for line in block.splitlines():
        line = line.strip()
        if not line or line.startswith("```"):
            continue
        regex, count = line.rsplit(None, 1)
        patterns.append((re.compile(regex), int(count)))
    return patterns


def expected_shapes(config: dict[str, object]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3_5ForConditionalGeneration checkpoint with its MTP head.

    Shapes are derived from the configuration the way transformers' Qwen3.5 modules build them
    (docs/targets/qwen3.6-27b.md, Section 2); the same function must reproduce the committed
    example exactly and the real model's documented parameter total.
    """
    t: dict = config["text_config"]  # type: ignore[assignment]
    v: dict = config["vision_config"]  # type: ignore[assignment]
    h, inter, vocab = t["hidden_size"], t["intermediate_size"], t["vocab_size"]
    heads, kv_heads, head_dim = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    key_dim = t["linear_key_head_dim"] * t["linear_num_key_heads"]
    value_dim = t["linear_value_head_dim"] * t["linear_num_value_heads"]
    v_heads = t["linear_num_value_heads"]
    conv_dim = 2 * key_dim + value_dim

    def mlp(prefix: str) -> dict[str, tuple[int, ...]]:
        return {
            f"{prefix}.mlp.gate_proj.weight": (inter, h),
            f"{prefix}.mlp.up_proj.weight": (inter, h),
            f"{prefix}.mlp.down_proj.weight": (h, inter),
            f"{prefix}.input_layernorm.weight": (h,),
            f"{prefix}.post_attention_layernorm.weight": (h,),
        }

    def full_attention(prefix: str) -> dict[str, tuple[int, ...]]:
        return {
            # The attention output gate is packed into q_proj: 2 x heads x head_dim rows.
            f"{prefix}.self_attn.q_proj.weight": (2 * heads * head_dim, h),
            f"{prefix}.self_attn.k_proj.weight": (kv_heads * head_dim, h),
            f"{prefix}.self_attn.v_proj.weight": (kv_heads * head_dim, h),
            f"{prefix}.self_attn.o_proj.weight": (h, heads * head_dim),
            f"{prefix}.self_attn.q_norm.weight": (head_dim,),
            f"{prefix}.self_attn.k_norm.weight": (head_dim,),
        }

    def linear_attention(prefix: str) -> dict[str, tuple[int, ...]]:
        a = f"{prefix}.linear_attn"
        return {
            f"{a}.in_proj_qkv.weight": (conv_dim, h),
            f"{a}.in_proj_z.weight": (value_dim, h),
            f"{a}.in_proj_b.weight": (v_heads, h),
            f"{a}.in_proj_a.weight": (v_heads, h),
            f"{a}.conv1d.weight": (conv_dim, 1, t["linear_conv_kernel_dim"]),
            f"{a}.A_log": (v_heads,),
            f"{a}.dt_bias": (v_heads,),
            f"{a}.norm.weight": (t["linear_value_head_dim"],),
            f"{a}.out_proj.weight": (h, value_dim),
        }

    lm = "model.language_model"
    shapes: dict[str, tuple[int, ...]] = {
        f"{lm}.embed_tokens.weight": (vocab, h),
        f"{lm}.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    for i, kind in enumerate(t["layer_types"]):
        prefix = f"{lm}.layers.{i}"
        shapes.update(mlp(prefix))
        shapes.update(
            full_attention(prefix) if kind == "full_attention" else linear_attention(prefix)
        )

    shapes["mtp.fc.weight"] = (h, 2 * h)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        shapes[f"mtp.{norm}.weight"] = (h,)
    for i in range(t["mtp_num_hidden_layers"]):
        shapes.update(mlp(f"mtp.layers.{i}"))
        shapes.update(full_attention(f"mtp.layers.{i}"))

    vh, vi = v["hidden_size"], v["intermediate_size"]
    merged = vh * v["spatial_merge_size"] ** 2
    vis = "model.visual"
    shapes[f"{vis}.patch_embed.proj.weight"] = (
        vh,
        v["in_channels"],
        v["temporal_patch_size"],
        v["patch_size"],
        v["patch_size"],
    )
    shapes[f"{vis}.patch_embed.proj.bias"] = (vh,)
    shapes[f"{vis}.pos_embed.weight"] = (v["num_position_embeddings"], vh)
    for b in range(v["depth"]):
        p = f"{vis}.blocks.{b}"
        for norm in ("norm1", "norm2"):
            shapes[f"{p}.{norm}.weight"] = (vh,)
            shapes[f"{p}.{norm}.bias"] = (vh,)
        shapes[f"{p}.attn.qkv.weight"] = (3 * vh, vh)
        shapes[f"{p}.attn.qkv.bias"] = (3 * vh,)
        shapes[f"{p}.attn.proj.weight"] = (vh, vh)
        shapes[f"{p}.attn.proj.bias"] = (vh,)
        shapes[f"{p}.mlp.linear_fc1.weight"] = (vi, vh)
        shapes[f"{p}.mlp.linear_fc1.bias"] = (vi,)
        shapes[f"{p}.mlp.linear_fc2.weight"] = (vh, vi)
        shapes[f"{p}.mlp.linear_fc2.bias"] = (vh,)
    shapes[f"{vis}.merger.norm.weight"] = (vh,)
    shapes[f"{vis}.merger.norm.bias"] = (vh,)
    shapes[f"{vis}.merger.linear_fc1.weight"] = (merged, merged)
    shapes[f"{vis}.merger.linear_fc1.bias"] = (merged,)
    shapes[f"{vis}.merger.linear_fc2.weight"] = (v["out_hidden_size"], merged)
    shapes[f"{vis}.merger.linear_fc2.bias"] = (v["out_hidden_size"],)
    return shapes


def _is_nvfp4_linear(name: str) -> bool:
    """The linears llm-compressor's Qwen3.5/3.6 NVFP4 recipe quantizes (mtp.* is never loaded)."""
    return (
        re.fullmatch(
            r"model\.language_model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)",
            name,
        )
        is not None
    )


# ---------------------------------------------------------------------------------------------
# shard index


@pytest.mark.parametrize("directory", [BF16_DIR, NVFP4_DIR], ids=["bf16", "nvfp4"])
def test_index_agrees_with_shard_headers(directory: Path) -> None:
    index = _index(directory)
    weight_map: dict[str, str] = index["weight_map"]  # type: ignore[assignment]
    headers = _headers(directory)
    shards = sorted({s for s, _, _ in headers.values()})
    assert len(shards) >= 2, f"{directory.name}: {shards}"
    assert set(weight_map.values()) == set(shards), "a shard is unused or missing"
    assert weight_map == {name: shard for name, (shard, _, _) in headers.items()}


def test_bf16_index_total_size_is_the_tensor_bytes() -> None:
    index = _index(BF16_DIR)
    headers = _headers(BF16_DIR)
    sizes = {"BF16": 2}
    total = sum(sizes[dtype] * math.prod(shape) for _, dtype, shape in headers.values())
    assert index["metadata"]["total_size"] == total  # type: ignore[index]


@pytest.mark.parametrize("directory", [BF16_DIR, NVFP4_DIR], ids=["bf16", "nvfp4"])
def test_config_identity(directory: Path) -> None:
    config = _config(directory)
    assert config["model_type"] == "qwen3_5"
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    text = config["text_config"]
    assert text["layer_types"] == [  # type: ignore[index]
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ]
    assert text["mtp_num_hidden_layers"] == 1  # type: ignore[index]
    assert (directory / "generation_config.json").is_file()


# ---------------------------------------------------------------------------------------------
# the BF16 example against the target document


def test_bf16_example_names_and_shapes_follow_the_config() -> None:
    headers = _headers(BF16_DIR)
    expected = expected_shapes(_config(BF16_DIR))
    assert {n: s for n, (_, _, s) in headers.items()} == expected
    assert {dtype for _, dtype, _ in headers.values()} == {"BF16"}


def test_bf16_example_matches_target_name_patterns() -> None:
    patterns = _target_patterns()
    names = sorted(_headers(BF16_DIR))
    unmatched_patterns = {p.pattern for p, _ in patterns}
    for name in names:
        hits = [p.pattern for p, _ in patterns if p.fullmatch(name)]
        assert len(hits) == 1, f"{name} matches {hits}"
        unmatched_patterns.discard(hits[0])
    assert not unmatched_patterns, f"patterns with no tensor in the example: {unmatched_patterns}"


def test_target_document_counts_and_total_follow_the_real_config() -> None:
    """The same shape formulas, applied to Qwen3.6-27B's config, give the documented totals."""
    shapes = expected_shapes(REAL_CONFIG)
    assert len(shapes) == REAL_TENSORS
    assert sum(math.prod(s) for s in shapes.values()) == REAL_PARAMETERS
    # 2 bytes per BF16 parameter: the published index total_size of 55.56 GB.
    assert round(2 * REAL_PARAMETERS / 1e9, 2) == 55.56
    for pattern, count in _target_patterns():
        assert sum(1 for n in shapes if pattern.fullmatch(n)) == count, pattern.pattern
    assert sum(count for _, count in _target_patterns()) == REAL_TENSORS


def test_bf16_example_values_are_finite_and_not_degenerate() -> None:
    for name, (shard, _, _) in _headers(BF16_DIR).items():
        with safe_open(BF16_DIR / shard, framework="pt") as handle:
            tensor = handle.get_tensor(name).float()
        assert torch.isfinite(tensor).all(), name
        assert tensor.numel() == 1 or tensor.std() > 0, f"{name} is constant"


def test_example_exercises_partial_groups() -> None:
    """Some quantizable K is not a multiple of 64 or 32 (partial final groups), all are of 16."""
    ks = {s[-1] for n, s in expected_shapes(_config(BF16_DIR)).items() if len(s) == 2}
    assert all(k % 16 == 0 for k in ks), ks
    assert any(k % 64 and k % 32 for k in ks), ks


# ---------------------------------------------------------------------------------------------
# the NVFP4 export


def test_nvfp4_example_layout() -> None:
    bf16 = _headers(BF16_DIR)
    nvfp4 = _headers(NVFP4_DIR)
    expected: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (_, dtype, shape) in bf16.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and _is_nvfp4_linear(module):
            n, k = shape
            expected[f"{module}.weight_packed"] = ("U8", (n, k // 2))
            expected[f"{module}.weight_scale"] = ("F8_E4M3", (n, k // 16))
            expected[f"{module}.weight_global_scale"] = ("F32", (1,))
            expected[f"{module}.input_global_scale"] = ("F32", (1,))
        else:
            expected[name] = (dtype, shape)
    assert {n: (d, s) for n, (_, d, s) in nvfp4.items()} == expected
    assert sum(1 for n in expected if n.endswith(".weight_packed")) == 16


def test_nvfp4_example_keeps_unquantized_words() -> None:
    """Everything the exporter did not quantize (mtp.* included) is the BF16 example's bytes."""
    bf16 = _headers(BF16_DIR)
    for name, (shard, dtype, _) in _headers(NVFP4_DIR).items():
        if name not in bf16:
            continue
        with safe_open(NVFP4_DIR / shard, framework="pt") as a:
            left = a.get_tensor(name)
        with safe_open(BF16_DIR / bf16[name][0], framework="pt") as b:
            right = b.get_tensor(name)
        assert dtype == "BF16"
        assert torch.equal(left.view(torch.int16), right.view(torch.int16)), name


def test_nvfp4_example_config_and_scales() -> None:
    qc = _config(NVFP4_DIR)["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"  # type: ignore[index]
    assert qc["format"] == "nvfp4-pack-quantized"  # type: ignore[index]
    assert "re:^mtp.*" in qc["ignore"]  # type: ignore[index]
    for name, (shard, _, _) in _headers(NVFP4_DIR).items():
        if name.endswith(("global_scale",)):
            with safe_open(NVFP4_DIR / shard, framework="pt") as handle:
                value = handle.get_tensor(name)
            assert torch.isfinite(value).all() and (value > 0).all(), name
        if name.endswith(".weight_scale"):
            with safe_open(NVFP4_DIR / shard, framework="pt") as handle:
                words = handle.get_tensor(name).view(torch.uint8)
            # sign bit clear and not NaN (0x7f): valid NVFP4 block scales (spec Section 3.3)
            assert ((words & 0x80) == 0).all() and (words != 0x7F).all(), name


# ---------------------------------------------------------------------------------------------
# the shipped recipes


def _recipe_api():
    try:
        from ninfer_convert.recipe import build_plan, load_recipe
        from ninfer_convert.source import open_source
    except ImportError as exc:
        pytest.skip(f"ninfer_convert.recipe / ninfer_convert.source not available yet: {exc}")
    return load_recipe, build_plan, open_source


# The mixture of docs/targets/qwen3.6-27b.md, Section 3 (BF16 release) and Section 4 (NVFP4
# export): output-name pattern -> (format, role).  Every planned output must match exactly one.
_LAYER = r"model\.language_model\.layers\.\d+\."
MIXTURE_BF16 = {
    r"mtp\..*": ("BF16", "mtp"),
    r"model\.visual\..*": ("BF16", "vision"),
    r".*\.linear_attn\.in_proj_[ab]\.weight": ("BF16", "gdn-gate-proj"),
    r".*\.linear_attn\.conv1d\.weight": ("BF16", "gdn-conv"),
    r".*\.linear_attn\.(A_log|dt_bias)": ("BF16", "recurrent"),
    r"model\.language_model\.(norm|layers\.\d+\.(input_layernorm|post_attention_layernorm"
    r"|linear_attn\.norm|self_attn\.[qk]_norm))\.weight": ("BF16", "norm"),
    _LAYER + r"mlp\.(gate|up)_proj\.weight": ("Q4G64_F16S", "mlp-gate-up"),
    _LAYER + r"mlp\.down_proj\.weight": ("Q5G64_F16S", "mlp-down"),
    r".*\.linear_attn\.in_proj_(qkv|z)\.weight": ("Q6G64_F16S", "gdn-in-proj"),
    r".*\.linear_attn\.out_proj\.weight": ("W8G32_F16S", "gdn-out-proj"),
    _LAYER + r"self_attn\.[qkvo]_proj\.weight": ("W8G32_F16S", "attention-proj"),
    r"model\.language_model\.embed_tokens\.weight": ("W8G32_F16S", "token-embedding"),
    r"lm_head\.weight": ("W8G32_F16S", "output-head"),
}
_NVFP4_ROLES = ("mlp-gate-up", "mlp-down", "attention-proj")
MIXTURE_NVFP4 = {
    **{k: v for k, v in MIXTURE_BF16.items() if v[1] not in _NVFP4_ROLES},
    _LAYER + r"mlp\.(gate|up|down)_proj\.weight": ("NVFP4", "mlp"),
    _LAYER + r"self_attn\.[qkvo]_proj\.weight": ("NVFP4", "attention-proj"),
    r".*\.input_global_scale": ("FP32", "nvfp4-input-divisor"),
}


@pytest.mark.parametrize("path", [RECIPE_BF16, RECIPE_NVFP4], ids=["bf16", "nvfp4"])
def test_shipped_recipe_loads(path: Path) -> None:
    load_recipe, _, _ = _recipe_api()
    recipe = load_recipe(path)
    assert recipe.rules
    assert recipe.source.model_type == ("qwen3_5",)
    assert recipe.source.architectures == ("Qwen3_5ForConditionalGeneration",)
    # No count or shape identity checks: the tiny example must satisfy the identity.
    assert recipe.source.tensor_count is None and not recipe.source.shapes


@pytest.mark.parametrize(
    ("recipe_path", "source", "mixture"),
    [(RECIPE_BF16, BF16_DIR, MIXTURE_BF16), (RECIPE_NVFP4, NVFP4_DIR, MIXTURE_NVFP4)],
    ids=["bf16", "nvfp4"],
)
def test_shipped_recipe_plans_its_example(
    recipe_path: Path, source: Path, mixture: dict[str, tuple[str, str]]
) -> None:
    load_recipe, build_plan, open_source = _recipe_api()
    recipe = load_recipe(recipe_path)
    with open_source(source) as src:
        plan = build_plan(recipe, src)
    assert plan.identity_checked and not plan.identity_mismatches
    assert not plan.skipped
    claimed = [s.name for entry in plan.entries for s in entry.sources]
    assert sorted(claimed) == sorted(_headers(source)), "every tensor claimed exactly once"
    patterns = {re.compile(k): v for k, v in mixture.items()}
    for entry in plan.entries:
        hits = [v for p, v in patterns.items() if p.fullmatch(entry.output)]
        assert len(hits) == 1, f"{entry.output}: {hits}"
        assert (entry.format, entry.role) == hits[0], entry.output
        if entry.format.endswith("_F16S"):
            assert entry.encoder_profile == "MAXABS_F16_RECIP_RNE_V1"
            assert entry.evidence, entry.output
        if entry.format == "NVFP4":
            assert entry.copy == "compressed-tensors-nvfp4"
        assert entry.conversion is None, f"{entry.output}: source words are kept, never converted"


def test_bf16_recipe_refuses_a_qwen35_style_f32_source(tmp_path: Path) -> None:
    """Qwen3.5 stores A_log and linear_attn.norm as F32; the 3.6 recipe must not round them."""
    from safetensors.torch import load_file, save_file

    load_recipe, build_plan, open_source = _recipe_api()
    from ninfer_convert.recipe import RecipeProblems

    shutil.copytree(BF16_DIR, tmp_path / "q35")
    for shard in sorted((tmp_path / "q35").glob("*.safetensors")):
        tensors = load_file(shard)
        for name in tensors:
            if name.endswith(("linear_attn.A_log", "linear_attn.norm.weight")):
                tensors[name] = tensors[name].float()
        save_file(tensors, shard, metadata={"format": "pt"})
    with open_source(tmp_path / "q35") as src, pytest.raises(RecipeProblems) as info:
        build_plan(load_recipe(RECIPE_BF16), src)
    text = str(info.value)
    assert "A_log' is F32" in text and "linear_attn.norm.weight' is F32" in text


# ---------------------------------------------------------------------------------------------
# the README's main command, end to end


def _convert_api():
    try:
        from ninfer_convert.container import open_artifact
        from ninfer_convert.convert import convert_checkpoint
    except ImportError as exc:
        pytest.skip(f"ninfer_convert.convert / container not available yet: {exc}")
    return convert_checkpoint, open_artifact


def _source_tensor(directory: Path, name: str) -> torch.Tensor:
    shard = _index(directory)["weight_map"][name]  # type: ignore[index]
    with safe_open(directory / shard, framework="pt") as handle:
        return handle.get_tensor(name)


def test_bf16_example_converts_with_the_shipped_recipe(tmp_path: Path) -> None:
    convert_checkpoint, open_artifact = _convert_api()
    report = convert_checkpoint(BF16_DIR, RECIPE_BF16, tmp_path / "out", device="cpu", jobs=1)
    assert (tmp_path / "out" / "config.json").is_file()
    assert (tmp_path / "out" / "generation_config.json").is_file()
    art = open_artifact(tmp_path / "out")
    assert set(art.tensors) == set(_headers(BF16_DIR)) == {e.output for e in report.plan.entries}
    for name, info in art.tensors.items():
        source = _source_tensor(BF16_DIR, name).float()
        stored = torch.from_numpy(art.dequantize(name))
        if info.format == "BF16":
            assert torch.equal(stored, source), name
        else:
            # Grouped max-abs codes: every weight within half a step (scale / 2) of the source,
            # and the step is at most group max-abs / qmax.
            qmax = {"Q4G64_F16S": 7, "Q5G64_F16S": 15, "Q6G64_F16S": 31, "W8G32_F16S": 127}
            bound = source.abs().amax() / qmax[info.format] * 0.51
            assert (stored - source).abs().max() <= bound, name


@pytest.mark.interop
def test_nvfp4_example_converts_to_the_producers_own_dequantization(tmp_path: Path) -> None:
    """The copied NVFP4 words decode to what compressed-tensors itself decodes them to."""
    compressors = pytest.importorskip("compressed_tensors.compressors")
    schemes = pytest.importorskip("compressed_tensors.quantization.quant_scheme")
    convert_checkpoint, open_artifact = _convert_api()
    convert_checkpoint(NVFP4_DIR, RECIPE_NVFP4, tmp_path / "out", device="cpu", jobs=1)
    art = open_artifact(tmp_path / "out")
    scheme = schemes.preset_name_to_scheme("NVFP4", ["Linear"])
    nvfp4 = [n for n, info in art.tensors.items() if info.format == "NVFP4"]
    assert len(nvfp4) == 16
    for name in nvfp4:
        parts = {
            "weight_packed": _source_tensor(NVFP4_DIR, name + "_packed"),
            "weight_scale": _source_tensor(NVFP4_DIR, name + "_scale"),
            "weight_global_scale": _source_tensor(NVFP4_DIR, name + "_global_scale"),
        }
        reference = compressors.NVFP4PackedCompressor.decompress(parts, scheme)["weight"]
        ours = torch.from_numpy(art.dequantize(name))
        # compressed-tensors decodes into the unpacked dtype (BF16); compare at that precision.
        assert torch.equal(ours.to(reference.dtype), reference), name
    for name, info in art.tensors.items():
        if name.endswith(".input_global_scale"):
            assert info.format == "FP32" and info.role == "nvfp4-input-divisor"
            stored = torch.from_numpy(art.dequantize(name))
            assert torch.equal(stored, _source_tensor(NVFP4_DIR, name)), name
