"""NVFP4 and FP8-row copy paths: checked against compressed-tensors' own producer, and refusals.

The compressed-tensors checkpoints are made here by the library's own quantization lifecycle and
``ModelCompressor`` (nobody in this project wrote that producer); the copied words must equal the
source words exactly, and the values they represent must equal what the library itself decodes.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ninfer_convert.errors import EncodeError
from ninfer_convert.logical import FP8RowWords, NVFP4Words
from ninfer_convert.recipe import RecipeProblems, build_plan, loads_recipe, materialize
from ninfer_convert.recipe.plan import Plan, PlanEntry
from ninfer_convert.source import SourceArray, SourceCheckpoint, open_source
from ninfer_convert.words import e2m1_to_f32, e4m3fn_to_f32

HEAD = """\
ninfer_recipe: 1
name: t
version: "1"
source:
  model_type: llama
rules:
"""

NVFP4_RULES = """\
- match: 're:model\\.layers\\.\\d+\\..*_proj\\.weight'
  copy: compressed-tensors-nvfp4
  format: NVFP4
  role: linear
- match: 're:.*\\.input_global_scale'
  format: FP32
  role: nvfp4-input-divisor
- match: 're:.*norm\\.weight'
  format: FP32
  conversion: bf16-to-f32
  role: norm
- match: '*'
  format: BF16
  role: other
"""

FP8_RULES = """\
- match: 're:model\\.layers\\.\\d+\\..*_proj\\.weight'
  copy: compressed-tensors-fp8-channel
  format: FP8_E4M3FN_ROW_BF16S
  role: linear
- match: '*'
  format: BF16
  conversion: f32-to-bf16-rne
  role: other
  evidence: e1
"""
EVIDENCE = "evidence:\n  - id: e1\n    citation: c\n    summary: s\n"


def plan(body: str, src: SourceCheckpoint) -> Plan:
    return build_plan(
        loads_recipe(HEAD.replace("rules:\n", EVIDENCE + "rules:\n") + textwrap.dedent(body)), src
    )


def plan_problems(body: str, src: SourceCheckpoint) -> list[tuple[int | None, str]]:
    with pytest.raises(RecipeProblems) as info:
        plan(body, src)
    return [(p.line, p.message) for p in info.value.problems]


# ---------------------------------------------------------------------------------------------
# compressed-tensors producers


def _ct_checkpoint(root: Path, preset: str, fmt: str, dtype: torch.dtype) -> Path:
    pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = LlamaForCausalLM(cfg).to(dtype)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], format=fmt)
    )
    # Weight scales exactly as the library's min/max observer computes them.
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is None:
            continue
        args = module.quantization_scheme.weights
        w = module.weight.detach().float()
        with torch.no_grad():
            if preset == "NVFP4":
                gs = generate_gparam(w.amin(), w.amax())
                groups = w.reshape(w.shape[0], -1, args.group_size)
                scale, _ = calculate_qparams(
                    groups.amin(-1), groups.amax(-1), args, global_scale=gs
                )
                module.weight_global_scale.copy_(gs)
                module.input_global_scale.copy_(torch.tensor([448.0 * 6.0 / 3.0]))
            else:
                scale, _ = calculate_qparams(
                    w.amin(-1, keepdim=True), w.amax(-1, keepdim=True), args
                )
            module.weight_scale.copy_(scale)
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(root, max_shard_size="40KB")
    compressor.update_config(str(root))
    return root


@pytest.fixture(scope="module")
def ct_nvfp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ct_checkpoint(
        tmp_path_factory.mktemp("nvfp4"), "NVFP4", "nvfp4-pack-quantized", torch.bfloat16
    )


@pytest.mark.interop
def test_compressed_tensors_nvfp4_copy(ct_nvfp4: Path) -> None:
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8

    src = open_source(ct_nvfp4)
    cfg = src.config
    assert cfg is not None and cfg["quantization_config"]["format"] == "nvfp4-pack-quantized"
    p = plan(NVFP4_RULES, src)
    nv = [e for e in p.entries if e.format == "NVFP4"]
    assert len(nv) == 14  # 7 linears x 2 layers
    claimed = {s.name for e in p.entries for s in e.sources}
    assert claimed == set(src.tensors)  # every source tensor claimed exactly once
    for entry in nv:
        x = entry.output[: -len(".weight")]
        assert [(s.name, s.field) for s in entry.sources] == [
            (x + ".weight_packed", "packed-codes"),
            (x + ".weight_scale", "block-scales"),
            (x + ".weight_global_scale", "global-divisor"),
        ]
        assert entry.layout == "blockscale-k16-m128x4-v1" and entry.copy is not None
        m = materialize(entry, src)
        value = m.value
        assert isinstance(value, NVFP4Words)
        packed = src.read(x + ".weight_packed").words
        n, half = packed.shape
        assert entry.shape == (n, 2 * half) and value.codes.shape == (n, 2 * half)
        # codes, compared as words: the low nibble of each packed byte comes first, so
        # 0x8 (-0.0) and 0x0 (+0.0) stay different codes
        assert value.codes.dtype == np.uint8
        assert value.codes[:, 0::2].tobytes() == (np.asarray(packed) & 0x0F).tobytes()
        assert value.codes[:, 1::2].tobytes() == (np.asarray(packed) >> 4).tobytes()
        # the library's own unpacker gives the same E2M1 values, compared on their binary32
        # words (float equality would call -0.0 and +0.0 equal)
        theirs = unpack_fp4_from_uint8(
            torch.from_numpy(np.array(packed)), n, 2 * half, dtype=torch.float32
        ).numpy()
        assert (
            e2m1_to_f32(value.codes).view(np.uint32).tobytes() == theirs.view(np.uint32).tobytes()
        )
        assert (value.codes == 0x8).any() and (value.codes == 0x0).any()  # both zeros occur
        # block scales and divisor: the source words, untouched
        assert np.array_equal(value.scales, src.read(x + ".weight_scale").words)
        gs = src.read(x + ".weight_global_scale").words
        assert value.divisor == int(gs.reshape(-1)[0])
        # the represented weight is the library's dequantization (x_q * scale / global_scale)
        ours = (
            e2m1_to_f32(value.codes).reshape(n, -1, 16) * e4m3fn_to_f32(value.scales)[:, :, None]
        ).reshape(n, -1)
        ours = ours / np.array([value.divisor], dtype=np.uint32).view(np.float32)[0]
        scale = torch.from_numpy(e4m3fn_to_f32(value.scales)) / torch.from_numpy(
            np.array(gs).view(np.float32).copy()
        )
        ref = (torch.from_numpy(theirs).reshape(n, -1, 16) * scale[:, :, None]).reshape(n, -1)
        np.testing.assert_allclose(ours, ref.numpy(), rtol=2**-22, atol=0)
        assert set(m.source_digests) == {s.name for s in entry.sources}
    companion = p.entry("model.layers.0.mlp.down_proj.input_global_scale")
    assert (companion.format, companion.role, companion.copy) == (
        "FP32",
        "nvfp4-input-divisor",
        None,
    )


@pytest.fixture(scope="module")
def ct_fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _ct_checkpoint(
        tmp_path_factory.mktemp("fp8"), "FP8_DYNAMIC", "float-quantized", torch.bfloat16
    )


@pytest.mark.interop
def test_compressed_tensors_fp8_channel_copy(ct_fp8: Path) -> None:
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    src = open_source(ct_fp8)
    p = plan(FP8_RULES, src)
    fp8 = [e for e in p.entries if e.format == "FP8_E4M3FN_ROW_BF16S"]
    assert len(fp8) == 14
    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    for entry in fp8:
        x = entry.output
        m = materialize(entry, src)
        value = m.value
        assert isinstance(value, FP8RowWords)
        codes = src.read(x).words
        scales = src.read(x + "_scale").words
        assert src.tensors[x + "_scale"].dtype == "BF16"
        assert np.array_equal(value.codes, codes)
        assert np.array_equal(value.scales, scales.reshape(-1))
        # w_hat = binary32(c32 * s32), rounded once to BF16, is the library's own decompression
        w_hat = (
            e4m3fn_to_f32(value.codes)
            * (value.scales.astype(np.uint32) << 16).view(np.float32)[:, None]
        )
        state = {
            "weight": torch.from_numpy(np.array(codes)).view(torch.float8_e4m3fn),
            "weight_scale": torch.from_numpy(np.array(scales)).view(torch.bfloat16),
        }
        theirs = FloatQuantizationCompressor.decompress(state, scheme)["weight"]
        assert theirs.dtype == torch.bfloat16
        assert np.array_equal(
            torch.from_numpy(w_hat).to(torch.bfloat16).view(torch.uint16).numpy(),
            theirs.contiguous().view(torch.uint16).numpy(),
        )


@pytest.mark.interop
def test_compressed_tensors_fp8_from_f32_model_refuses_inexact_scales(tmp_path: Path) -> None:
    root = _ct_checkpoint(tmp_path / "fp8f32", "FP8_DYNAMIC", "float-quantized", torch.float32)
    src = open_source(root)
    entry = plan(FP8_RULES, src).entry("model.layers.0.mlp.down_proj.weight")
    assert entry.sources[1].dtype == "F32"
    with pytest.raises(EncodeError) as info:
        materialize(entry, src)
    msg = str(info.value)
    assert "model.layers.0.mlp.down_proj.weight_scale: the scale of row" in msg
    assert "not exactly representable as BF16 (nearest BF16:" in msg
    assert "the copy is refused" in msg


# ---------------------------------------------------------------------------------------------
# hand-built sources: every validity rule and refusal


def _src(root: Path, tensors: dict[str, torch.Tensor]) -> SourceCheckpoint:
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return open_source(root)


def _u8(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.uint8))


def _e4m3(values: np.ndarray) -> torch.Tensor:
    return _u8(values).view(torch.float8_e4m3fn)


def _f32w(word: int, shape: tuple[int, ...] = (1,)) -> torch.Tensor:
    return torch.from_numpy(np.full(shape, word, dtype=np.uint32)).view(torch.float32)


def _nvfp4(
    root: Path,
    *,
    scale_word: int = 0x38,
    global_word: int = 0x43E00000,
    k: int = 32,
    modelopt_multiplier: int | None = None,
) -> SourceCheckpoint:
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, size=(3, k // 2), dtype=np.uint8)
    scales = np.full((3, max(k // 16, 1)), 0x38, dtype=np.uint8)  # 1.0
    scales[2, -1] = scale_word
    if modelopt_multiplier is None:
        return _src(
            root,
            {
                "l.weight_packed": _u8(packed),
                "l.weight_scale": _e4m3(scales),
                "l.weight_global_scale": _f32w(global_word),
            },
        )
    return _src(
        root,
        {
            "l.weight": _u8(packed),
            "l.weight_scale": _e4m3(scales),
            "l.weight_scale_2": _f32w(modelopt_multiplier, ()),
            "l.input_scale": _f32w(0x3F800000, ()),
        },
    )


CT_NVFP4_RULE = """\
- match: l.weight
  copy: compressed-tensors-nvfp4
  format: NVFP4
  role: w
"""
MODELOPT_RULES = """\
- match: l.weight
  copy: modelopt-nvfp4
  format: NVFP4
  role: w
- match: l.input_scale
  format: FP32
  role: input-scale
"""


def test_nvfp4_nibble_order_and_words(tmp_path: Path) -> None:
    src = _nvfp4(tmp_path / "m")
    entry = plan(CT_NVFP4_RULE, src).entries[0]
    value = materialize(entry, src).value
    assert isinstance(value, NVFP4Words)
    packed = src.read("l.weight_packed").words
    assert value.codes[1, 0] == packed[1, 0] & 0xF and value.codes[1, 1] == packed[1, 0] >> 4
    assert value.codes[2, 31] == packed[2, 15] >> 4
    assert value.divisor == 0x43E00000  # 448.0, copied as the word
    assert entry.shape == (3, 32)


@pytest.mark.parametrize(
    ("scale_word", "needle"),
    [
        (0xB8, "word 0xb8 (negative)"),
        (0x80, "word 0x80 (negative zero)"),
        (0x7F, "word 0x7f (NaN)"),
        (0xFF, "word 0xff (NaN)"),
    ],
)
def test_nvfp4_invalid_block_scales_refused(tmp_path: Path, scale_word: int, needle: str) -> None:
    src = _nvfp4(tmp_path / "m", scale_word=scale_word)
    with pytest.raises(EncodeError) as info:
        materialize(plan(CT_NVFP4_RULE, src).entries[0], src)
    assert f"block scale at row 2, group 1 is E4M3FN {needle}" in str(info.value)


def test_nvfp4_zero_block_scale_allowed(tmp_path: Path) -> None:
    src = _nvfp4(tmp_path / "m", scale_word=0x00)
    value = materialize(plan(CT_NVFP4_RULE, src).entries[0], src).value
    assert isinstance(value, NVFP4Words) and value.scales[2, 1] == 0


@pytest.mark.parametrize("word", [0x00000000, 0x80000000, 0xBF800000, 0x7F800000, 0x7FC00000])
def test_nvfp4_invalid_divisor_refused(tmp_path: Path, word: int) -> None:
    src = _nvfp4(tmp_path / "m", global_word=word)
    with pytest.raises(EncodeError, match="d_w must be finite and strictly positive"):
        materialize(plan(CT_NVFP4_RULE, src).entries[0], src)


def test_nvfp4_shape_problems_found_at_plan_time(tmp_path: Path) -> None:
    src = _src(
        tmp_path / "m",
        {
            "a.weight_packed": _u8(np.zeros((2, 12))),
            "a.weight_scale": _e4m3(np.zeros((2, 1))),
            "a.weight_global_scale": _f32w(0x3F800000),
            "b.weight_packed": _u8(np.zeros((2, 16))),
            "b.weight_scale": _e4m3(np.zeros((2, 3))),
            "b.weight_global_scale": torch.ones(2),
            "c.weight_packed": _u8(np.zeros((2, 8))),
            "c.weight_scale": _e4m3(np.zeros((2, 1))),
        },
    )
    found = plan_problems(
        """\
        - match: '*.weight'
          copy: compressed-tensors-nvfp4
          format: NVFP4
          role: w
        """,
        src,
    )
    msgs = [m for _line, m in found]
    assert {line for line, _m in found} == {11}
    assert any(
        "'a.weight': a.weight_packed is U8 [2, 12] gives K = 24, which NVFP4 cannot take "
        "(K must be a multiple of 16)" in m
        for m in msgs
    )
    assert any(
        "'b.weight': b.weight_scale is F8_E4M3 [2, 3]; block scales must be F8_E4M3 [2, 2]" in m
        for m in msgs
    )
    assert any(
        "'b.weight': b.weight_global_scale is F32 [2]; the global scale must be one F32" in m
        for m in msgs
    )
    assert any(
        "'c.weight': the compressed-tensors-nvfp4 tensor 'c.weight_global_scale' is "
        "missing from the source" in m
        for m in msgs
    )
    assert len(found) == 4  # the incomplete unit's tensors are still owned: no unclaimed noise


def test_copy_rule_matching_nothing_explains_output_names(tmp_path: Path) -> None:
    src = _nvfp4(tmp_path / "m")
    found = plan_problems(
        """\
        - match: l.weight_packed
          copy: compressed-tensors-nvfp4
          format: NVFP4
          role: w
        - match: '*'
          format: FP32
          role: x
        """,
        src,
    )
    assert found[0][0] == 11
    assert (
        "matches no source tensor (the pattern matches output names such as X.weight" in found[0][1]
    )


def test_modelopt_exact_reciprocal_accepted(tmp_path: Path) -> None:
    src = _nvfp4(tmp_path / "m", modelopt_multiplier=0x3E000000)  # 0.125 -> d_w = 8.0
    p = plan(MODELOPT_RULES, src)
    entry = p.entry("l.weight")
    assert [s.field for s in entry.sources] == ["packed-codes", "block-scales", "global-multiplier"]
    value = materialize(entry, src).value
    assert isinstance(value, NVFP4Words) and value.divisor == 0x41000000
    assert p.entry("l.input_scale").role == "input-scale"
    # 2^126 -> 2^-126, the smallest normal; 2^127 -> 2^-127, a subnormal: both exact
    for word, want in ((0x7E800000, 0x00800000), (0x7F000000, 0x00400000)):
        src2 = _nvfp4(tmp_path / f"m{word:x}", modelopt_multiplier=word)
        v2 = materialize(plan(MODELOPT_RULES, src2).entry("l.weight"), src2).value
        assert isinstance(v2, NVFP4Words) and v2.divisor == want


@pytest.mark.parametrize(
    ("word", "needle"),
    [
        (0x3DCCCCCD, "not exactly representable in binary32"),  # 0.1: 1/0.1 is inexact
        (0x00000001, "not exactly representable in binary32"),  # 2^-149: 2^149 overflows
        (0x40400000, "not exactly representable in binary32"),  # 3.0
        (0x00000000, "must be finite and strictly positive"),
        (0xBE000000, "must be finite and strictly positive"),
        (0x7F800000, "must be finite and strictly positive"),
    ],
)
def test_modelopt_inexact_or_invalid_multiplier_refused(
    tmp_path: Path, word: int, needle: str
) -> None:
    src = _nvfp4(tmp_path / "m", modelopt_multiplier=word)
    with pytest.raises(EncodeError) as info:
        materialize(plan(MODELOPT_RULES, src).entry("l.weight"), src)
    assert needle in str(info.value) and "l.weight_scale_2" in str(info.value)


def _fp8(root: Path, scale: torch.Tensor, codes: np.ndarray | None = None) -> SourceCheckpoint:
    if codes is None:
        codes = np.tile(np.arange(0, 8, dtype=np.uint8), (scale.shape[0], 2))
    return _src(root, {"p.weight": _e4m3(codes), "p.weight_scale": scale})


FP8_RULE = """\
- match: p.weight
  copy: compressed-tensors-fp8-channel
  format: FP8_E4M3FN_ROW_BF16S
  role: w
"""


def _bf16_exact_f32(rows: int) -> torch.Tensor:
    return torch.tensor([[0.5], [1.5], [2.0**-130]][:rows], dtype=torch.float32)


def test_fp8_scale_dtypes(tmp_path: Path) -> None:
    for name, scale in {
        "f32": _bf16_exact_f32(3),
        "bf16": _bf16_exact_f32(3).to(torch.bfloat16),
        "f16": torch.tensor([[0.5], [1.5], [2.0**-20]], dtype=torch.float16),
    }.items():
        src = _fp8(tmp_path / name, scale)
        value = materialize(plan(FP8_RULE, src).entries[0], src).value
        assert isinstance(value, FP8RowWords)
        want = scale.float().to(torch.bfloat16).view(torch.uint16).numpy().reshape(-1)
        assert np.array_equal(value.scales, want), name
        assert value.codes.shape == (3, 16)


@pytest.mark.parametrize(
    ("scale", "needle"),
    [
        (
            torch.tensor([[0.5], [0.1]], dtype=torch.float32),
            "the scale of row 1 is 0.10000000149011612 (F32 word 0x3dcccccd), which is not exactly "
            "representable as BF16 (nearest BF16: 0.10009765625)",
        ),
        (torch.tensor([[0.5], [1.0 + 2.0**-9]], dtype=torch.float16), "not exactly representable"),
        (torch.tensor([[0.5], [-1.0]], dtype=torch.bfloat16), "BF16 word 0xbf80"),
        (torch.tensor([[-0.0], [1.0]], dtype=torch.bfloat16), "row 0 is BF16 word 0x8000"),
        (torch.tensor([[1.0], [float("inf")]], dtype=torch.bfloat16), "BF16 word 0x7f80"),
        (
            torch.tensor([[1.0], [float("nan")]], dtype=torch.float32),
            "must be non-negative and finite",
        ),
    ],
)
def test_fp8_scale_refusals(tmp_path: Path, scale: torch.Tensor, needle: str) -> None:
    src = _fp8(tmp_path / "m", scale)
    with pytest.raises(EncodeError) as info:
        materialize(plan(FP8_RULE, src).entries[0], src)
    assert needle in str(info.value)
    assert "tensor 'p.weight'" in str(info.value)


def test_fp8_code_rules(tmp_path: Path) -> None:
    codes = np.zeros((2, 4), dtype=np.uint8)
    codes[1, 3] = 0x7F
    src = _fp8(tmp_path / "nan", torch.ones(2, 1, dtype=torch.bfloat16), codes)
    with pytest.raises(EncodeError, match=r"code at row 1, column 3 is E4M3FN NaN \(0x7f\)"):
        materialize(plan(FP8_RULE, src).entries[0], src)

    codes = np.array([[0x00, 0x80, 0x00], [0x00, 0x01, 0x00]], dtype=np.uint8)
    src = _fp8(tmp_path / "zero", torch.tensor([[0.0], [0.0]], dtype=torch.bfloat16), codes)
    with pytest.raises(EncodeError, match=r"row 1 has scale \+0 but code 0x01 at column 1"):
        materialize(plan(FP8_RULE, src).entries[0], src)

    codes = np.array([[0x00, 0x80, 0x00], [0x40, 0x01, 0xC0]], dtype=np.uint8)
    src = _fp8(tmp_path / "ok", torch.tensor([[0.0], [2.0]], dtype=torch.bfloat16), codes)
    value = materialize(plan(FP8_RULE, src).entries[0], src).value
    assert isinstance(value, FP8RowWords) and value.scales.tolist() == [0x0000, 0x4000]


def test_fp8_shape_problems(tmp_path: Path) -> None:
    src = _src(
        tmp_path / "m",
        {
            "a.weight": _e4m3(np.zeros((2, 4))),
            "a.weight_scale": torch.ones(2),
            "b.weight": torch.ones(2, 4, dtype=torch.bfloat16),
            "b.weight_scale": torch.ones(2, 1),
            "c.weight": _e4m3(np.zeros((2, 4))),
            "c.weight_scale": torch.ones(2, 1, dtype=torch.int32),
        },
    )
    found = plan_problems(
        """\
        - match: '*.weight'
          copy: compressed-tensors-fp8-channel
          format: FP8_E4M3FN_ROW_BF16S
          role: w
        """,
        src,
    )
    msgs = sorted(m for _l, m in found)
    assert len(found) == 3
    assert "a.weight_scale is F32 [2]; channel scales must be F32, BF16 or F16 [2, 1]" in msgs[0]
    assert "b.weight is BF16 [2, 4]; FP8 codes must be F8_E4M3 [N, K]" in msgs[1]
    assert "c.weight_scale is I32 [2, 1]" in msgs[2]


def test_raw_words_survive_header_roundtrip(tmp_path: Path) -> None:
    # A hand-framed file (no torch) with an FP8 code plane and an exact F32 scale.
    header = {
        "q.weight": {"dtype": "F8_E4M3", "shape": [1, 2], "data_offsets": [0, 2]},
        "q.weight_scale": {"dtype": "F32", "shape": [1, 1], "data_offsets": [2, 6]},
    }
    text = json.dumps(header).encode()
    root = tmp_path / "m"
    root.mkdir()
    (root / "model.safetensors").write_bytes(
        struct.pack("<Q", len(text)) + text + bytes([0x38, 0xB8]) + struct.pack("<I", 0x40000000)
    )
    (root / "config.json").write_text('{"model_type": "llama"}')
    src = open_source(root)
    value = materialize(plan(FP8_RULE.replace("p.weight", "q.weight"), src).entries[0], src).value
    assert isinstance(value, FP8RowWords)
    assert value.codes.tolist() == [[0x38, 0xB8]] and value.scales.tolist() == [0x4000]


def _stream_planes(entry: object, src: SourceCheckpoint, block_bytes: int) -> list[bytes]:
    from ninfer_convert.recipe.materialize import stream_copy

    _digests, blocks = stream_copy(entry, src, block_bytes=block_bytes)  # type: ignore[arg-type]
    planes: dict[int, bytearray] = {}
    for i, data in blocks():
        planes.setdefault(i, bytearray()).extend(data.tobytes())
    return [bytes(planes[i]) for i in sorted(planes)]


@pytest.mark.parametrize("block_bytes", [1, 17, 1 << 20])
def test_copy_paths_stream_the_packed_planes(tmp_path: Path, block_bytes: int) -> None:
    """Streamed a row block at a time (blocks that do not divide the rows, one row), the copy
    paths give exactly the planes the layout packs from materialize's words."""
    from ninfer_convert.formats import lookup_format
    from ninfer_convert.layouts import lookup_layout

    nv = _nvfp4(tmp_path / "nv", k=64)
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 256, size=(7, 24), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x11
    codes[3] &= 0x80  # a +0-scale row holds only signed zeros
    scales = torch.tensor([[1.0], [2.0], [0.5], [0.0], [4.0], [8.0], [0.25]], dtype=torch.bfloat16)
    fp8 = _fp8(tmp_path / "fp8", scales, codes)
    for src, rule in ((nv, CT_NVFP4_RULE), (fp8, FP8_RULE)):
        entry = plan(rule, src).entries[0]
        fmt = lookup_format(entry.format)
        want = lookup_layout(fmt.layout).pack(fmt, materialize(entry, src).value)
        assert _stream_planes(entry, src, block_bytes) == [bytes(p) for p in want]


def test_streamed_fp8_copy_refuses_like_the_whole_tensor(tmp_path: Path) -> None:
    # A +0-scale row with a non-zero code in an early block and a NaN code in a later one:
    # the whole-tensor check reports the NaN first, and so does the stream.
    codes = np.zeros((4, 3), dtype=np.uint8)
    codes[0, 1] = 0x01
    codes[3, 2] = 0xFF
    scales = torch.tensor([[0.0], [1.0], [1.0], [1.0]], dtype=torch.bfloat16)
    src = _fp8(tmp_path / "m", scales, codes)
    entry = plan(FP8_RULE, src).entries[0]
    with pytest.raises(EncodeError) as whole:
        materialize(entry, src)
    with pytest.raises(EncodeError) as streamed:
        _stream_planes(entry, src, 3)
    assert "code at row 3, column 2 is E4M3FN NaN" in str(whole.value)
    assert str(streamed.value) == str(whole.value)


# ---------------------------------------------------------------------------------------------
# the registry, and one value rule shared with validate.py


def test_copy_paths_are_one_table_of_objects_named_in_the_docs() -> None:
    from ninfer_convert.formats import FORMATS
    from ninfer_convert.recipe import copy_paths, tables

    assert tables.COPY_PATHS is copy_paths.COPY_PATHS
    for name, path in copy_paths.COPY_PATHS.items():
        assert isinstance(path, copy_paths.CopyPath) and path.name == name
        assert path.format in FORMATS and path.description
    doc = (Path(__file__).parent.parent / "docs" / "recipes.md").read_text(encoding="utf-8")
    table = doc.split("| `copy` | format |", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    assert {c.strip().strip("`"): f.strip() for c, f in rows} == {
        n: p.format for n, p in copy_paths.COPY_PATHS.items()
    }


def _with_words(
    parts: dict[str, SourceArray], field: str, words: np.ndarray
) -> dict[str, SourceArray]:
    return {**parts, field: dataclasses.replace(parts[field], words=words)}


def _copy_parts(entry: PlanEntry, src: SourceCheckpoint) -> dict[str, SourceArray]:
    return {s.field: src.read(s.name) for s in entry.sources}


def test_nvfp4_block_scale_rule_is_validates_for_every_word(tmp_path: Path) -> None:
    from ninfer_convert.recipe.copy_paths import COPY_PATHS
    from ninfer_convert.validate import nvfp4_problems

    src = _nvfp4(tmp_path / "m")
    entry = plan(CT_NVFP4_RULE, src).entries[0]
    path, parts = COPY_PATHS[entry.copy or ""], _copy_parts(entry, src)
    codes = np.zeros((3, 32), dtype=np.uint8)
    refused: list[int] = []
    for word in range(256):
        scales = np.full((3, 2), 0x38, dtype=np.uint8)
        scales[2, 1] = word
        try:
            path.logical(entry, _with_words(parts, "block-scales", scales))
        except EncodeError as exc:
            assert f"group 1 is E4M3FN word 0x{word:02x}" in str(exc)
            refused.append(word)
        assert (word in refused) == bool(nvfp4_problems(codes, scales, 0x3F800000)), hex(word)
    assert len(refused) == 128 + 1  # every sign-set word, and the positive NaN 0x7f


DIVISOR_WORDS = [
    0x00000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x3E000000, 0x3F800000, 0x7F7FFFFF,
    0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x80000000, 0x80000001, 0xBF800000,
    0xFF800000, 0xFFFFFFFF,
]  # fmt: skip


def test_nvfp4_divisor_rule_is_validates_for_both_producers(tmp_path: Path) -> None:
    """The compressed-tensors divisor and the ModelOpt multiplier are held to the one rule of
    validate.py (finite, strictly positive binary32); the multiplier must also invert exactly."""
    from ninfer_convert.recipe.copy_paths import COPY_PATHS
    from ninfer_convert.validate import nvfp4_problems

    codes, scales = np.zeros((3, 32), dtype=np.uint8), np.full((3, 2), 0x38, dtype=np.uint8)
    for rules, src in (
        (CT_NVFP4_RULE, _nvfp4(tmp_path / "ct")),
        (MODELOPT_RULES, _nvfp4(tmp_path / "mo", modelopt_multiplier=0x3E000000)),
    ):
        entry = plan(rules, src).entry("l.weight")
        path, parts = COPY_PATHS[entry.copy or ""], _copy_parts(entry, src)
        field = entry.sources[2].field
        for word in DIVISOR_WORDS:
            valid = not nvfp4_problems(codes, scales, word)
            g = np.full(parts[field].words.shape, word, dtype=np.uint32)
            try:
                value = path.logical(entry, _with_words(parts, field, g))
            except EncodeError as exc:
                assert ("finite and strictly positive" in str(exc)) == (not valid), hex(word)
                assert valid == ("not exactly representable" in str(exc)), hex(word)
                continue
            assert valid, hex(word)
            assert isinstance(value, NVFP4Words)
            assert not nvfp4_problems(value.codes, value.scales, value.divisor)


def test_fp8_code_and_scale_rules_are_validates_for_every_word(tmp_path: Path) -> None:
    from ninfer_convert.recipe.copy_paths import COPY_PATHS
    from ninfer_convert.validate import fp8_row_problems

    src = _fp8(tmp_path / "m", torch.ones(2, 1, dtype=torch.bfloat16))
    entry = plan(FP8_RULE, src).entries[0]
    path, parts = COPY_PATHS[entry.copy or ""], _copy_parts(entry, src)
    for scale in (0x3F80, 0x0000):  # every code word, in a row of scale 1.0 and of scale +0
        for word in range(256):
            codes = np.zeros((2, 16), dtype=np.uint8)
            codes[1, 5] = word
            scales = np.array([[0x3F80], [scale]], dtype=np.uint16)
            try:
                path.logical(
                    entry, _with_words(_with_words(parts, "codes", codes), "row-scales", scales)
                )
                ok = True
            except EncodeError as exc:
                assert f"0x{word:02x} at column 5" in str(exc) or "column 5 is E4M3FN NaN" in str(
                    exc
                )
                ok = False
            assert ok == (not fp8_row_problems(codes, scales.reshape(2))), (scale, word)
    codes = np.zeros((2, 16), dtype=np.uint8)
    zeros = _with_words(parts, "codes", codes)
    refused = 0
    for word in range(1 << 16):  # every BF16 row-scale word
        scales = np.array([[0x3F80], [word]], dtype=np.uint16)
        try:
            path.logical(entry, _with_words(zeros, "row-scales", scales))
            ok = True
        except EncodeError as exc:
            assert f"the scale of row 1 is BF16 word 0x{word:04x}" in str(exc)
            ok, refused = False, refused + 1
        assert ok == (not fp8_row_problems(codes, scales.reshape(2))), hex(word)
    assert refused == (1 << 15) + (1 << 7)  # every sign-set word; +inf and the positive NaNs
