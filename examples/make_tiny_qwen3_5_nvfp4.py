"""Build ``examples/tiny-qwen3.5-nvfp4/``: a compressed-tensors NVFP4 export of the tiny example.

Contract: the output is what llm-compressor's own Qwen3.5/Qwen3.6 NVFP4 example
(``examples/quantization_w4a4_fp4/qwen3_6_example.py``) produces, made here without
llm-compressor (not a dependency) but with the same producer pieces it uses:

* the ``NVFP4`` preset scheme of compressed-tensors on every ``Linear``, with the example's ignore
  list (``lm_head``, the vision tower, ``embed_tokens``, MoE gates, all of ``linear_attn``) -- so
  only ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj`` are quantized;
* weight scales from compressed-tensors' ``generate_gparam``/``calculate_qparams`` over each
  weight's own min/max (llm-compressor's default ``minmax`` weight observer does the same
  computation), activation global scales from the max-abs input seen over one seeded batch of
  random token ids (a stand-in for its calibration set);
* ``ModelCompressor.compress_model`` (``nvfp4-pack-quantized``: ``weight_packed`` U8 [N, K/2],
  ``weight_scale`` F8_E4M3 [N, K/16], ``weight_global_scale`` F32 [1], ``input_global_scale``
  F32 [1]), transformers ``save_pretrained`` with sharding, ``ModelCompressor.update_config``;
* ``compressed_tensors.utils.save_mtp_tensors_to_checkpoint`` to copy the BF16 ``mtp.*`` tensors
  from the source checkpoint into their own shard (``model_mtp.safetensors``, written by
  ``safetensors.torch.save_file`` without a ``format`` metadata entry) and add them to the index
  and to the quantization ignore list -- exactly as the llm-compressor example finishes.

Run from the repository root after ``make_tiny_qwen3_5.py`` (needs transformers >= 5, torch and
compressed-tensors)::

    python examples/make_tiny_qwen3_5_nvfp4.py
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

SEED = 20260422
MAX_SHARD_SIZE = "200KB"
CALIBRATION_TOKENS = 64

# llm-compressor examples/quantization_w4a4_fp4/qwen3_6_example.py, verbatim.
IGNORE = [
    "re:.*lm_head",
    "re:visual.*",
    "re:model.visual.*",
    "re:.*mlp.gate$",
    "re:.*embed_tokens$",
    "re:.*shared_expert_gate$",
    "re:.*linear_attn.*",
]


def _calibrate(model: torch.nn.Module, vocab_size: int) -> None:
    """Set every quantized Linear's NVFP4 weight and activation scales."""
    from compressed_tensors.quantization import QuantizationStatus
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    quantized = {
        name: module
        for name, module in model.named_modules()
        if getattr(module, "quantization_scheme", None) is not None
    }
    input_amax: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            amax = args[0].detach().abs().amax().float()
            input_amax[name] = torch.maximum(input_amax.get(name, amax), amax)

        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in quantized.items()]
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab_size, (1, CALIBRATION_TOKENS), generator=gen)
    # Calibrate on the unquantized forward: quantization is only applied once the status says so.
    with torch.no_grad():
        model(input_ids=ids)
    for h in handles:
        h.remove()

    for name, module in quantized.items():
        args = module.quantization_scheme.weights
        weight = module.weight.detach().float()
        rows, cols = weight.shape
        with torch.no_grad():
            global_scale = generate_gparam(weight.amin(), weight.amax())
            groups = weight.reshape(rows, cols // args.group_size, args.group_size)
            scale, _zero = calculate_qparams(
                groups.amin(-1), groups.amax(-1), args, global_scale=global_scale
            )
            module.weight_global_scale.copy_(global_scale)
            module.weight_scale.copy_(scale)
            amax = input_amax[name]
            module.input_global_scale.copy_(generate_gparam(-amax, amax))
        module.quantization_status = QuantizationStatus.FROZEN


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=here / "tiny-qwen3.5")
    parser.add_argument("--out", type=Path, default=here / "tiny-qwen3.5-nvfp4")
    args = parser.parse_args()

    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    from compressed_tensors.utils import save_mtp_tensors_to_checkpoint
    from transformers import Qwen3_5ForConditionalGeneration

    model = Qwen3_5ForConditionalGeneration.from_pretrained(args.source, dtype=torch.bfloat16)
    model.eval()
    config = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme("NVFP4", ["Linear"])},
        ignore=IGNORE,
        format="nvfp4-pack-quantized",
    )
    apply_quantization_config(model, config)
    _calibrate(model, model.config.text_config.vocab_size)

    compressor = ModelCompressor.from_pretrained_model(
        model, quantization_format="nvfp4-pack-quantized"
    )
    compressor.compress_model(model)

    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)
    compressor.update_config(str(out))
    save_mtp_tensors_to_checkpoint(source_model=str(args.source), dest_dir=str(out))

    files = sorted(p.name for p in out.iterdir())
    total = sum((out / name).stat().st_size for name in files)
    print(f"wrote {len(files)} files, {total} bytes, to {out}")
    for name in files:
        print(f"  {name}")


if __name__ == "__main__":
    main()
