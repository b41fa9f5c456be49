"""Build the tiny Qwen3.5/Qwen3.6-shaped checkpoint committed under ``examples/tiny-qwen3.5/``.

Contract: the output is a Hugging Face model directory written by transformers' own
``Qwen3_5ForConditionalGeneration.save_pretrained`` with sharding (several
``model-XXXXX-of-YYYYY.safetensors`` files plus ``model.safetensors.index.json``), a
``config.json`` and a ``generation_config.json``.  Every tensor name follows the real
``Qwen/Qwen3.6-27B`` checkpoint (see ``docs/targets/qwen3.6-27b.md``):

* ``model.language_model.*``: 4 decoder layers in the real 3 linear-attention : 1 full-attention
  pattern (``layer_types`` = linear, linear, linear, full), Gated DeltaNet
  ``linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,conv1d,A_log,dt_bias,norm,out_proj}``,
  gated full attention ``self_attn.{q_proj,k_proj,v_proj,o_proj,q_norm,k_norm}``, SwiGLU
  ``mlp.{gate,up,down}_proj``, two RMSNorms per layer, final ``norm``, ``embed_tokens``;
* ``lm_head.weight``, untied from the embeddings as in the real checkpoint;
* ``model.visual.*``: a 2-block vision tower with the real tensor set (patch_embed Conv3d,
  pos_embed, blocks, merger);
* ``mtp.*``: the 15 real multi-token-prediction tensor names.  transformers does not model the
  MTP head (``Qwen3_5PreTrainedModel`` ignores ``^mtp.*`` on load and never creates it), so this
  script builds it from transformers' own building blocks -- one ``Qwen3_5DecoderLayer`` of the
  full-attention kind, three ``Qwen3_5RMSNorm`` and an ``nn.Linear(2H, H)`` -- and attaches it as
  ``model.mtp`` before ``save_pretrained``, which then writes it under the real names.

Dimensions are chosen for the converter's tests, not for a usable model: hidden size 80 and
intermediate size 144 are multiples of 16 (NVFP4's K group) but not of 64 or 32, so the grouped
formats see partial final groups (80 = 64 + 16, 144 = 2 * 64 + 16); other K values (64, 128, 160,
32, 48) are full groups.  Values are drawn from one seeded ``torch.Generator`` in sorted-name order,
independent of transformers' initialisers, and stored as BF16 like the real Qwen3.6 checkpoint
(whose ``A_log`` and ``linear_attn.norm`` are BF16; Qwen3.5 stored them as F32).

Run from the repository root (needs transformers >= 5 and torch)::

    python examples/make_tiny_qwen3_5.py            # rewrites examples/tiny-qwen3.5/
    python examples/make_tiny_qwen3_5.py --out DIR  # writes elsewhere
"""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path

import torch
from torch import nn

SEED = 20260422
"""Seed of the one generator every value is drawn from."""

MAX_SHARD_SIZE = "300KB"
"""Small enough that the ~0.8 MB of weights land in three shards plus an index."""

TEXT_CONFIG = {
    "vocab_size": 512,
    "hidden_size": 80,
    "intermediate_size": 144,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "attn_output_gate": True,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        # rotary dim = 32 * 0.25 = 8, so the three mRoPE sections cover 8 / 2 = 4 frequencies.
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
    # Not used by transformers' modelling code; present in the real config.json and read by
    # vLLM/SGLang to build the MTP drafter.
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "tie_word_embeddings": False,
    "eos_token_id": 511,
}

VISION_CONFIG = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 80,  # must equal the text hidden size, as 5120 does in the real model
    "num_position_embeddings": 16,  # a square number: a 4 x 4 learned position grid
    "deepstack_visual_indexes": [],
}

TOP_CONFIG = {
    "tie_word_embeddings": False,
    "image_token_id": 500,
    "video_token_id": 501,
    "vision_start_token_id": 502,
    "vision_end_token_id": 503,
}


class TinyMtp(nn.Module):
    """The real checkpoint's ``mtp.*`` module tree, built from transformers' Qwen3.5 blocks.

    Names (vLLM ``qwen3_5_mtp.py`` and the published 15-tensor manifest): ``fc`` [H, 2H],
    ``layers.0`` (a full-attention decoder layer), ``norm``, ``pre_fc_norm_hidden``,
    ``pre_fc_norm_embedding``.
    """

    def __init__(self, text_config: object) -> None:
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
        )

        super().__init__()
        hidden = text_config.hidden_size  # type: ignore[attr-defined]
        eps = text_config.rms_norm_eps  # type: ignore[attr-defined]
        full_index = text_config.layer_types.index("full_attention")  # type: ignore[attr-defined]
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(text_config, layer_idx=full_index)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)


def _fill(name: str, param: torch.Tensor, gen: torch.Generator) -> None:
    """Overwrite one parameter with seeded values of a realistic kind for its role."""
    shape = tuple(param.shape)
    if name.endswith("linear_attn.A_log"):
        # A = exp(A_log) in (1, 16), as Qwen3_5GatedDeltaNet initialises it.
        values = torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log_()
    elif name.endswith("linear_attn.dt_bias"):
        values = torch.empty(shape).uniform_(0.5, 1.5, generator=gen)
    elif name.endswith(".bias") or param.dim() == 1:
        # Biases, LayerNorm and RMSNorm weights (Qwen3.5 RMSNorms store w for a (1 + w) scale).
        values = torch.randn(shape, generator=gen) * 0.1
    else:
        fan_in = math.prod(shape[1:])
        values = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
    with torch.no_grad():
        param.copy_(values.to(param.dtype))


def build_model() -> nn.Module:
    """The tiny model with its MTP head attached and seeded BF16 values."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    config = Qwen3_5Config(text_config=TEXT_CONFIG, vision_config=VISION_CONFIG, **TOP_CONFIG)
    torch.manual_seed(SEED)  # the initialisers' draws are overwritten below; this pins them anyway
    model = Qwen3_5ForConditionalGeneration(config)
    model.mtp = TinyMtp(config.text_config)
    gen = torch.Generator().manual_seed(SEED)
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        _fill(name, param, gen)
    return model.to(torch.bfloat16).eval()


def main() -> None:
    default_out = Path(__file__).resolve().parent / "tiny-qwen3.5"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out, help="output directory")
    args = parser.parse_args()

    model = build_model()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)

    files = sorted(p.name for p in out.iterdir())
    total = sum((out / name).stat().st_size for name in files)
    print(f"wrote {len(files)} files, {total} bytes, to {out}")
    for name in files:
        print(f"  {name}")


if __name__ == "__main__":
    main()
