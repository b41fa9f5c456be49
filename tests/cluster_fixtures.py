"""Checkpoints and helpers shared by the cluster tests (tests/test_cluster*.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from st_helpers import write_safetensors

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-qwen3.5"
EXAMPLE_NVFP4 = ROOT / "examples" / "tiny-qwen3.5-nvfp4"
QWEN_RECIPE = ROOT / "recipes" / "qwen3.6-27b.yaml"
GENERIC_RECIPE = ROOT / "recipes" / "generic-dense.yaml"


def files_of(out: Path) -> dict[str, bytes]:
    """Every file of a model directory (relative name -> bytes)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def dense_checkpoint(root: Path, *, layers: int = 4, poison: bool = False) -> Path:
    """A Llama-named BF16 checkpoint in two safetensors files with an index, big enough for
    several output shards; ``poison`` puts a NaN in a tensor of the last layer."""
    rng = np.random.default_rng(7)
    root.mkdir()
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer.json").write_text("{}")

    def bf16(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16)

    parts: list[dict[str, np.ndarray]] = [{}, {}]
    parts[0]["model.embed_tokens.weight"] = bf16((96, 128))
    parts[1]["model.norm.weight"] = bf16((128,))
    parts[1]["lm_head.weight"] = bf16((96, 128))
    for i in range(layers):
        part = parts[0] if i < layers // 2 else parts[1]
        p = f"model.layers.{i}."
        for proj, shape in (("q_proj", (128, 128)), ("k_proj", (64, 128)),
                            ("v_proj", (64, 128)), ("o_proj", (128, 128))):  # fmt: skip
            part[p + f"self_attn.{proj}.weight"] = bf16(shape)
        for proj, shape in (("gate_proj", (256, 128)), ("up_proj", (256, 128)),
                            ("down_proj", (128, 256))):  # fmt: skip
            part[p + f"mlp.{proj}.weight"] = bf16(shape)
        part[p + "input_layernorm.weight"] = bf16((128,))
        part[p + "post_attention_layernorm.weight"] = bf16((128,))
    if poison:
        parts[1][f"model.layers.{layers - 1}.mlp.up_proj.weight"][200, 77] = 0x7FC0  # BF16 NaN
    weight_map = {}
    for n, part in enumerate(parts, start=1):
        name = f"model-{n:05d}-of-{len(parts):05d}.safetensors"
        write_safetensors(root / name, {k: ("BF16", v) for k, v in part.items()})
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root
