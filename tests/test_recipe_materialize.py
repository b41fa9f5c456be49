"""Materialisation: bitwise copies, every conversion, constraints, transforms, grouped inputs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import xxhash
from recipe_fixtures import RECIPE_HEAD
from safetensors.torch import save_file

from ninfer_convert.encoder import encode_grouped_words
from ninfer_convert.errors import EncodeError, SourceError
from ninfer_convert.logical import DirectWords
from ninfer_convert.recipe import EncodeInput, build_plan, loads_recipe, materialize
from ninfer_convert.recipe.materialize import DerivedWords
from ninfer_convert.recipe.plan import Plan
from ninfer_convert.source import SourceCheckpoint, open_source

HEAD = RECIPE_HEAD


def source(root: Path, tensors: dict[str, torch.Tensor]) -> SourceCheckpoint:
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return open_source(root)


def plan(body: str, src: SourceCheckpoint) -> Plan:
    return build_plan(loads_recipe(HEAD + textwrap.dedent(body)), src)


def words(
    values: list[int], dtype: str, torch_dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    return torch.from_numpy(np.array(values, dtype=dtype).reshape(shape)).view(torch_dtype)


def direct(entry_value: object) -> np.ndarray:
    assert isinstance(entry_value, DirectWords)
    return np.asarray(entry_value.words)


BF16_EDGE = [0x0000, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x7FC1, 0x7F81, 0xFFFF]


def test_same_type_direct_copies_are_bitwise(tmp_path: Path) -> None:
    f32 = [0x80000000, 0x7F800001, 0xFFC00123, 0x00000001, 0x7F7FFFFF, 0x3F800000]
    src = source(
        tmp_path / "m",
        {
            "bf": words(BF16_EDGE, "<u2", torch.bfloat16, (2, 4)),
            "f32": words(f32, "<u4", torch.float32, (6,)),
            "idx": torch.tensor([[-(2**31), -1], [0, 2**31 - 1]], dtype=torch.int32),
            "scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        },
    )
    p = plan(
        """\
        - match: bf
          format: BF16
          role: a
        - match: scalar
          format: BF16
          role: a
        - match: f32
          format: FP32
          role: a
        - match: idx
          format: I32
          role: a
        """,
        src,
    )
    got = {e.output: materialize(e, src) for e in p.entries}
    assert direct(got["bf"].value).tolist() == [BF16_EDGE[:4], BF16_EDGE[4:]]
    assert direct(got["f32"].value).tolist() == f32
    assert direct(got["idx"].value).dtype == np.dtype("<i4")
    assert direct(got["idx"].value).tolist() == [[-(2**31), -1], [0, 2**31 - 1]]
    assert direct(got["scalar"].value).shape == ()
    for name, m in got.items():
        raw = src.read(name)
        assert m.source_digests == {name: raw.digest}
        assert not m.needs_encoding and m.output == name


def _f32_finite_words(rng: np.random.Generator, n: int) -> np.ndarray:
    w = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    finite = (w & 0x7F800000) != 0x7F800000
    small = np.abs(w.view(np.float32)) < np.float32(3.3e38)  # away from the overflow edge
    w = w[finite & small]
    # ties and near-ties: low halves 0x8000, 0x7FFF, 0x8001 with odd and even kept parts
    ties = np.array(
        [0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x00008000, 0x80018000], dtype=np.uint32
    )
    return np.concatenate([w, ties])


def test_f32_to_bf16_rne_matches_ml_dtypes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = _f32_finite_words(rng, 4000)
    src = source(tmp_path / "m", {"x": torch.from_numpy(w.copy()).view(torch.float32)})
    p = plan(
        """\
        - match: x
          format: BF16
          conversion: f32-to-bf16-rne
          role: a
          evidence: e1
        """,
        src,
    )
    got = direct(materialize(p.entries[0], src).value)
    want = w.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert p.entries[0].conversion == "f32-to-bf16-rne"
    assert np.array_equal(got, want)


def test_f16_to_bf16_rne_matches_ml_dtypes(tmp_path: Path) -> None:
    h = np.arange(2**16, dtype=np.uint16)
    h = h[(h & 0x7C00) != 0x7C00]  # every finite binary16 word
    src = source(tmp_path / "m", {"x": torch.from_numpy(h.copy()).view(torch.float16)})
    p = plan(
        """\
        - match: x
          format: BF16
          conversion: [f32-to-bf16-rne, f16-to-bf16-rne]
          role: a
          evidence: e1
        """,
        src,
    )
    got = direct(materialize(p.entries[0], src).value)
    want = h.view(np.float16).astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(got, want)


def test_exact_widening_conversions(tmp_path: Path) -> None:
    b = np.arange(2**16, dtype=np.uint16)
    h = np.arange(2**16, dtype=np.uint16)
    src = source(
        tmp_path / "m",
        {
            "b": torch.from_numpy(b.copy()).view(torch.bfloat16),
            "h": torch.from_numpy(h.copy()).view(torch.float16),
        },
    )
    p = plan(
        """\
        - match: '[bh]'
          format: FP32
          conversion: [bf16-to-f32, f16-to-f32]
          role: a
        """,
        src,
    )
    got = {e.output: direct(materialize(e, src).value) for e in p.entries}
    assert np.array_equal(got["b"], b.astype(np.uint32) << 16)  # every BF16 word, NaNs included
    nan = ((h & 0x7C00) == 0x7C00) & ((h & 0x03FF) != 0)
    ref = h.view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(got["h"][~nan], ref[~nan])  # subnormals, infinities, signed zeros
    # NaNs: sign, exponent all ones, payload shifted up by 13 (signalling bit kept)
    want_nan = (
        ((h[nan].astype(np.uint32) & 0x8000) << 16)
        | 0x7F800000
        | ((h[nan].astype(np.uint32) & 0x3FF) << 13)
    )
    assert np.array_equal(got["h"][nan], want_nan)


def test_int_to_i32(tmp_path: Path) -> None:
    src = source(
        tmp_path / "m",
        {
            "i64": torch.tensor([-(2**31), 0, 2**31 - 1], dtype=torch.int64),
            "u8": torch.tensor([0, 255], dtype=torch.uint8),
            "mask": torch.tensor([True, False]),
            "wide": torch.tensor([[0, 1], [2**31, 3]], dtype=torch.int64),
        },
    )
    p = plan(
        """\
        - match: '*'
          format: I32
          conversion: int-to-i32
          role: idx
        """,
        src,
    )
    got = {e.output: e for e in p.entries}
    assert direct(materialize(got["i64"], src).value).tolist() == [-(2**31), 0, 2**31 - 1]
    assert direct(materialize(got["u8"], src).value).tolist() == [0, 255]
    assert direct(materialize(got["mask"], src).value).tolist() == [1, 0]
    with pytest.raises(EncodeError, match=r"value 2147483648 at index \[1, 0\] is outside"):
        materialize(got["wide"], src)


def test_nonfinite_policies(tmp_path: Path) -> None:
    f = [1.0, float("inf"), 2.0, float("nan")]
    src = source(
        tmp_path / "m",
        {
            "refuse": torch.tensor([f, f]),
            "keep": torch.tensor([f, f]),
            "big": torch.tensor([[1.0, 3.3e38], [3.4e38, 1.0]]),  # 3.4e38 is past BF16 max + ulp/2
            "half": torch.tensor([1.0, float("-inf")], dtype=torch.float16),
        },
    )
    p = plan(
        """\
        - match: keep
          format: BF16
          conversion: f32-to-bf16-rne
          keep_nonfinite: true
          role: a
          evidence: e1
        - match: half
          format: BF16
          conversion: f16-to-bf16-rne
          keep_nonfinite: true
          role: a
          evidence: e1
        - match: '*'
          format: BF16
          conversion: f32-to-bf16-rne
          role: a
          evidence: e1
        """,
        src,
    )
    e = {x.output: x for x in p.entries}
    with pytest.raises(EncodeError) as info:
        materialize(e["refuse"], src)
    msg = str(info.value)
    assert "tensor 'refuse'" in msg and "row 0, column 1" in msg and "infinity" in msg
    assert "keep_nonfinite" in msg and "line 23" in msg
    kept = direct(materialize(e["keep"], src).value)
    assert kept[0].tolist()[:3] == [0x3F80, 0x7F80, 0x4000]
    assert (int(kept[0, 3]) & 0x7F80) == 0x7F80 and (int(kept[0, 3]) & 0x7F) != 0  # still NaN
    assert direct(materialize(e["half"], src).value).tolist() == [0x3F80, 0xFF80]
    with pytest.raises(EncodeError, match=r"at row 1, column 0 rounds to infinity in BF16"):
        materialize(e["big"], src)


def test_finite_only_reports_position(tmp_path: Path) -> None:
    c3 = torch.zeros(2, 2, 2, dtype=torch.bfloat16)
    c3[1, 0, 1] = float("nan")
    src = source(
        tmp_path / "m",
        {
            "m2": torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, float("inf")]], dtype=torch.bfloat16),
            "v1": torch.tensor([0.0, 1.0, 2.0, float("nan")]),
            "c3": c3,
            "ok": torch.tensor([-0.0, 1.0], dtype=torch.bfloat16),
        },
    )
    p = plan(
        """\
        - match: v1
          format: FP32
          role: a
          constraints: [finite-only]
        - match: '*'
          format: BF16
          role: a
          constraints: [finite-only]
        """,
        src,
    )
    e = {x.output: x for x in p.entries}
    with pytest.raises(EncodeError) as info:
        materialize(e["m2"], src)
    assert "(infinity, BF16 word 0x7f80) at row 1, column 2" in str(info.value)
    # The recipe rule is where it happened, not a normative rule of the spec.
    assert (info.value.kind, info.value.rule) == ("non_finite_value", None)
    assert info.value.where == f"recipe rule at line {e['m2'].rule.line}"
    with pytest.raises(EncodeError, match=r"NaN, FP32 word 0x7fc00000\) at index 3"):
        materialize(e["v1"], src)
    with pytest.raises(EncodeError, match=r"at index \[1, 0, 1\]"):
        materialize(e["c3"], src)
    assert direct(materialize(e["ok"], src).value).tolist() == [0x8000, 0x3F80]


def test_grouped_inputs_and_derivations(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 8, generator=g).to(torch.bfloat16)
    k = torch.randn(2, 8, generator=g).to(torch.bfloat16)
    v = torch.randn(2, 8, generator=g).to(torch.bfloat16)
    src = source(
        tmp_path / "m",
        {
            "l.0.q": q,
            "l.0.k": k,
            "l.0.v": v,
            "h": torch.randn(3, 5, generator=g).to(torch.float16),
            "f": torch.randn(6, 1, 4, generator=g),
        },
    )
    p = plan(
        """\
        - derive: 'l.{L}.qkv'
          inputs: ['l.{L}.q', 'l.{L}.k', 'l.{L}.v']
          concat_axis: 0
          transforms: [transpose]
          format: Q4G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: qkv
          evidence: e1
        - match: h
          format: W8G32_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: a
          evidence: e1
        - match: f
          format: Q5G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          transforms: [{reshape: [-1, 4]}]
          role: a
          evidence: e1
        """,
        src,
    )
    e = {x.output: x for x in p.entries}
    m = materialize(e["l.0.qkv"], src)
    assert m.needs_encoding and isinstance(m.value, EncodeInput)
    want = torch.cat([q, k, v], 0).T.contiguous().view(torch.uint16).numpy()
    assert m.value.source_dtype == "BF16" and m.value.words.dtype == np.uint16
    # A derived input is produced a row block at a time, never built whole by materialize.
    derived = m.value.words
    assert isinstance(derived, DerivedWords) and derived.shape == want.shape
    assert np.array_equal(derived.whole(), want)
    for r0, r1 in [(0, 1), (3, 7), (5, 16)]:  # any row range, and column slices of it
        assert np.array_equal(derived[r0:r1], want[r0:r1])
        assert np.array_equal(derived[r0:r1, 2:5], want[r0:r1, 2:5])
    assert set(m.source_digests) == {"l.0.q", "l.0.k", "l.0.v"}
    assert (
        m.source_digests["l.0.k"]
        == "xxh3-128:"
        + xxhash.xxh3_128(k.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    )
    mh = materialize(e["h"], src)
    assert isinstance(mh.value, EncodeInput) and mh.value.source_dtype == "F16"
    mf = materialize(e["f"], src)
    assert isinstance(mf.value, EncodeInput) and mf.value.source_dtype == "F32"
    assert mf.value.words.dtype == np.uint32 and mf.value.words.shape == (6, 4)


def test_grouped_refuses_nonfinite_in_logical_coordinates(tmp_path: Path) -> None:
    a = torch.zeros(3, 4, dtype=torch.bfloat16)
    a[2, 1] = float("-inf")
    src = source(tmp_path / "m", {"a": a})
    p = plan(
        """\
        - match: a
          format: Q6G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          transforms: [transpose]
          role: a
          evidence: e1
        """,
        src,
    )
    # materialize hands the transposed words on; the canonical encoder refuses the value and
    # names it in the logical (transposed) coordinates.
    m = materialize(p.entries[0], src)
    assert isinstance(m.value, EncodeInput)
    with pytest.raises(EncodeError, match=r"row 1, column 2 \(group 0\)"):
        encode_grouped_words(m.value.words, m.value.source_dtype, "Q6G64_F16S", tensor="a")


def test_source_changed_after_planning(tmp_path: Path) -> None:
    src = source(tmp_path / "m", {"a": torch.ones(2, dtype=torch.bfloat16)})
    p = plan("- match: a\n  format: BF16\n  role: a\n", src)
    save_file({"a": torch.ones(3, dtype=torch.bfloat16)}, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(SourceError, match=r"was BF16 \[2\] when planned, now BF16 \[3\]"):
        materialize(p.entries[0], open_source(tmp_path / "m"))


def test_entry_from_dict_materializes_identically(tmp_path: Path) -> None:
    from ninfer_convert.recipe import PlanEntry

    src = source(tmp_path / "m", {"a": torch.randn(4, 3)})
    p = plan(
        """\
        - match: a
          format: BF16
          conversion: f32-to-bf16-rne
          transforms: [transpose]
          role: a
          evidence: e1
        """,
        src,
    )
    again = PlanEntry.from_dict(json.loads(json.dumps(p.entries[0].to_dict())))
    a, b = materialize(p.entries[0], src), materialize(again, src)
    assert np.array_equal(direct(a.value), direct(b.value))
    assert a.source_digests == b.source_digests
