"""MSE_F16_SEARCH_V1 (docs/encoder-profiles.md): exact reference semantics, numpy parity bit for
bit, the profile table, convert + verify with a recipe that selects the profile."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors
from verify_fixtures import copy_artifact, patch_bytes, plane_offset

from ninfer_convert import encode_grouped_words, open_artifact
from ninfer_convert.cli import main as cli_main
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.encoder import host
from ninfer_convert.encoder.common import to_f32
from ninfer_convert.encoder.corpus import failing_corpus, mse_boundary_corpus
from ninfer_convert.encoder.mse_reference import (
    _rne64,
    candidate_scales_reference,
    encode_group_mse_reference,
    group_error_reference,
)
from ninfer_convert.encoder.oracle import encode_group_oracle
from ninfer_convert.errors import EncodeError, FormatError
from ninfer_convert.formats import (
    ENCODER_PROFILES,
    FORMATS,
    MSE_F16_SEARCH_V1,
    check_profile_fits,
)
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.verify import verify_artifact

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
MSE = MSE_F16_SEARCH_V1


def f32w(values: list[float]) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()


def both(words: np.ndarray, source: str, fmt: str) -> tuple[GroupedCodes, GroupedCodes]:
    ref = encode_grouped_words(words, source, fmt, backend="oracle", profile=MSE)
    got = encode_grouped_words(words, source, fmt, backend="numpy", profile=MSE, threads=1)
    return ref, got


def assert_identical(ref: GroupedCodes, got: GroupedCodes, what: str) -> None:
    assert got.scales.tobytes() == ref.scales.tobytes(), f"{what}: scale words differ"
    assert got.codes.tobytes() == ref.codes.tobytes(), f"{what}: codes differ"


# --- the reference's own arithmetic ------------------------------------------------------------


@given(st.integers(-(2**80), 2**80), st.integers(-200, 100))
def test_reference_binary64_rounding_matches_ieee(m: int, e: int) -> None:
    rm, re_ = _rne64(m, e)
    exact = Fraction(m) * Fraction(2) ** e
    assert Fraction(rm) * Fraction(2) ** re_ == Fraction(float(exact))  # float(): correct RNE


@pytest.mark.parametrize("fmt", GROUPED)
def test_candidate_zero_is_the_canonical_scale(fmt: str) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None
    x = f32w([0.3, -1.7, 2.2, 0.01])
    cands = candidate_scales_reference(x, f.qmin, f.qmax)
    assert len(cands) == 14
    assert cands[0] == encode_group_oracle(x, f.qmin, f.qmax)[0]


def test_negative_maximum_takes_code_minus_8_with_zero_error() -> None:
    # amax = 8 at a negative value: candidate 1 (amax / |qmin|) is exactly 1.0, so -8 .. 7
    # reconstruct without error, while the canonical scale 8/7 cannot.
    x = f32w([float(v) for v in range(-8, 8)])
    scale, codes = encode_group_mse_reference(x, -8, 7)
    assert scale == 0x3C00 and codes == list(range(-8, 8))
    canon, _ = encode_group_oracle(x, -8, 7)
    assert canon != scale


def test_q6_uses_minus_32_and_w8_never_minus_128() -> None:
    _, codes6 = encode_group_mse_reference(f32w([-32.0, 31.0, 5.0]), -32, 31)
    assert codes6[0] == -32
    for x in ([-128.0, 127.0, 1.0], [-127.5, 3.0]):
        _, codes8 = encode_group_mse_reference(f32w(x), -127, 127)
        assert min(codes8) >= -127


def test_tie_between_distinct_candidates_goes_to_the_lower_index() -> None:
    x = f32w([-7.0])
    cands = candidate_scales_reference(x, -8, 7)
    errors = {}
    for j, s in enumerate(cands):
        assert s is not None
        codes = [min(max(round(Fraction(-7) / _f16(s)), -8), 7)]
        errors[j] = group_error_reference(x, s, codes)
    assert errors[0] == errors[1] == 0 and cands[0] != cands[1]  # a real tie: 1.0 vs 0.875
    assert encode_group_mse_reference(x, -8, 7) == (cands[0], [-7])


def test_tie_with_nonzero_error_goes_to_the_lower_index() -> None:
    x = f32w([4.25, 1.0, -7.875])
    cands = candidate_scales_reference(x, -8, 7)
    assert cands[0] == cands[5] == 0x3C80 and cands[9] == 0x3C00
    errs = [group_error_reference(x, s, _nearest(x, s)) for s in (0x3C80, 0x3C00)]
    assert errs[0] == errs[1] == Fraction(5, 64)
    assert encode_group_mse_reference(x, -8, 7)[0] == 0x3C80


def _nearest(x: list[int], s: int) -> list[int]:
    vals = np.asarray(x, np.uint32).view(np.float32).astype(np.float64)
    return [min(max(round(Fraction(float(v)) / _f16(s)), -8), 7) for v in vals]


@given(hnp.arrays(np.float32, (3, 64), elements=st.floats(-1e3, 1e3, width=32)))
def test_numpy_group_error_is_the_sequential_binary64_sum(x32: np.ndarray) -> None:
    from ninfer_convert.encoder.mse_search import group_errors

    fmt = FORMATS["Q4G64_F16S"]
    xt = np.ascontiguousarray(x32.astype(np.float64).T)  # [64, 3]: column r is group r
    s = np.array([0.25, 1.0 / 64, 3.0])
    q, t = np.empty_like(xt), np.empty_like(xt)
    err = np.empty(3)
    group_errors(xt, s, fmt, q, t, err)
    for r in range(3):
        xs = [int(w) for w in x32[r].view(np.uint32)]
        s16 = int(np.float16(s[r]).view(np.uint16))
        ref = group_error_reference(xs, s16, [int(v) for v in q[:, r]])
        assert Fraction(float(err[r])) == ref


def _f16(word: int) -> Fraction:
    return Fraction(float(np.array([word], np.uint16).view(np.float16)[0]))


def test_overflowing_candidates_are_skipped_and_the_canonical_scale_kept() -> None:
    x = f32w([65504.0 * 7, 1.0])
    cands = candidate_scales_reference(x, -8, 7)
    assert cands[0] == 0x7BFF and None in cands  # 65504 fits; amax*32/(7*29) does not
    scale, _ = encode_group_mse_reference(x, -8, 7)
    assert scale < 0x7C00


def test_all_zero_group_is_plus_zero_with_zero_codes() -> None:
    assert encode_group_mse_reference(f32w([0.0, -0.0, 0.0]), -8, 7) == (0, [0, 0, 0])


# --- numpy parity, bit for bit ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", GROUPED)
def test_numpy_matches_reference_on_the_boundary_corpus(fmt: str) -> None:
    for case, words in mse_boundary_corpus(FORMATS[fmt]):
        ref, got = both(words, "F32", fmt)
        assert_identical(ref, got, f"{fmt} {case}")


@pytest.mark.parametrize("fmt", GROUPED)
def test_refusals_are_the_canonical_ones(fmt: str) -> None:
    for case, words, row, group in failing_corpus(FORMATS[fmt]):
        msgs = []
        for backend in ("numpy", "oracle"):
            with pytest.raises(EncodeError) as exc:
                encode_grouped_words(words, "F32", fmt, backend=backend, profile=MSE)
            msgs.append(str(exc.value))
        with pytest.raises(EncodeError) as canon:
            encode_grouped_words(words, "F32", fmt, backend="oracle")
        assert msgs[0] == msgs[1] == str(canon.value), case
        assert f"row {row}" in msgs[0] and f"group {group}" in msgs[0]


_MAGS = st.integers(-140, 14)


@st.composite
def _matrices(draw: st.DrawFn) -> tuple[np.ndarray, str]:
    source = draw(st.sampled_from(["F32", "BF16", "F16"]))
    n = draw(st.integers(1, 3))
    k = draw(st.integers(1, 150))
    if source == "F32":
        x = draw(hnp.arrays(np.float32, (n, k), elements=st.floats(-4, 4, width=32)))
        x = x * np.float32(2.0) ** np.float32(draw(_MAGS))
        return np.ascontiguousarray(x.astype(np.float32)).view(np.uint32), source
    words = draw(hnp.arrays(np.uint16, (n, k)))
    if source == "BF16":  # exponent field folded into [0, 140]: finite, below 2^14, subnormals
        exp = ((words >> np.uint16(7)) & np.uint16(0xFF)) % np.uint16(141)
        words = (words & np.uint16(0x807F)) | (exp << np.uint16(7))
    else:  # every finite binary16 value fits (65504 / qmax never overflows)
        words[(words & np.uint16(0x7C00)) == np.uint16(0x7C00)] &= np.uint16(0x8FFF)
    return words.astype(np.uint16), source


@given(_matrices(), st.sampled_from(GROUPED))
def test_numpy_matches_reference_on_generated_matrices(m: tuple[np.ndarray, str], fmt: str) -> None:
    words, source = m
    ref, got = both(words, source, fmt)
    assert_identical(ref, got, f"{fmt} {source}")


@given(_matrices(), st.sampled_from(GROUPED))
def test_never_worse_than_the_canonical_profile(m: tuple[np.ndarray, str], fmt: str) -> None:
    # In the profile's own error measure, per group: candidate 0 is the canonical scale, and
    # the nearest codes are never farther than the canonical reciprocal-multiply codes.
    words, source = m
    f = FORMATS[fmt]
    assert f.group_size is not None
    mse = encode_grouped_words(words, source, fmt, profile=MSE, threads=1)
    canon = encode_grouped_words(words, source, fmt)
    xw = to_f32(words, source).view(np.uint32)
    g = f.group_size
    for r in range(words.shape[0]):
        for gi in range(mse.scales.shape[1]):
            lo, hi = gi * g, min(words.shape[1], (gi + 1) * g)
            xs = [int(w) for w in xw[r, lo:hi]]
            e_mse = group_error_reference(xs, int(mse.scales[r, gi]), mse.codes[r, lo:hi].tolist())
            e_can = group_error_reference(
                xs, int(canon.scales[r, gi]), canon.codes[r, lo:hi].tolist()
            )
            assert e_mse <= e_can


def test_threads_and_chunks_do_not_change_the_words() -> None:
    rng = np.random.default_rng(3)
    words = rng.standard_normal((37, 300)).astype(np.float32).view(np.uint32)
    from ninfer_convert.encoder.mse_search import encode_mse_numpy

    fmt = FORMATS["Q4G64_F16S"]
    a = encode_mse_numpy(words, "F32", fmt, threads=1)
    b = encode_mse_numpy(words, "F32", fmt, threads=2, chunk_elements=700)
    assert_identical(a, b, "threads/chunks")


def test_host_block_encoder_dispatches_on_the_profile() -> None:
    rng = np.random.default_rng(4)
    words = (rng.standard_normal((5, 130)).astype(np.float32).view(np.uint32) >> 16).astype(
        np.uint16
    )
    fmt = FORMATS["Q4G64_F16S"]
    codes = np.empty((5, 130), np.int8)
    scales = np.empty((5, 3), np.uint16)
    host.encode_rows(words, "BF16", fmt, 0, codes, scales, "t", profile=MSE)
    ref = encode_grouped_words(words, "BF16", fmt, backend="oracle", profile=MSE)
    assert_identical(ref, GroupedCodes(codes, scales), "host.encode_rows")
    canon = encode_grouped_words(words, "BF16", fmt, backend="oracle")
    assert canon.codes.tobytes() != codes.tobytes()  # the profile really changed something


# --- the profile table ---------------------------------------------------------------------------


def test_profile_is_registered_for_the_four_grouped_formats_only() -> None:
    assert ENCODER_PROFILES[MSE].formats == frozenset(GROUPED)
    for fmt in GROUPED:
        check_profile_fits(MSE, fmt)
    for fmt in ("BF16", "NVFP4", "FP8_E4M3FN_ROW_BF16S"):
        with pytest.raises(FormatError):
            check_profile_fits(MSE, fmt)
    with pytest.raises(FormatError):
        check_profile_fits("mse_f16_search_v1", "Q4G64_F16S")  # exact names only


def test_formats_json_lists_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["formats", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {f["name"]: f for f in data["formats"]}
    for fmt in GROUPED:
        assert MSE in by_name[fmt]["encoder_profiles"]
    assert MSE not in by_name["BF16"]["encoder_profiles"]
    assert MSE in {p["name"] for p in data["encoder_profiles"]}


# --- convert + verify ----------------------------------------------------------------------------


def _convert(tmp: Path, profile: str) -> tuple[Path, np.ndarray]:
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((24, 200)).astype(np.float32)
    words = (w.view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(src / "model.safetensors", {"w": ("BF16", words)})
    (src / "config.json").write_text('{"model_type": "llama"}')
    recipe = tmp / f"{profile}.yaml"
    recipe.write_text(
        RECIPE_HEAD + f"- match: w\n  format: Q4G64_F16S\n  encoder_profile: {profile}\n"
        "  role: r\n  evidence: [e1]\n"
    )
    out = tmp / f"out-{profile}"
    convert_checkpoint(src, recipe, out, device="cpu", jobs=2)
    return out, words


def test_convert_with_the_profile_stores_reference_words_and_verify_passes(
    tmp_path: Path,
) -> None:
    out, words = _convert(tmp_path, MSE)
    ref = encode_grouped_words(words, "BF16", "Q4G64_F16S", backend="oracle", profile=MSE)
    with open_artifact(out) as art:
        got = art.read("w")
        assert art.tensors["w"].provenance["encoder_profile"] == MSE
    assert isinstance(got, GroupedCodes)
    assert_identical(ref, got, "artifact")
    report = verify_artifact(out, device="cpu", oracle_groups=4)
    assert report.exit_code == 0, report
    assert report.check("oracle-sample").tensors == 1
    # The canonical recipe gives different words for the same source: the profile is not
    # silently the canonical one, and the canonical artifact verifies too.
    canon, _ = _convert(tmp_path, "MAXABS_F16_RECIP_RNE_V1")
    with open_artifact(canon) as art:
        other = art.read("w")
    assert isinstance(other, GroupedCodes) and other.codes.tobytes() != got.codes.tobytes()


def test_verify_catches_a_changed_code_in_a_profile_artifact(tmp_path: Path) -> None:
    out, _ = _convert(tmp_path, MSE)
    art = copy_artifact(out, tmp_path / "bad")
    _, offset, _ = plane_offset(art, "w", "codes")

    def edit(p: Path, data: bytearray) -> None:
        data[offset + 3] ^= 0x01  # one 4-bit code of row 0, digests recomputed

    patch_bytes(art, edit)
    report = verify_artifact(art, device="cpu", oracle_groups=96)  # every group sampled
    assert report.exit_code != 0
    failed = {c.name: [f.render() for f in c.findings] for c in report.checks if c.findings}
    assert "source-words" in failed
    assert any("MSE_F16_SEARCH_V1 reference" in f for f in failed["oracle-sample"])


def test_cuda_device_still_encodes_the_profile_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # convert encodes the profile on the host: with device "cuda" its tensors take the host path, so
    # nothing here may reach torch (which would fail on a machine without CUDA anyway).
    from ninfer_convert import convert, derive
    from ninfer_convert.encoder import torch_backend

    _, words = _convert(tmp_path, MSE)

    def no_torch(*args: object, **kw: object) -> None:
        raise AssertionError("the torch backend ran for MSE_F16_SEARCH_V1")

    monkeypatch.setattr(torch_backend, "encode_torch", no_torch)
    src, plan = convert.plan_conversion(tmp_path / "src", tmp_path / f"{MSE}.yaml")
    (entry,) = plan.entries
    cuda = derive.derive_packed(entry, src, device="cuda")
    cpu = derive.derive_packed(entry, src, device="cpu")
    assert [p.tobytes() for p in cuda.planes] == [p.tobytes() for p in cpu.planes]
    derived = derive.derive_logical(entry, src, device="cuda")
    assert derived.device == "cpu"
    ref = encode_grouped_words(words, "BF16", "Q4G64_F16S", backend="oracle", profile=MSE)
    assert isinstance(derived.logical, GroupedCodes)
    assert_identical(ref, derived.logical, "derive_logical on cuda")


@given(_matrices(), st.sampled_from(GROUPED))
def test_profile_output_obeys_the_value_rules(m: tuple[np.ndarray, str], fmt: str) -> None:
    from ninfer_convert.validate import grouped_problems

    words, source = m
    enc = encode_grouped_words(words, source, fmt, profile=MSE, threads=1)
    assert grouped_problems(FORMATS[fmt], enc.codes, enc.scales, "t") == []
    if fmt == "W8G32_F16S":
        assert int(enc.codes.min(initial=0)) >= -127


def test_artifact_bytes_do_not_depend_on_jobs(tmp_path: Path) -> None:
    out2, _ = _convert(tmp_path, MSE)
    out1 = tmp_path / "jobs1"
    convert_checkpoint(tmp_path / "src", tmp_path / f"{MSE}.yaml", out1, device="cpu", jobs=1)
    files = sorted(p.name for p in out2.iterdir())
    assert files == sorted(p.name for p in out1.iterdir())
    for name in files:
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes(), name


def test_derived_tensor_with_the_profile_round_trips_through_verify(tmp_path: Path) -> None:
    # A concatenated and transposed output reaches the encoder as derived rows (not a view of
    # the source): the profile must see the same values as the reference on the whole matrix.
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(8)
    a = (rng.standard_normal((70, 40)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = (rng.standard_normal((70, 30)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(src / "model.safetensors", {"a": ("BF16", a), "b": ("BF16", b)})
    (src / "config.json").write_text('{"model_type": "llama"}')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        RECIPE_HEAD + "- derive: ab\n  inputs: [a, b]\n  concat_axis: 1\n"
        f"  transforms: [transpose]\n  format: Q4G64_F16S\n  encoder_profile: {MSE}\n"
        "  role: r\n  evidence: [e1]\n"
    )
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", jobs=2)
    words = np.ascontiguousarray(np.concatenate([a, b], axis=1).T)  # [70, 70]
    ref = encode_grouped_words(words, "BF16", "Q4G64_F16S", backend="oracle", profile=MSE)
    with open_artifact(out) as art:
        got = art.read("ab")
    assert isinstance(got, GroupedCodes)
    assert_identical(ref, got, "derived")
    assert verify_artifact(out, device="cpu", oracle_groups=8).exit_code == 0


def test_unknown_profile_names_are_rejected_by_the_encoder() -> None:
    words = np.ones((1, 64), np.float32).view(np.uint32)
    for bad in ("mse_f16_search_v1", "MSE_F16_SEARCH_V2", "MSE"):
        with pytest.raises(FormatError, match="unknown encoder profile"):
            encode_grouped_words(words, "F32", "Q4G64_F16S", profile=bad)
