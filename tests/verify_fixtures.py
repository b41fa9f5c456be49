"""Shared helpers for the verify / inspect tests: a checkpoint with every format, artifact
copies, byte patches that keep every digest valid, and rewriting an artifact with bad words.

How the corruption tests keep digests valid (so that only the later checks can catch them):

* Value invariants: :func:`rewrite_artifact` copies an artifact tensor by tensor through
  :meth:`ArtifactWriter.add`, substituting chosen logical tensors.  ``add`` packs with the
  registered layout and never validates values (only the encoder/``derive_logical`` path does),
  so it is the lowest-level writer path that stores any bit pattern the layout can hold (a W8
  ``-128``, a ``-0`` scale) with correct digests.
* Byte-level edits (padding, swapped payloads): :func:`patch_bytes` edits the container file and
  then recomputes every plane digest, the header digest and, for a sharded artifact, the index's
  shard digest and size -- exactly what a consistent but wrong producer would write.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from artifact_fixtures import rewrite_header
from st_helpers import write_safetensors

from ninfer_convert.container import ArtifactWriter, open_artifact
from ninfer_convert.container.wire import INDEX_NAME, PRELUDE, PRELUDE_SIZE, canonical_json
from ninfer_convert.encoder.corpus import RECIP_VS_DIV_CASES
from ninfer_convert.formats import lookup_format
from ninfer_convert.logical import GroupedCodes, LogicalTensor
from ninfer_convert.words import f16_to_f32_words

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny-qwen3.5"
EXAMPLE_NVFP4 = ROOT / "examples" / "tiny-qwen3.5-nvfp4"
RECIPE = ROOT / "recipes" / "qwen3.6-27b.yaml"
RECIPE_NVFP4 = ROOT / "recipes" / "qwen3.6-27b-nvfp4.yaml"

ALL_FORMATS_RECIPE = """\
ninfer_recipe: 1
name: every-format-test
version: "1"
description: one tensor (at least) of each of the nine formats, plus derived tensors
source:
  tensor_count: 21
evidence:
  - id: test
    citation: test fixture
    summary: not a quality claim
rules:
  - match: emb.weight
    format: Q6G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: embedding
    evidence: test
  - derive: 'attn.{p}.weight'
    inputs: ['attn.q{p}.weight', 'attn.k{p}.weight']
    concat_axis: 0
    format: Q4G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: attention-qk
    evidence: test
  - match: mlp.up.weight
    format: Q5G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: mlp-up
    evidence: test
  - derive: 'mlp.down_t.{w}'
    inputs: ['mlp.down.{w}']
    transforms: [transpose]
    format: W8G32_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: mlp-down
    evidence: test
  - match: 're:(w8|pair\\.[ab])\\.weight'
    format: W8G32_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: misc
    evidence: test
  - match: div.weight
    format: Q4G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: boundary
    evidence: test
  - match: nv.weight
    copy: compressed-tensors-nvfp4
    format: NVFP4
    role: mlp
    evidence: test
  - match: f8.weight
    copy: compressed-tensors-fp8-channel
    format: FP8_E4M3FN_ROW_BF16S
    role: mlp
    evidence: test
  - match: norm.weight
    format: FP32
    conversion: bf16-to-f32
    role: norm
  - match: 're:(f32\\.weight|nv\\.input_global_scale)'
    format: FP32
    role: misc
  - match: bias
    format: BF16
    role: bias
  - match: 're:ids|idx32'
    format: I32
    conversion: int-to-i32
    role: index
  - skip: rope.inv_freq
    reason: recomputed at load time
"""


def _bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def _division_rows() -> np.ndarray:
    """Q4 groups [s * 7, x, -x, 0...] on which direct division picks another code than the
    normative reciprocal-multiply (spec Section 7, RECIP_VS_DIV_CASES)."""
    rows = []
    for qmax, s_word, x_word in RECIP_VS_DIV_CASES:
        if qmax != 7:
            continue
        s = float(np.array([s_word], dtype=np.uint16).view(np.float16)[0])
        x = float(np.array([x_word], dtype=np.uint32).view(np.float32)[0])
        row = np.zeros(64, dtype=np.float32)
        row[:3] = [s * 7, x, -x]
        rows.append(row)
    return np.stack(rows)


def write_all_formats_source(root: Path, *, seed: int = 7) -> tuple[Path, Path]:
    """A 21-tensor safetensors checkpoint and a recipe that store all nine formats (derived
    concat and transpose tensors included).  Returns (source dir, recipe path)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "test"}))
    e2m1 = rng.integers(0, 256, (4, 16), dtype=np.uint8)
    fp8 = rng.integers(0, 0x7F, (3, 20), dtype=np.uint8)  # finite positive codes
    fp8[0, :5] |= 0x80  # and some negative ones
    tensors: dict[str, tuple[str, np.ndarray]] = {
        "emb.weight": ("BF16", _bf16(rng, (40, 96))),
        "attn.qx.weight": ("BF16", _bf16(rng, (16, 70))),
        "attn.kx.weight": ("BF16", _bf16(rng, (8, 70))),
        "mlp.up.weight": ("F32", rng.standard_normal((12, 100)).astype(np.float32)),
        "mlp.down.weight": ("BF16", _bf16(rng, (100, 24))),
        "w8.weight": ("F16", rng.standard_normal((6, 33)).astype(np.float16)),
        "pair.a.weight": ("BF16", _bf16(rng, (4, 64))),
        "pair.b.weight": ("BF16", _bf16(rng, (4, 64))),
        "div.weight": ("F32", _division_rows()),
        "norm.weight": ("BF16", _bf16(rng, (96,))),
        "bias": ("BF16", _bf16(rng, (5, 3))),
        "ids": ("I64", np.array([0, 1, -5, 2**31 - 1, -(2**31), 7, 3], dtype=np.int64)),
        "idx32": ("I32", np.array([4, -1, 0, 9], dtype=np.int32)),
        "f32.weight": ("F32", rng.standard_normal(10).astype(np.float32)),
        "nv.weight_packed": ("U8", e2m1),
        "nv.weight_scale": ("F8_E4M3", rng.integers(0, 0x7F, (4, 2), dtype=np.uint8)),
        "nv.weight_global_scale": ("F32", np.array([448.0 * 6.0], dtype=np.float32)),
        "nv.input_global_scale": ("F32", np.array([12.5], dtype=np.float32)),
        "f8.weight": ("F8_E4M3", fp8),
        "f8.weight_scale": ("BF16", _bf16(rng, (3, 1)) & np.uint16(0x7FFF)),
        "rope.inv_freq": ("F32", rng.random(8).astype(np.float32)),  # skipped by the recipe
    }
    write_safetensors(root / "model.safetensors", tensors)
    recipe = root.parent / f"{root.name}-recipe.yaml"
    recipe.write_text(ALL_FORMATS_RECIPE)
    return root, recipe


def copy_artifact(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def container_files(art_dir: Path) -> list[Path]:
    return sorted(p for p in art_dir.iterdir() if p.suffix == ".ninfer")


def flip_byte(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def plane_offset(art_dir: Path, tensor: str, plane: str) -> tuple[Path, int, int]:
    """(container file, absolute offset, size) of one plane."""
    with open_artifact(art_dir) as art:
        info = art.tensors[tensor]
        for p in info.planes:
            if p.name == plane:
                return info.file, p.offset, p.nbytes
    raise KeyError(plane)


def patch_bytes(art_dir: Path, edit: Callable[[Path, bytearray], None]) -> None:
    """Apply ``edit(file, payload)`` to each container's bytes, then recompute every plane
    digest, each header digest and the index (shard digests and sizes)."""
    for path in container_files(art_dir):
        data = bytearray(path.read_bytes())
        h_off = PRELUDE.unpack(bytes(data[:PRELUDE_SIZE]))[4]
        edit(path, data)
        path.write_bytes(bytes(data))

        def redigest(header: dict[str, Any], data: bytes = bytes(data)) -> None:
            for t in header["tensors"]:
                for p in t["planes"]:
                    p["digest"] = xxhash.xxh3_128_hexdigest(
                        data[p["offset"] : p["offset"] + p["nbytes"]]
                    )

        assert h_off <= len(data)
        rewrite_header(path, redigest)
    index = art_dir / INDEX_NAME
    if index.exists():
        doc = json.loads(index.read_bytes())
        for shard in doc["shards"]:
            raw = (art_dir / shard["file"]).read_bytes()
            shard["size"] = len(raw)
            shard["digest"] = raw[32:48].hex()
        index.write_bytes(canonical_json(doc))


def rewrite_artifact(
    src: Path, dst: Path, replace: Mapping[str, LogicalTensor] | None = None
) -> Path:
    """Copy ``src`` to ``dst`` tensor by tensor with ``ArtifactWriter.add`` (which never checks
    values), substituting the logical tensors in ``replace``; every digest is valid."""
    replace = replace or {}
    with open_artifact(src) as art:
        meta = art.meta
        with ArtifactWriter(dst, metadata=meta, alignment=meta.alignment) as w:
            for name, info in art.tensors.items():
                logical = replace.get(name)
                if logical is None:
                    logical = art.read(name)
                w.add(name, info.format, logical, role=info.role,
                      provenance=info.entry.provenance)  # fmt: skip
            for side in art.side_files:
                w.add_file(art.directory / side, side)
    return dst


def encode_by_division(values: np.ndarray, fmt_name: str) -> GroupedCodes:
    """The WRONG encoder: Section 7's scale, but codes = clamp(rint(x / scale32)) by direct
    division instead of reciprocal-multiply (binary32 throughout)."""
    fmt = lookup_format(fmt_name)
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = values.shape
    groups = -(-k // g)
    codes = np.zeros((n, k), dtype=np.int8)
    scales = np.zeros((n, groups), dtype=np.uint16)
    for r in range(n):
        for j in range(groups):
            x = values[r, j * g : (j + 1) * g].astype(np.float32)
            amax = np.float32(np.max(np.abs(x)))
            if amax == 0:
                continue
            s16 = np.float16(np.float32(amax / np.float32(fmt.qmax)))
            word = int(np.array([s16]).view(np.uint16)[0]) or 1
            scales[r, j] = word
            s32 = f16_to_f32_words(np.array([word], dtype=np.uint16)).view(np.float32)[0]
            q = np.rint(np.divide(x, s32, dtype=np.float32))
            codes[r, j * g : (j + 1) * g] = np.clip(q, fmt.qmin, fmt.qmax).astype(np.int8)
    return GroupedCodes(codes, scales)


CT_FP8_RECIPE = """\
ninfer_recipe: 1
name: llama-fp8-channel
version: "1"
source:
  model_type: llama
evidence:
  - id: test
    citation: test fixture
    summary: not a quality claim
rules:
  - match: 're:model\\.layers\\.\\d+\\..*_proj\\.weight'
    copy: compressed-tensors-fp8-channel
    format: FP8_E4M3FN_ROW_BF16S
    role: linear
    evidence: test
  - match: 're:.*norm\\.weight'
    format: FP32
    conversion: bf16-to-f32
    role: norm
  - match: '*'
    format: W8G32_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: other
    evidence: test
"""


def write_ct_fp8_source(root: Path) -> tuple[Path, Path]:
    """A tiny transformers Llama quantized by compressed-tensors' own FP8_DYNAMIC lifecycle
    (channel-wise E4M3FN weights with BF16 [N, 1] multipliers, ``float-quantized``), saved with
    ``save_pretrained`` in shards.  Returns (source dir, recipe path)."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    apply_quantization_config(
        model,
        QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"],
                           format="float-quantized"),
    )  # fmt: skip
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        w = module.weight.detach().float()
        with torch.no_grad():
            scale, _ = calculate_qparams(
                w.amin(-1, keepdim=True), w.amax(-1, keepdim=True),
                module.quantization_scheme.weights,
            )  # fmt: skip
            module.weight_scale.copy_(scale)
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(root, max_shard_size="40KB")
    compressor.update_config(str(root))
    recipe = root.parent / f"{root.name}-recipe.yaml"
    recipe.write_text(CT_FP8_RECIPE)
    return root, recipe
