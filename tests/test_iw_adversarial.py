"""Adversarial checks of MSE_F16_SEARCH_V1 / MSE_F16_SEARCH_IW_V1 beyond their corpora: the C
kernel and the torch backend against the exact reference on shapes and values the boundary
corpus misses, weight vectors the encoder must refuse, importance files and artifacts that were
edited, and the failure paths of ``ninfer calibrate`` (typed errors, checked before the model
runs, nothing left that looks finished)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_convert_iw import _importance, _recipe, _source, _weights

from ninfer_convert import encode_grouped_words
from ninfer_convert import importance as importance_mod
from ninfer_convert.cli import main
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.encoder import host
from ninfer_convert.encoder.mse_reference import CANDIDATE_RATIOS
from ninfer_convert.errors import EncodeError, RecipeError, ResourceError, UsageError
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_IW_V1, MSE_F16_SEARCH_V1
from ninfer_convert.importance import IMPORTANCE_FILE, load_importance, write_importance_file
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.native import optional_module
from ninfer_convert.verify import verify_artifact

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
kernel = optional_module("_msekernel")
native = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")


def _ref(words: np.ndarray, source: str, fmt: str, w: np.ndarray | None = None) -> GroupedCodes:
    profile = MSE_F16_SEARCH_V1 if w is None else MSE_F16_SEARCH_IW_V1
    return encode_grouped_words(words, source, fmt, backend="oracle", profile=profile, importance=w)


def _numpy(words: np.ndarray, source: str, fmt: str, w: np.ndarray | None = None) -> GroupedCodes:
    profile = MSE_F16_SEARCH_V1 if w is None else MSE_F16_SEARCH_IW_V1
    return encode_grouped_words(words, source, fmt, backend="numpy", profile=profile, importance=w)


def _torch(words: np.ndarray, source: str, fmt: str) -> GroupedCodes:
    return encode_grouped_words(words, source, fmt, backend="torch", profile=MSE_F16_SEARCH_V1)


def _native(words: np.ndarray, source: str, fmt: str, w: np.ndarray | None = None) -> GroupedCodes:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // entry.group_size)), dtype=np.uint16)
    host.encode_rows_mse_native(words, source, entry, 0, codes, scales, "t", w)
    return GroupedCodes(codes=codes, scales=scales)


def _assert_same(want: GroupedCodes, got: GroupedCodes, what: str) -> None:
    assert np.asarray(got.scales).tobytes() == np.asarray(want.scales).tobytes(), what
    assert np.asarray(got.codes).tobytes() == np.asarray(want.codes).tobytes(), what


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype(np.float32)).view(np.uint32)


# --- the encoders on inputs the corpus misses -------------------------------------------------


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_partial_single_and_tiny_groups_match_the_reference(fmt: str) -> None:
    """K = 1, 3, G - 1, G + 1 and 2G + 5 columns, one and two rows, magnitudes from binary32
    subnormals to 1e3: C kernel, torch (CPU) and the weighted C/numpy paths."""
    g = FORMATS[fmt].group_size
    assert g is not None
    rng = np.random.default_rng(11)
    for k in (1, 3, g - 1, g + 1, 2 * g + 5):
        for n in (1, 2):
            scale = rng.choice([1e-40, 1e-3, 1.0, 1e3], (n, k))
            x = _f32(rng.standard_normal((n, k)) * scale)
            want = _ref(x, "F32", fmt)
            _assert_same(want, _native(x, "F32", fmt), f"C {fmt} {n}x{k}")
            _assert_same(want, _torch(x, "F32", fmt), f"torch {fmt} {n}x{k}")
            w = _f32(rng.random(k))
            want_w = _ref(x, "F32", fmt, w)
            _assert_same(want_w, _native(x, "F32", fmt, w), f"C IW {fmt} {n}x{k}")
            _assert_same(want_w, _numpy(x, "F32", fmt, w), f"numpy IW {fmt} {n}x{k}")


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_negative_zero_and_subnormal_maxima_match_the_reference(fmt: str) -> None:
    rng = np.random.default_rng(12)
    k = 2 * (FORMATS[fmt].group_size or 0) + 3
    negzero = np.full((2, k), 0x80000000, dtype=np.uint32)
    negzero[1, ::2] = 0  # -0 and +0 mixed: still an all-zero group
    sub = rng.integers(0, 0x7FFFFF, (3, k), dtype=np.uint32)
    sub |= rng.integers(0, 2, (3, k), dtype=np.uint32) << np.uint32(31)
    w = _f32(rng.random(k))
    for case, x in (("-0", negzero), ("subnormal", sub)):
        want = _ref(x, "F32", fmt)
        if case == "-0":
            assert not np.asarray(want.scales).any() and not np.asarray(want.codes).any()
        _assert_same(want, _native(x, "F32", fmt), f"C {case}")
        _assert_same(want, _torch(x, "F32", fmt), f"torch {case}")
        _assert_same(_ref(x, "F32", fmt, w), _native(x, "F32", fmt, w), f"C IW {case}")


def _overflow_edge_rows(fmt: str, rng: np.random.Generator) -> np.ndarray:
    """Groups whose amax is the binary32 value below, at and above the amax where each
    candidate's scale first rounds to binary16 infinity (the 65520 boundary), both signs;
    the rows the canonical profile refuses are left out."""
    e = FORMATS[fmt]
    assert e.group_size is not None and e.qmin is not None and e.qmax is not None
    dens = [Fraction(-e.qmin)] + [Fraction(e.qmax * c, 32) for c in CANDIDATE_RATIOS]
    rows = []
    for d in dens:
        edge = np.float32(float(Fraction(65520) * d))
        for v in (np.nextafter(edge, np.float32(0)), edge, np.nextafter(edge, np.float32(np.inf))):
            for sign in (1, -1):
                row = (rng.standard_normal(e.group_size) * float(v) / 4).astype(np.float32)
                row[rng.integers(e.group_size)] = sign * v
                rows.append(row)
    kept = []
    for row in rows:
        words = _f32(row[None])
        with contextlib.suppress(EncodeError):
            _numpy(words, "F32", fmt)
            kept.append(words[0])
    return np.array(kept)


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_amax_at_the_binary16_overflow_edge_of_every_candidate(fmt: str) -> None:
    rng = np.random.default_rng(13)
    x = _overflow_edge_rows(fmt, rng)
    assert len(x) >= 12  # candidates 1..13 overflow inside the canonical range
    want = _ref(x, "F32", fmt)
    _assert_same(want, _native(x, "F32", fmt), "C")
    _assert_same(want, _torch(x, "F32", fmt), "torch")
    w = _f32(rng.random(x.shape[1]))
    _assert_same(_ref(x, "F32", fmt, w), _native(x, "F32", fmt, w), "C IW")


@native
def test_w8_codes_are_never_minus_128() -> None:
    """Every group's amax is a negative value: the candidates with D < 128 would reach -128
    without the clamp to qmin = -127."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((3000, 32)) * rng.choice([1e-30, 1.0, 1e4], (3000, 1))
    x[:, 0] = -np.abs(x).max(axis=1) * 1.0001
    words = _f32(x)
    w = _f32(rng.random(32))
    for name, got in (
        ("C", _native(words, "F32", "W8G32_F16S")),
        ("numpy", _numpy(words, "F32", "W8G32_F16S")),
        ("torch", _torch(words, "F32", "W8G32_F16S")),
        ("C IW", _native(words, "F32", "W8G32_F16S", w)),
    ):
        assert int(np.asarray(got.codes).min()) == -127, name


@native
def test_strided_and_unaligned_views_are_read_as_their_values() -> None:
    rng = np.random.default_rng(15)
    x = _f32(rng.standard_normal((6, 200)))
    view = x[::2, 3:170]
    _assert_same(_ref(np.ascontiguousarray(view), "F32", "Q4G64_F16S"),
                 _native(view, "F32", "Q4G64_F16S"), "F32 strided")  # fmt: skip
    bf = rng.integers(0, 0x4700, (4, 130), dtype=np.uint16)
    buf = np.zeros(bf.nbytes + 1, np.uint8)
    buf[1:] = bf.view(np.uint8).ravel()
    odd = np.frombuffer(buf.data, dtype=np.uint16, count=bf.size, offset=1).reshape(bf.shape)
    assert odd.ctypes.data % 2 == 1
    _assert_same(_ref(bf, "BF16", "Q5G64_F16S"), _native(odd, "BF16", "Q5G64_F16S"), "unaligned")
    _assert_same(_ref(np.ascontiguousarray(bf[:, 1:]), "BF16", "Q5G64_F16S"),
                 _native(bf[:, 1:], "BF16", "Q5G64_F16S"), "BF16 strided")  # fmt: skip


@native
def test_many_rows_of_one_column_match_numpy() -> None:
    """N = 2^17 rows of K = 1 (one partial group each): the numpy encoder is held to the
    reference elsewhere; here the C kernel's row loop and output offsets over a long block."""
    rng = np.random.default_rng(16)
    x = _f32(rng.standard_normal((1 << 17, 1)) * rng.choice([1e-38, 1.0, 1e4], (1 << 17, 1)))
    for fmt in ("Q4G64_F16S", "W8G32_F16S"):
        _assert_same(_numpy(x, "F32", fmt), _native(x, "F32", fmt), fmt)


@native
@pytest.mark.parametrize("word", [0x7F81, 0xFFC1, 0x7FFF, 0xFF80, 0x7F80])
def test_bf16_nan_payloads_and_infinities_are_refused_like_numpy(word: int) -> None:
    rng = np.random.default_rng(17)
    x = rng.integers(0, 0x4000, (3, 130), dtype=np.uint16)
    x[2, 97] = word
    with pytest.raises(EncodeError) as numpy_err:
        encode_grouped_words(x, "BF16", "Q4G64_F16S", tensor="t", profile=MSE_F16_SEARCH_V1)
    with pytest.raises(EncodeError) as c_err:
        _native(x, "BF16", "Q4G64_F16S", None)
    assert str(c_err.value) == str(numpy_err.value)
    assert "row 2" in str(c_err.value) and "97" in str(c_err.value)


# --- weights ------------------------------------------------------------------------------------


@pytest.mark.parametrize("word", [0x80000000, 0x80000001, 0x7F800000, 0x7FC00000])
def test_convert_refuses_a_negative_zero_or_nonfinite_weight_before_writing(
    tmp_path: Path, word: int
) -> None:
    """-0 is refused by the profile (one spelling per stored vector) even though the C kernel's
    own argument check accepts it as >= 0: the check must run before the kernel."""
    src, _ = _source(tmp_path)
    w = _weights().copy()
    w[150] = word
    imp = _importance(tmp_path, {"w": w})
    with pytest.raises(EncodeError, match="tensor w: importance weight of column 150"):
        convert_checkpoint(src, _recipe(tmp_path), tmp_path / "out", device="cpu", importance=imp)
    assert not (tmp_path / "out").exists()


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_subnormal_and_zero_weights_match_the_reference(fmt: str) -> None:
    rng = np.random.default_rng(19)
    k = 2 * (FORMATS[fmt].group_size or 0) + 7
    x = _f32(rng.standard_normal((2, k)))
    w = rng.integers(0, 0x800000, k, dtype=np.uint32)  # binary32 subnormals and +0
    w[::5] = 0
    want = _ref(x, "F32", fmt, w)
    _assert_same(want, _native(x, "F32", fmt, w), "C")
    _assert_same(want, _numpy(x, "F32", fmt, w), "numpy")


def _transform_recipe(tmp: Path, transforms: str) -> Path:
    from recipe_fixtures import RECIPE_HEAD

    p = tmp / "moved.yaml"
    p.write_text(
        RECIPE_HEAD + f"- match: w\n  format: Q4G64_F16S\n  encoder_profile: {MSE_F16_SEARCH_IW_V1}"
        f"\n  transforms: {transforms}\n  role: r\n  evidence: [e1]\n"
        "- match: v\n  format: BF16\n  role: r\n  evidence: [e1]\n"
    )
    return p


def test_a_reshaped_tensor_is_refused_for_the_weighted_profile(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    recipe = _transform_recipe(tmp_path, "[{reshape: [48, 100]}]")
    for k in (100, 200):
        imp = _importance(tmp_path, {"w": _weights(k=k)}, f"r{k}")
        with pytest.raises(RecipeError, match="reshape transform"):
            convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", importance=imp)
    assert not (tmp_path / "out").exists()


def test_extra_vectors_are_ignored_and_not_stored(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    extra = {"w": _weights(), "v": _weights(k=200), "other": _weights(k=3)}
    imp = _importance(tmp_path, extra)
    out = tmp_path / "out"
    convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
    assert set(load_importance(out / IMPORTANCE_FILE).vectors) == {"w"}
    assert verify_artifact(out, device="cpu").exit_code == 0


# --- edited artifacts -------------------------------------------------------------------------


def _findings(report: Any) -> list[Any]:
    return [f for c in report.checks for f in c.findings]


def test_a_tampered_side_file_fails_verify_naming_it(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    out = tmp_path / "out"
    imp = _importance(tmp_path, {"w": _weights()})
    convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
    for name, edit in (("tampered", b"\x01"), ("missing", None)):
        art = tmp_path / name
        shutil.copytree(out, art)
        if edit is None:
            os.unlink(art / IMPORTANCE_FILE)
        else:
            data = bytearray((art / IMPORTANCE_FILE).read_bytes())
            data[-1] ^= edit[0]
            (art / IMPORTANCE_FILE).write_bytes(bytes(data))
        report = verify_artifact(art, source=src, device="cpu")
        assert report.exit_code == 6, name
        texts = [f"{f.path} {f.message}" for f in _findings(report)]
        assert any(IMPORTANCE_FILE in t for t in texts), (name, texts)


def test_a_provenance_importance_digest_that_does_not_match_fails_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A self-consistent artifact (digests and side file intact) whose header records another
    vector's digest: only the provenance comparison can catch it."""
    import ninfer_convert.derive.provenance as provenance_mod

    src, _ = _source(tmp_path)
    imp = _importance(tmp_path, {"w": _weights()})
    out = tmp_path / "out"
    monkeypatch.setattr(provenance_mod, "vector_digest", lambda words: "0" * 32)
    convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
    monkeypatch.undo()
    report = verify_artifact(out, source=src, device="cpu")
    assert report.exit_code == 6
    messages = [f.message for f in _findings(report)]
    assert any("importance digest " + "0" * 32 in m for m in messages), messages


# --- ninfer calibrate: failures before the model runs, typed errors, nothing left -----------


def _no_model(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the model was loaded before the output was checked")


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", ["exists", "suffix", "no-parent", "parent-is-file", "partial"])
def test_calibrate_checks_its_output_before_loading_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    import ninfer_convert.calibrate as calibrate_mod

    monkeypatch.setattr(calibrate_mod, "load_source_model", _no_model)
    src = tmp_path / "model"
    src.mkdir()
    out = tmp_path / "imp.safetensors"
    if case == "exists":
        out.write_bytes(b"mine")
    elif case == "suffix":
        out = tmp_path / "imp.bin"
    elif case == "no-parent":
        out = tmp_path / "nowhere" / "imp.safetensors"
    elif case == "parent-is-file":
        (tmp_path / "file").write_bytes(b"x")
        out = tmp_path / "file" / "imp.safetensors"
    else:
        (tmp_path / "imp.safetensors.partial").write_bytes(b"left by a killed run")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, stderr = _run(["calibrate", str(src), "--output", str(out)])
    assert code == 2, stderr
    assert stdout == "" and stderr.startswith("error: ") and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if case == "exists":
        assert out.read_bytes() == b"mine"
    if case == "partial":
        assert "imp.safetensors.partial" in stderr
        assert (tmp_path / "imp.safetensors.partial").read_bytes() == b"left by a killed run"


def test_importance_file_writer_refuses_a_missing_directory_with_a_usage_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsageError) as exc:
        write_importance_file(tmp_path / "no" / "imp.safetensors", {"w": _weights()})
    assert exc.value.path is not None and "no" in exc.value.path
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("stage", "code"),
    [("fsync", errno.ENOSPC), ("link", errno.EACCES), ("fsync", errno.EROFS)],
)
def test_a_failed_importance_write_is_a_resource_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str, code: int
) -> None:
    def refuse(*_args: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(importance_mod.os, stage, refuse)
    target = tmp_path / "imp.safetensors"
    with pytest.raises(ResourceError) as exc:
        write_importance_file(target, {"w": _weights()})
    assert exc.value.exit_code == 7 and exc.value.path is not None
    assert list(tmp_path.iterdir()) == []


# --- --json error objects of the new options --------------------------------------------------


def test_convert_json_error_for_a_bad_importance_file_is_one_object(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    code, stdout, stderr = _run(
        ["convert", str(src), "--recipe", str(_recipe(tmp_path)), "--output",
         str(tmp_path / "out"), "--importance", str(bad), "--json"]
    )  # fmt: skip
    assert "Traceback" not in stderr
    obj = json.loads(stdout)
    assert obj["kind"] == "ninfer-error" and obj["error"]["exit_code"] == code
    assert code in (2, 3, 4)
    assert not (tmp_path / "out").exists()


# --- exit codes and --json error objects of every command ---------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_the_exit_code_table_is_the_error_classes() -> None:
    """docs/cli.md 'Exit codes': each row's classes have exactly that exit_code, and every
    class with its own code (SchemaError never escapes: exit 1, documented as a kind) is in it."""
    import re

    from ninfer_convert import errors

    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Exit codes") : text.index("## ", text.index("## Exit codes") + 3)]
    seen: dict[str, int] = {}
    for line in table.splitlines():
        m = re.match(r"^\| (\d+) \| (.+?) \|", line)
        if m:
            for cls in re.findall(r"`(\w+Error)`", m.group(2)):
                seen[cls] = int(m.group(1))
    classes = {
        name: obj
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, errors.NinferError)
    }
    assert set(seen) == set(classes) - {"SchemaError"}
    for name, code in seen.items():
        assert classes[name].exit_code == code, name
    assert errors.SchemaError.exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["convert", "/nonexistent/src", "--output", "/nonexistent/out"],
        ["verify", "/nonexistent"],
        ["inspect", "/nonexistent"],
        ["eval", "/nonexistent"],
        ["sign", "/nonexistent"],
        ["formats", "NO_SUCH_FORMAT"],
        ["recipes", "--no-such-option"],
    ],
)
def test_every_json_command_prints_one_well_formed_error_object(args: list[str]) -> None:
    code, stdout, stderr = _run([*args, "--json"])
    assert code not in (0, 1) and "Traceback" not in stderr
    obj = json.loads(stdout)  # exactly one JSON document, nothing else on stdout
    assert set(obj) == {"schema_version", "kind", "error"}
    assert (obj["schema_version"], obj["kind"]) == (1, "ninfer-error")
    err = obj["error"]
    assert set(err) == {"error", "kind", "exit_code", "message", "path", "tensor", "rule",
                        "where", "hint"}  # fmt: skip
    assert err["exit_code"] == code and err["message"]
    from ninfer_convert.errors import KINDS

    assert err["kind"] in KINDS


@pytest.mark.parametrize("case", ["missing", "directory"])
def test_a_missing_importance_path_is_a_usage_error_about_the_importance_file(
    tmp_path: Path, case: str
) -> None:
    """Not the source reader's 'pass a model directory ... or a cached org/name' (exit 4)."""
    src, _ = _source(tmp_path)
    imp = tmp_path / "imp.safetensors"
    if case == "directory":
        imp.mkdir()
        write_importance_file(imp / "model.safetensors", {"w": _weights()})
    code, _stdout, stderr = _run(
        ["convert", str(src), "--recipe", str(_recipe(tmp_path)), "--output",
         str(tmp_path / "out"), "--importance", str(imp)]
    )  # fmt: skip
    assert code == 2, stderr
    assert stderr.startswith(f"error: {imp}: ") and "importance file" in stderr
    assert "org/name" not in stderr and "Traceback" not in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", GROUPED)
def test_torch_cuda_matches_the_reference_at_the_edges(fmt: str) -> None:
    """The overflow edge of every candidate, subnormal maxima and -0 groups on the GPU (the
    CUDA division path differs from the CPU one; see docs/encoder-profiles.md)."""
    rng = np.random.default_rng(20)
    k = 2 * (FORMATS[fmt].group_size or 0) + 3
    sub = rng.integers(0, 0x7FFFFF, (3, k), dtype=np.uint32)
    edge = _overflow_edge_rows(fmt, rng)
    for x in (edge, sub, np.full((2, k), 0x80000000, dtype=np.uint32)):
        got = encode_grouped_words(
            x, "F32", fmt, backend="torch", device="cuda", profile=MSE_F16_SEARCH_V1
        )
        _assert_same(_ref(x, "F32", fmt), got, f"cuda {fmt}")


@native
@pytest.mark.parametrize("word", [0x7C01, 0xFE00, 0x7FFF, 0x7C00, 0xFC00])
def test_f16_nan_payloads_and_infinities_are_refused_like_numpy(word: int) -> None:
    rng = np.random.default_rng(21)
    x = rng.integers(0, 0x7800, (2, 70), dtype=np.uint16)
    x[1, 65] = word
    with pytest.raises(EncodeError) as numpy_err:
        encode_grouped_words(x, "F16", "W8G32_F16S", tensor="t", profile=MSE_F16_SEARCH_V1)
    with pytest.raises(EncodeError) as c_err:
        _native(x, "F16", "W8G32_F16S")
    assert str(c_err.value) == str(numpy_err.value)


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_every_finite_binary16_word_encodes_alike_in_c_and_numpy(fmt: str) -> None:
    """All 63,488 finite binary16 words, shuffled into groups (the numpy encoder is held to the
    exact reference by its own tests), unweighted and weighted."""
    rng = np.random.default_rng(22)
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    words = rng.permutation(words[(words & 0x7C00) != 0x7C00])
    x = words.reshape(-1, 496)  # 128 rows; 496 = 7.75 groups of 64, 15.5 of 32
    w = _f32(rng.random(496))
    _assert_same(_numpy(x, "F16", fmt), _native(x, "F16", fmt), "unweighted")
    _assert_same(_numpy(x, "F16", fmt, w), _native(x, "F16", fmt, w), "weighted")


def test_without_the_source_verify_still_ties_provenance_to_the_side_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """container.md: each provenance.importance is the digest of the side file's entry of that
    tensor.  That needs no source, so --no-source must catch a header that records another
    vector (digests recomputed: only this relation is broken)."""
    import ninfer_convert.derive.provenance as provenance_mod

    src, _ = _source(tmp_path)
    imp = _importance(tmp_path, {"w": _weights()})
    out = tmp_path / "out"
    monkeypatch.setattr(provenance_mod, "vector_digest", lambda words: "0" * 32)
    convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
    monkeypatch.undo()
    report = verify_artifact(out, use_recorded_source=False, device="cpu")
    assert report.exit_code == 6
    hits = [f for f in _findings(report) if f.check == "integrity"]
    assert hits and hits[0].tensor == "w" and IMPORTANCE_FILE in (hits[0].path or "")
    assert "0" * 32 in hits[0].message
    # The finding names the tensor itself: the message does not repeat it (the message of
    # a9dcfac, unchanged when the factors became lazy).
    assert hits[0].message.startswith("provenance.importance is "), hits[0].message
