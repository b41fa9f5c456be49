"""The torch loader: spec reconstruction bit for bit, inverted derivations, lazy decoding.

Every value is compared as words against an independent reconstruction written here (numpy's
own binary16 conversion, ml_dtypes' E4M3FN decoder, a literal E2M1 table), never with
``allclose``; derived tensors are compared against the source checkpoint's own slices."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from artifact_fixtures import ALL_FORMATS, META, make_logical, provenance, write_small
from safetensors import safe_open

import ninfer_convert.loader as loader_mod
from ninfer_convert import load_state_dict
from ninfer_convert.container import ArtifactWriter, open_artifact
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import ArtifactError, UsageError
from ninfer_convert.formats import lookup_format
from ninfer_convert.logical import DirectWords, FP8RowWords, GroupedCodes, NVFP4Words
from ninfer_convert.words import f32_to_bf16_rne

ROOT = Path(__file__).resolve().parent.parent
BF16_DIR = ROOT / "examples" / "tiny-qwen3.5"
NVFP4_DIR = ROOT / "examples" / "tiny-qwen3.5-nvfp4"

E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)

# Every derivation at once on the tiny example: a concat listed out of name order (q, k, v;
# sorted would be k, q, v), a grouped concat, a transpose under a new name, a reshape of a
# rank-3 tensor, and concat + transpose + reshape chained with the inputs reversed (b, a).
DERIVE_RECIPE = """\
ninfer_recipe: 1
name: loader-derivations
version: "1"
source:
  model_type: qwen3_5
evidence:
  - id: e1
    citation: test
    summary: test
rules:
  - derive: 'model.language_model.layers.{L}.self_attn.qkv_proj.weight'
    inputs: ['model.language_model.layers.{L}.self_attn.q_proj.weight',
             'model.language_model.layers.{L}.self_attn.k_proj.weight',
             'model.language_model.layers.{L}.self_attn.v_proj.weight']
    concat_axis: 0
    format: BF16
    role: attention-qkv
  - derive: 'model.language_model.layers.{L}.mlp.gate_up_proj.weight'
    inputs: ['model.language_model.layers.{L}.mlp.gate_proj.weight',
             'model.language_model.layers.{L}.mlp.up_proj.weight']
    concat_axis: 0
    format: W8G32_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: mlp-gate-up
    evidence: [e1]
  - derive: 'model.language_model.layers.{L}.mlp.down_proj.weight_t'
    inputs: ['model.language_model.layers.{L}.mlp.down_proj.weight']
    transforms: [transpose]
    format: Q6G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: mlp-down
    evidence: [e1]
  - derive: 'model.language_model.layers.{L}.linear_attn.conv1d.weight_2d'
    inputs: ['model.language_model.layers.{L}.linear_attn.conv1d.weight']
    transforms: [{reshape: [-1, 4]}]
    format: BF16
    role: gdn-conv
  - derive: 'model.language_model.layers.{L}.linear_attn.in_proj_ba'
    inputs: ['model.language_model.layers.{L}.linear_attn.in_proj_b.weight',
             'model.language_model.layers.{L}.linear_attn.in_proj_a.weight']
    concat_axis: 0
    transforms: [transpose, {reshape: [-1, 16]}]
    format: BF16
    role: gdn-gate-proj
  - match: 're:.*norm\\.weight'
    format: FP32
    conversion: [bf16-to-f32]
    role: norm
  - match: 're:.*'
    format: BF16
    role: rest
"""


def _source_tensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                out[key] = f.get_tensor(key)
    return out


def _words(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """The tensor's words as unsigned integers of its width (bit patterns, not values)."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[t.element_size()]
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.contiguous().view(view).numpy().view(width)


def _reference_f32(fmt: str, logical: Any) -> np.ndarray[Any, Any]:
    """Independent spec reconstruction (binary32 values) of one logical tensor."""
    f = lookup_format(fmt)
    if isinstance(logical, GroupedCodes):
        assert f.group_size is not None
        s = logical.scales.view(np.float16).astype(np.float32)
        per = np.repeat(s, f.group_size, axis=1)[:, : logical.codes.shape[1]]
        return (per * logical.codes.astype(np.float32)).astype(np.float32)
    if isinstance(logical, NVFP4Words):
        block = logical.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        block = np.repeat(block, 16, axis=1)
        d = np.array([logical.divisor], dtype=np.uint32).view(np.float32)[0]
        return (E2M1[logical.codes] * block / d).astype(np.float32)
    if isinstance(logical, FP8RowWords):
        c = logical.codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        s = (logical.scales.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(over="ignore"):
            return (c * s[:, None]).astype(np.float32)
    raise AssertionError(type(logical))


def _check_value(fmt: str, logical: Any, value: torch.Tensor, dtype: torch.dtype) -> None:
    """``value`` (stored shape) is the stored words' reconstruction, compared word for word."""
    if isinstance(logical, DirectWords):
        words = logical.words
        if fmt == "I32":
            assert value.dtype == torch.int32
            assert np.array_equal(value.numpy(), words)
            return
        if fmt == "BF16":
            if dtype == torch.bfloat16:
                assert value.dtype == torch.bfloat16
                assert np.array_equal(_words(value), words)
            else:
                assert value.dtype == torch.float32
                assert np.array_equal(_words(value), words.astype(np.uint32) << 16)
            return
        assert fmt == "FP32"
        if dtype == torch.float32:
            assert np.array_equal(_words(value), words)
        else:
            got = _words(value)
            finite = (words & 0x7F800000) != 0x7F800000
            want = f32_to_bf16_rne(words[finite], keep_nonfinite=True)
            assert np.array_equal(got[finite], want)
            # Non-finite stays non-finite, NaN stays NaN (torch may canonicalise the payload).
            assert ((got[~finite] & 0x7F80) == 0x7F80).all()
            nan = ~finite & ((words & 0x7FFFFF) != 0)
            assert ((got[nan] & 0x7F) != 0).all()
        return
    ref = _reference_f32(fmt, logical)
    if dtype == torch.float32:
        assert value.dtype == torch.float32
        assert np.array_equal(_words(value), ref.view(np.uint32))
    else:
        assert value.dtype == torch.bfloat16
        want = f32_to_bf16_rne(ref.view(np.uint32), keep_nonfinite=True)
        finite = np.isfinite(ref)
        assert np.array_equal(_words(value)[finite], want[finite])


@pytest.mark.parametrize("block", [None, 70], ids=["one-block", "row-blocks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_every_format_reconstructs_bit_exactly(
    tmp_path: Path, dtype: torch.dtype, block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All nine formats, words over their whole legal range (NaN payloads, -0, subnormals);
    also reconstructed in row blocks (70 elements: one or two rows, partial last block)."""
    if block is not None:
        monkeypatch.setattr(loader_mod, "_BLOCK_ELEMENTS", block)
    out = write_small(tmp_path / "a", ALL_FORMATS)
    with open_artifact(out) as art, load_state_dict(art, names="artifact", dtype=dtype) as sd:
        assert list(sd) == [f"t.{f}" for f in ALL_FORMATS]
        for name in sd:
            fmt = art.tensors[name].format
            value = sd[name]
            assert tuple(value.shape) == art.tensors[name].shape
            _check_value(fmt, art.read(name), value, dtype)


@pytest.fixture(scope="module")
def derived_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("derive")
    recipe = tmp / "derive.yaml"
    recipe.write_text(DERIVE_RECIPE)
    convert_checkpoint(BF16_DIR, recipe, tmp / "out", device="cpu", jobs=1)
    return tmp / "out"


def test_source_names_invert_every_derivation(derived_artifact: Path) -> None:
    source = _source_tensors(BF16_DIR)
    with open_artifact(derived_artifact) as art:
        stored = set(art.tensors)
        assert "model.language_model.layers.3.self_attn.qkv_proj.weight" in stored
        assert "model.language_model.layers.0.linear_attn.in_proj_ba" in stored
        sd = load_state_dict(art, names="source", dtype=torch.bfloat16)
        assert set(sd) == set(source)
        for key in sd:
            value = sd[key]
            assert tuple(value.shape) == tuple(source[key].shape), key
            assert sd.shape(key) == tuple(source[key].shape)
            fmt = art.tensors[sd.stored_name(key)].format
            if fmt in ("BF16", "FP32"):
                # Lossless storage: the inverted derivation gives the source words back.
                assert np.array_equal(_words(value), _words(source[key])), key
        sd.close()


def _stored_reference(art: Any, name: str) -> np.ndarray[Any, Any]:
    """float32 words of the stored tensor's spec reconstruction (direct formats: exact)."""
    info = art.tensors[name]
    logical = art.read(name)
    if isinstance(logical, DirectWords):
        w = logical.words
        return w.astype(np.uint32) << 16 if info.format == "BF16" else w.view(np.uint32)
    return _reference_f32(info.format, logical).view(np.uint32)


def _invert_numpy(info: Any, words: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """An independent numpy reading of docs/container.md 4.9: source name -> words."""
    prov = info.provenance
    steps = prov["transforms"]
    if any(t["op"] == "copy-quantized" for t in steps):
        return {info.name: words}
    shapes = [tuple(src["shape"]) for src in prov["sources"]]
    concat = steps[0] if steps and steps[0]["op"] == "concat" else None
    rest = steps[1:] if concat else steps
    before = []
    shape = (
        tuple(np.concatenate([np.empty(x) for x in shapes], axis=concat["axis"]).shape)
        if concat
        else shapes[0]
    )
    for t in rest:
        before.append(shape)
        shape = shape[::-1] if t["op"] == "transpose" else tuple(t["shape"])
    for t, prev in zip(reversed(rest), reversed(before), strict=True):
        words = words.T if t["op"] == "transpose" else words.reshape(prev)
    if not concat:
        return {prov["sources"][0]["name"]: words}
    cuts = np.cumsum([x[concat["axis"]] for x in shapes])[:-1]
    pieces = np.split(words, cuts, axis=concat["axis"])
    return {src["name"]: p for src, p in zip(prov["sources"], pieces, strict=True)}


@pytest.mark.parametrize("recipe", ["shipped", "derive"])
def test_every_source_tensor_is_the_inverted_spec_reconstruction(
    derived_artifact: Path, tmp_path: Path, recipe: str
) -> None:
    """On the committed example, with the shipped recipe and with every derivation: each key's
    words equal the independent reconstruction of its stored tensor, inverted independently."""
    if recipe == "shipped":
        out = tmp_path / "shipped"
        convert_checkpoint(
            BF16_DIR, ROOT / "recipes" / "qwen3.6-27b.yaml", out, device="cpu", jobs=1
        )
    else:
        out = derived_artifact
    with open_artifact(out) as art, load_state_dict(art) as sd:
        expected: dict[str, np.ndarray[Any, Any]] = {}
        for name, info in art.tensors.items():
            expected.update(_invert_numpy(info, _stored_reference(art, name)))
        assert set(expected) == set(sd)
        formats = set()
        for key in sd:
            formats.add(art.tensors[sd.stored_name(key)].format)
            assert np.array_equal(_words(sd[key]), np.ascontiguousarray(expected[key])), key
        assert {"BF16", "Q6G64_F16S"} <= formats


def test_split_pieces_are_the_slices_of_the_stored_reconstruction(derived_artifact: Path) -> None:
    """Grouped concat: each source piece is its slice of the stored tensor's reconstruction;
    transpose-under-a-new-name comes back transposed."""
    with open_artifact(derived_artifact) as art:
        sd = load_state_dict(art, names="source")
        fused = "model.language_model.layers.1.mlp.gate_up_proj.weight"
        ref = _reference_f32("W8G32_F16S", art.read(fused))
        gate = sd["model.language_model.layers.1.mlp.gate_proj.weight"]
        up = sd["model.language_model.layers.1.mlp.up_proj.weight"]
        n = gate.shape[0]
        assert np.array_equal(_words(gate), ref[:n].view(np.uint32))
        assert np.array_equal(_words(up), ref[n:].view(np.uint32))
        t = "model.language_model.layers.2.mlp.down_proj.weight_t"
        down = sd["model.language_model.layers.2.mlp.down_proj.weight"]
        ref_t = _reference_f32("Q6G64_F16S", art.read(t))
        assert np.array_equal(_words(down), np.ascontiguousarray(ref_t.T).view(np.uint32))
        # names="artifact" keeps the stored names and shapes.
        raw = load_state_dict(art, names="artifact")
        assert t in raw and tuple(raw[t].shape) == art.tensors[t].shape
        assert "model.language_model.layers.2.mlp.down_proj.weight" not in raw


def test_nvfp4_copy_path_and_its_input_scales(tmp_path: Path) -> None:
    convert_checkpoint(
        NVFP4_DIR, ROOT / "recipes" / "qwen3.6-27b-nvfp4.yaml", tmp_path / "o", device="cpu", jobs=1
    )
    source = _source_tensors(NVFP4_DIR)
    with open_artifact(tmp_path / "o") as art, load_state_dict(art) as sd:
        nvfp4 = [n for n, i in art.tensors.items() if i.format == "NVFP4"]
        assert len(nvfp4) == 16
        for name in nvfp4:
            # Reported under the weight's own name, reconstructed per spec Section 3.3.
            assert name in sd and name + "_packed" not in sd
            assert np.array_equal(
                _words(sd[name]), _reference_f32("NVFP4", art.read(name)).view(np.uint32)
            )
        for key in sd:
            fmt = art.tensors[sd.stored_name(key)].format
            if fmt in ("BF16", "FP32"):
                want = source[key].float()
                assert np.array_equal(_words(sd[key]), _words(want)), key


def test_the_mapping_is_lazy_and_decodes_one_tensor_per_lookup(
    derived_artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = loader_mod.decode_tensor

    def counting(art: Any, name: str, dtype: torch.dtype) -> torch.Tensor:
        calls.append(name)
        return real(art, name, dtype)

    monkeypatch.setattr(loader_mod, "decode_tensor", counting)
    with load_state_dict(derived_artifact) as sd:
        assert calls == []  # building it decodes nothing
        sd["model.language_model.norm.weight"]
        assert calls == ["model.language_model.norm.weight"]
        calls.clear()
        for piece in ("q_proj", "k_proj", "v_proj"):
            sd[f"model.language_model.layers.3.self_attn.{piece}.weight"]
        # Three pieces of one concat: one decode, kept for the other pieces.
        assert calls == ["model.language_model.layers.3.self_attn.qkv_proj.weight"]


def _write_one(out: Path, prov: dict[str, Any], shape: tuple[int, ...] = (4, 6)) -> Path:
    with ArtifactWriter(out, metadata=META, alignment=64) as w:
        w.add("w", "BF16", make_logical("BF16", shape), role="r", provenance=prov)
    return out


def test_a_provenance_that_does_not_give_the_stored_shape_is_refused(tmp_path: Path) -> None:
    prov = provenance("BF16", shape=(4, 6))
    prov["transforms"] = [{"op": "transpose"}]  # [4, 6] transposed is [6, 4], not [4, 6]
    out = _write_one(tmp_path / "a", prov)
    with pytest.raises(ArtifactError, match=r"tensor 'w'.*give shape \[6, 4\]"):
        load_state_dict(out)
    with load_state_dict(out, names="artifact") as sd:  # stored names need no inversion
        assert tuple(sd["w"].shape) == (4, 6)


def test_concat_pieces_are_split_with_the_recorded_sizes_and_order(tmp_path: Path) -> None:
    prov = provenance("BF16")
    prov["sources"] = [
        {"name": "b", "dtype": "BF16", "shape": [1, 6], "file": "f"},
        {"name": "a", "dtype": "BF16", "shape": [3, 6], "file": "f"},
    ]
    prov["transforms"] = [{"op": "concat", "axis": 0}]
    out = _write_one(tmp_path / "c", prov)
    words = make_logical("BF16", (4, 6)).words  # type: ignore[union-attr]
    with load_state_dict(out, dtype=torch.bfloat16) as sd:
        assert list(sd) == ["b", "a"]
        assert np.array_equal(_words(sd["b"]), words[:1])
        assert np.array_equal(_words(sd["a"]), words[1:])
    # A negative axis counts from the end, as in numpy: columns 0..1 and 2..5.
    prov["sources"] = [
        {"name": "left", "dtype": "BF16", "shape": [4, 2], "file": "f"},
        {"name": "right", "dtype": "BF16", "shape": [4, 4], "file": "f"},
    ]
    prov["transforms"] = [{"op": "concat", "axis": -1}]
    with load_state_dict(_write_one(tmp_path / "n", prov), dtype=torch.bfloat16) as sd:
        assert np.array_equal(_words(sd["left"]), words[:, :2])
        assert np.array_equal(_words(sd["right"]), words[:, 2:])
    prov["sources"][1]["shape"] = [4, 3]  # sizes that do not add up to the stored columns
    with pytest.raises(ArtifactError, match="give shape"):
        load_state_dict(_write_one(tmp_path / "d", prov))


def test_two_tensors_claiming_one_source_name_are_refused(tmp_path: Path) -> None:
    with ArtifactWriter(tmp_path / "x", metadata=META, alignment=64) as w:
        for name in ("x1", "x2"):
            w.add(name, "BF16", make_logical("BF16", (3, 70)), role="r",
                  provenance=provenance("BF16"))  # fmt: skip
    with pytest.raises(ArtifactError, match="claimed by both"):
        load_state_dict(tmp_path / "x")


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    out = write_small(tmp_path / "a", ["BF16"])
    with pytest.raises(UsageError, match="names must be"):
        load_state_dict(out, names="stored")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="dtype must be"):
        load_state_dict(out, dtype=torch.float16)


@pytest.mark.interop
def test_source_names_load_strictly_into_the_transformers_class(derived_artifact: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(str(BF16_DIR))
    model = transformers.Qwen3_5ForConditionalGeneration(config)
    ignored = model._keys_to_ignore_on_load_unexpected  # what from_pretrained drops: mtp.*
    with load_state_dict(derived_artifact) as sd:
        wanted = {k: sd[k] for k in sd if not any(re.search(p, k) for p in ignored)}
        assert len(wanted) == len(sd) - 15
        result = model.load_state_dict(wanted, strict=True)
        assert not result.missing_keys and not result.unexpected_keys
        k = model.model.language_model.layers[3].self_attn.k_proj.weight
        assert torch.equal(k, sd["model.language_model.layers.3.self_attn.k_proj.weight"])
