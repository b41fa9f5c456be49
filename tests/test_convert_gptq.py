"""GPTQ_F16_SEARCH_IW_V1 end to end: convert with an importance file and a factor file, both
stored in the artifact (side files + provenance digests), verify re-deriving every tensor from
them (source-words) and re-encoding sampled rows with the exact reference (oracle-sample),
inspect, the refusals of missing and hostile factors, --jobs, and the identity factor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert import encode_grouped_words, open_artifact
from ninfer_convert.calibrate import compensation_factor
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import EncodeError, RecipeError, UsageError
from ninfer_convert.factors import (
    FACTOR_FILE,
    factor_bytes,
    factor_digest,
    factors_from_artifact,
    write_factor_file,
)
from ninfer_convert.formats import GPTQ_F16_SEARCH_IW_V1, MSE_F16_SEARCH_IW_V1
from ninfer_convert.importance import IMPORTANCE_FILE, write_importance_file
from ninfer_convert.inspect import inspect_artifact
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.verify import verify_artifact

GPTQ = GPTQ_F16_SEARCH_IW_V1
K = 200
N = 40


def _source(tmp: Path) -> tuple[Path, np.ndarray]:
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((N, K)).astype(np.float32)
    words = (w.view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(
        src / "model.safetensors", {"w": ("BF16", words), "v": ("BF16", words[:8].copy())}
    )
    (src / "config.json").write_text('{"model_type": "llama"}')
    return src, words


def _recipe(tmp: Path, profile: str = GPTQ) -> Path:
    recipe = tmp / f"{profile}.yaml"
    recipe.write_text(
        RECIPE_HEAD + f"- match: w\n  format: Q4G64_F16S\n  encoder_profile: {profile}\n"
        "  role: r\n  evidence: [e1]\n- match: v\n  format: BF16\n  role: r\n"
        "  evidence: [e1]\n"
    )
    return recipe


def _weights(seed: int = 9, k: int = K) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(0, 1, k).astype(np.float32).view(np.uint32)


def _factor(block: int, seed: int = 3, k: int = K) -> np.ndarray:
    """A calibration-like factor: H = X^T X / n of correlated activations, through
    calibrate's own factor computation."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((300, k)) @ (np.eye(k) + 0.3 * rng.standard_normal((k, k)) / 8)
    h = x.T @ x / x.shape[0]
    nb = -(-k // block)
    blocks = np.zeros((nb, block, block))
    for b in range(nb):
        b0, b1 = b * block, min(k, (b + 1) * block)
        blocks[b, : b1 - b0, : b1 - b0] = h[b0:b1, b0:b1]
    return compensation_factor(blocks, k, block)


def _files(tmp: Path, imp: np.ndarray, fac: np.ndarray, tag: str = "") -> tuple[Path, Path]:
    ip, fp = tmp / f"imp{tag}.safetensors", tmp / f"fac{tag}.safetensors"
    write_importance_file(ip, {"w": imp})
    write_factor_file(fp, {"w": fac})
    return ip, fp


def _convert(tmp: Path, name: str, imp: Path, fac: Path, jobs: int = 2) -> Path:
    src, _ = _source(tmp)
    out = tmp / name
    convert_checkpoint(src, _recipe(tmp), out, device="cpu", jobs=jobs, importance=imp, factors=fac)
    return out


@pytest.mark.parametrize("block", [128, 256])
def test_convert_stores_the_factor_and_verify_rederives_from_it(tmp_path: Path, block: int) -> None:
    _, words = _source(tmp_path)
    imp, fac = _weights(), _factor(block)
    ip, fp = _files(tmp_path, imp, fac)
    out = _convert(tmp_path, "out", ip, fp)
    ref = encode_grouped_words(words, "BF16", "Q4G64_F16S", backend="oracle", profile=GPTQ,
                               importance=imp, factor=fac)  # fmt: skip
    with open_artifact(out) as art:
        got = art.read("w")
        prov = art.tensors["w"].provenance
        assert prov["encoder_profile"] == GPTQ
        assert prov["factor"] == factor_digest(fac)
        assert prov["factor_block"] == block
        assert "factor" not in art.tensors["v"].provenance
        assert FACTOR_FILE in art.side_files and IMPORTANCE_FILE in art.side_files
    assert isinstance(got, GroupedCodes)
    assert got.codes.tobytes() == ref.codes.tobytes()
    assert got.scales.tobytes() == ref.scales.tobytes()
    assert (out / FACTOR_FILE).read_bytes() == factor_bytes({"w": fac})
    report = verify_artifact(out, device="cpu", oracle_groups=8)
    assert report.exit_code == 0, report
    assert report.check("oracle-sample").tensors == 1
    rows = inspect_artifact(out).to_json()
    shown = {t["name"]: t for t in rows["tensors"]}
    assert shown["w"]["factor"] == factor_digest(fac)
    assert shown["w"]["factor_block"] == block


def _stored_planes(out: Path) -> bytes:
    return (out / "model.ninfer").read_bytes()


def test_jobs_one_and_two_write_the_same_bytes(tmp_path: Path) -> None:
    # 2700 rows of K = 200 are two row blocks of the fused host path, so two workers split them.
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(11)
    w = rng.standard_normal((2700, K)).astype(np.float32)
    write_safetensors(src / "model.safetensors",
                      {"w": ("BF16", (w.view(np.uint32) >> 16).astype(np.uint16)),
                       "v": ("BF16", np.zeros((2, 2), np.uint16))})  # fmt: skip
    (src / "config.json").write_text('{"model_type": "llama"}')
    ip, fp = _files(tmp_path, _weights(), _factor(128))
    outs = []
    for jobs in (1, 2):
        out = tmp_path / f"out{jobs}"
        convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=jobs,
                           importance=ip, factors=fp)  # fmt: skip
        outs.append(out)
    assert _stored_planes(outs[0]) == _stored_planes(outs[1])
    # The planned size counts both generated side files exactly.
    from ninfer_convert.convert import plan_conversion, planned_output_bytes

    opened, plan = plan_conversion(src, _recipe(tmp_path), importance=ip, factors=fp)
    planned = planned_output_bytes(plan, opened, alignment=4096, max_shard_size=None)
    written = sum(p.stat().st_size for p in outs[0].rglob("*") if p.is_file())
    assert planned == written
    assert (outs[0] / FACTOR_FILE).read_bytes() == (outs[1] / FACTOR_FILE).read_bytes()


def test_the_identity_factor_gives_the_importance_weighted_search(tmp_path: Path) -> None:
    imp = _weights()
    ident = np.zeros((K, 256), np.float32)
    ident[np.arange(K), np.arange(K)] = 1.0
    ip, fp = _files(tmp_path, imp, ident.view(np.uint32))
    out = _convert(tmp_path, "gptq", ip, fp)
    src, _ = _source(tmp_path)
    iw = tmp_path / "iw"
    convert_checkpoint(src, _recipe(tmp_path, MSE_F16_SEARCH_IW_V1), iw, device="cpu",
                       importance=ip)  # fmt: skip
    with open_artifact(out) as a, open_artifact(iw) as b:
        ga, gb = a.read("w"), b.read("w")
        assert isinstance(ga, GroupedCodes) and isinstance(gb, GroupedCodes)
        assert ga.codes.tobytes() == gb.codes.tobytes()
        assert ga.scales.tobytes() == gb.scales.tobytes()


def test_a_real_factor_changes_the_words(tmp_path: Path) -> None:
    imp = _weights()
    ident = np.zeros((K, 256), np.float32)
    ident[np.arange(K), np.arange(K)] = 1.0
    a = _convert(tmp_path, "a", *_files(tmp_path, imp, ident.view(np.uint32), "a"))
    b = _convert(tmp_path, "b", *_files(tmp_path, imp, _factor(256), "b"))
    with open_artifact(a) as x, open_artifact(b) as y:
        gx, gy = x.read("w"), y.read("w")
        assert isinstance(gx, GroupedCodes) and isinstance(gy, GroupedCodes)
        assert gx.codes.tobytes() != gy.codes.tobytes()


def test_verify_names_the_tensor_of_an_edited_factor(tmp_path: Path) -> None:
    fac = _factor(128)
    out = _convert(tmp_path, "out", *_files(tmp_path, _weights(), fac))
    data = bytearray((out / FACTOR_FILE).read_bytes())
    data[-4 * 128 - 4 : -4 * 128] = np.float32(3.0).tobytes()  # an upper entry of row K-2
    (out / FACTOR_FILE).write_bytes(bytes(data))
    report = verify_artifact(out, device="cpu")
    assert report.exit_code != 0
    words = [f for f in report.findings if f.check == "source-words"]
    assert words and words[0].tensor == "w", report.findings


def test_verify_catches_a_consistent_factor_swap(tmp_path: Path) -> None:
    """A side file replaced by another valid factor file with its digest recorded (the
    metadata edited too) is caught by the tensor's provenance.factor, naming the tensor."""
    import json

    out = _convert(tmp_path, "out", *_files(tmp_path, _weights(), _factor(128)))
    other = factor_bytes({"w": _factor(128, seed=4)})
    (out / FACTOR_FILE).write_bytes(other)
    from ninfer_convert.verify.artifact_checks import importance_findings

    with open_artifact(out) as art:
        # Only the tensor-level rule is under test here: feed it the swapped side file.
        import ninfer_convert.verify.artifact_checks as checks

        original = checks.stored_factor_set
        try:
            checks.stored_factor_set = lambda _a: factors_from_artifact(other, "x")
            found = importance_findings(art)
        finally:
            checks.stored_factor_set = original
    assert [f.tensor for f in found] == ["w"], found
    assert "provenance.factor" in found[0].message
    del json


def test_refusals_of_missing_factors(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    recipe = _recipe(tmp_path)
    ip, fp = _files(tmp_path, _weights(), _factor(128))
    with pytest.raises(UsageError, match="no factor file"):
        convert_checkpoint(src, recipe, tmp_path / "a", device="cpu", importance=ip)
    with pytest.raises(UsageError, match="no importance file"):
        convert_checkpoint(src, recipe, tmp_path / "a", device="cpu", factors=fp)
    other = tmp_path / "other.safetensors"
    write_factor_file(other, {"x": _factor(128)})
    with pytest.raises(RecipeError, match="no factor named 'w'") as exc:
        convert_checkpoint(src, recipe, tmp_path / "a", device="cpu", importance=ip,
                           factors=other)  # fmt: skip
    assert exc.value.tensor is None or exc.value.tensor == "w"
    # The recipe location is context (``where``), not a normative rule: no "rule rule 1".
    assert exc.value.where is not None and "recipe rule 1" in exc.value.where
    assert "rule rule" not in str(exc.value)
    assert exc.value.path == str(other)
    assert "ninfer calibrate" in (exc.value.hint or "")
    iw = _recipe(tmp_path, MSE_F16_SEARCH_IW_V1)
    with pytest.raises(UsageError, match="no recipe rule selects a compensated"):
        convert_checkpoint(src, iw, tmp_path / "a", device="cpu", importance=ip, factors=fp)
    assert not (tmp_path / "a").exists()


def _bad(tmp: Path, name: str, fac: np.ndarray) -> Path:
    p = tmp / f"{name}.safetensors"
    write_factor_file(p, {"w": fac})
    return p


def test_hostile_factor_files_are_refused_naming_file_tensor_and_rule(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    recipe = _recipe(tmp_path)
    ip = tmp_path / "imp.safetensors"
    write_importance_file(ip, {"w": _weights()})
    good = _factor(128)
    nan = good.copy()
    nan[5, 40] = 0x7FC00000
    below = good.copy()
    below[5, 2] = np.float32(1.0).view(np.uint32)
    zero_diag = good.copy()
    zero_diag[7, 7] = 0
    cases = {
        "nan": (nan, "is not finite"),
        "below": (below, "must be \\+0"),
        "diag": (zero_diag, "must be > \\+0"),
        "wrongk": (_factor(128, k=K - 1), "K = 200"),
    }
    for name, (fac, why) in cases.items():
        p = _bad(tmp_path, name, fac)
        with pytest.raises(EncodeError, match=why) as exc:
            convert_checkpoint(src, recipe, tmp_path / "a", device="cpu", importance=ip,
                               factors=p)  # fmt: skip
        assert exc.value.tensor == "w" and exc.value.path == str(p), name
        assert exc.value.where is not None and "recipe rule 1" in exc.value.where
        assert "ninfer calibrate" in (exc.value.hint or "")
    # Not [K, B] with B a multiple of 128, or not F32: refused when the file is opened.
    narrow = tmp_path / "narrow.safetensors"
    write_safetensors(narrow, {"w": ("F32", np.zeros((K, 100), np.uint32))})
    vector = tmp_path / "vector.safetensors"
    write_safetensors(vector, {"w": ("F32", np.zeros(K, np.uint32))})
    for p in (narrow, vector):
        with pytest.raises(UsageError, match="two-dimensional F32") as uexc:
            convert_checkpoint(src, recipe, tmp_path / "a", device="cpu", importance=ip,
                               factors=p)  # fmt: skip
        assert uexc.value.path == str(p)
    assert not (tmp_path / "a").exists()


def test_a_refused_row_is_counted_from_the_tensor_start() -> None:
    from ninfer_convert.encoder.dispatch import encode_block as encode_rows
    from ninfer_convert.formats import FORMATS

    fmt = FORMATS["Q4G64_F16S"]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, K)).astype(np.float32)
    x[4, 150] = np.inf
    codes = np.empty((6, K), np.int8)
    scales = np.empty((6, 4), np.uint16)
    with pytest.raises(EncodeError, match="row 104, column 128: the scale search refuses"):
        encode_rows(x.view(np.uint32), "F32", fmt, 100, codes, scales, "t",
                    profile=GPTQ, importance=_weights(), factor=_factor(128))  # fmt: skip
    with pytest.raises(ValueError, match="needs the tensor's importance vector and factor"):
        encode_rows(x.view(np.uint32), "F32", fmt, 0, codes, scales, "t", profile=GPTQ)
    with pytest.raises(ValueError, match="takes no compensation factor"):
        encode_rows(x.view(np.uint32), "F32", fmt, 0, codes, scales, "t",
                    profile=MSE_F16_SEARCH_IW_V1, importance=_weights(),
                    factor=_factor(128))  # fmt: skip


def test_library_backends_agree_and_refuse_what_they_cannot_do() -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, K)).astype(np.float32).view(np.uint32)
    imp, fac = _weights(), _factor(128)
    a = encode_grouped_words(x, "F32", "W8G32_F16S", profile=GPTQ, importance=imp, factor=fac)
    b = encode_grouped_words(x, "F32", "W8G32_F16S", backend="oracle", profile=GPTQ,
                             importance=imp, factor=fac)  # fmt: skip
    assert a.codes.tobytes() == b.codes.tobytes() and a.scales.tobytes() == b.scales.tobytes()
    with pytest.raises(UsageError, match="needs a compensation factor"):
        encode_grouped_words(x, "F32", "Q4G64_F16S", profile=GPTQ, importance=imp)
    with pytest.raises(UsageError, match="takes no compensation factor"):
        encode_grouped_words(x, "F32", "Q4G64_F16S", factor=fac)
    with pytest.raises(UsageError, match="no 'torch' backend"):
        encode_grouped_words(x, "F32", "Q4G64_F16S", backend="torch", profile=GPTQ,
                             importance=imp, factor=fac)  # fmt: skip


def test_oracle_sample_rows_finds_a_changed_code_and_a_changed_scale() -> None:
    from ninfer_convert.formats import FORMATS
    from ninfer_convert.verify.compare import oracle_sample_rows

    fmt = FORMATS["Q4G64_F16S"]
    rng = np.random.default_rng(6)
    x = rng.standard_normal((30, K)).astype(np.float32).view(np.uint32)
    imp, fac = _weights(), _factor(128)
    good = encode_grouped_words(x, "F32", fmt, profile=GPTQ, importance=imp, factor=fac)
    checked, found = oracle_sample_rows(fmt, "t", x, "F32", good, 8, 0, imp, fac)
    assert checked == 2 * 4 and found == []  # 8 groups at 4 per row: two whole rows
    last = K - 1  # the last row is always sampled, its last column is in the partial group
    codes = good.codes.copy()
    codes[29, last] = codes[29, last] + (1 if codes[29, last] < 7 else -1)
    scales = good.scales.copy()
    scales[29, 0] ^= 1
    _, found = oracle_sample_rows(fmt, "t", x, "F32", GroupedCodes(codes, scales), 8, 0, imp, fac)
    assert {(m.plane, m.row, m.group) for m in found} == {("codes", 29, 3), ("scales", 29, 0)}


def test_the_dispatch_goes_through_gptqs_kernel_dispatcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ninfer_convert.encoder import gptq
    from ninfer_convert.encoder.dispatch import encode_block
    from ninfer_convert.formats import FORMATS

    seen: list[str] = []
    real = gptq.encode_compensated

    def spy(*args: Any, kernel: str, **kwargs: Any) -> GroupedCodes:
        seen.append(kernel)
        return real(*args, kernel=kernel, **kwargs)

    monkeypatch.setattr(gptq, "encode_compensated", spy)
    fmt = FORMATS["Q4G64_F16S"]
    x = np.random.default_rng(3).standard_normal((4, K)).astype(np.float32).view(np.uint32)
    codes, scales = np.empty((4, K), np.int8), np.empty((4, 4), np.uint16)
    for kernel in ("native", "numpy"):
        encode_block(x, "F32", fmt, 0, codes, scales, "t", kernel, profile=GPTQ,
                     importance=_weights(), factor=_factor(128))  # fmt: skip
    assert seen == ["native", "numpy"]
    ref = encode_grouped_words(x, "F32", fmt, backend="oracle", profile=GPTQ,
                               importance=_weights(), factor=_factor(128))  # fmt: skip
    assert codes.tobytes() == ref.codes.tobytes() and scales.tobytes() == ref.scales.tobytes()


def test_a_factor_wider_than_its_row_rounded_up_is_refused(tmp_path: Path) -> None:
    """B above K rounded up to 128 is the same single block with only +0 columns added: one
    factor, one spelling, and a bound on what a factor file can make convert read."""
    src, _ = _source(tmp_path)
    ip = tmp_path / "imp.safetensors"
    write_importance_file(ip, {"w": _weights()})
    wide = np.zeros((K, 384), np.uint32)
    wide[:, :256] = _factor(256)
    p = _bad(tmp_path, "wide", wide)
    with pytest.raises(EncodeError, match="at most 256") as exc:
        convert_checkpoint(src, _recipe(tmp_path), tmp_path / "a", device="cpu",
                           importance=ip, factors=p)  # fmt: skip
    assert exc.value.tensor == "w" and exc.value.path == str(p)
    assert not (tmp_path / "a").exists()


def test_a_factor_of_the_wrong_shape_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The declared shape is checked against the tensor's K before a byte of the entry is
    read: a hostile (sparse) file cannot make convert allocate its huge entry."""
    import json
    import struct

    from ninfer_convert.factors import FactorFile

    src, _ = _source(tmp_path)
    ip = tmp_path / "imp.safetensors"
    write_importance_file(ip, {"w": _weights()})
    reads: list[str] = []
    original = FactorFile.__getitem__

    def spy(self: FactorFile, name: str) -> np.ndarray:
        reads.append(name)
        return original(self, name)

    monkeypatch.setattr(FactorFile, "__getitem__", spy)
    for shape in ([1 << 18, 128], [K, 128 << 10]):  # 128 MiB each, never written (sparse)
        n = 4 * shape[0] * shape[1]
        head = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, n]}})
        raw = head.encode() + b" " * (-len(head) % 8)
        p = tmp_path / f"sparse{shape[0]}.safetensors"
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + n)
        with pytest.raises(EncodeError, match="K = 200") as exc:
            convert_checkpoint(src, _recipe(tmp_path), tmp_path / "a", device="cpu",
                               importance=ip, factors=p)  # fmt: skip
        assert exc.value.tensor == "w" and exc.value.path == str(p)
        assert reads == [], shape
        p.unlink()


def test_a_refused_row_of_a_later_block_is_named_without_re_encoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The row of a refusal in a block that starts at tensor row row0 comes from the encoder
    itself (one encode), not from re-encoding prefixes and re-running the exact reference on
    the row (193 s for a [1024, 4096] block with B = 4096)."""
    from ninfer_convert.encoder import gptq_reference
    from ninfer_convert.encoder.dispatch import encode_block
    from ninfer_convert.formats import FORMATS

    def no_reference(*_a: object, **_k: object) -> None:
        raise AssertionError("the exact reference ran on the error path")

    monkeypatch.setattr(gptq_reference, "encode_compensated_reference", no_reference)
    fmt = FORMATS["Q4G64_F16S"]
    x = np.random.default_rng(2).standard_normal((6, K)).astype(np.float32)
    x[4, 150] = np.inf
    x[5, 3] = np.nan  # a later row: the first refused row is named
    codes, scales = np.empty((6, K), np.int8), np.empty((6, 4), np.uint16)
    with pytest.raises(EncodeError, match="row 104, column 128: the scale search refuses") as exc:
        encode_block(x.view(np.uint32), "F32", fmt, 100, codes, scales, "t", profile=GPTQ,
                     importance=_weights(), factor=_factor(128))  # fmt: skip
    assert MSE_F16_SEARCH_IW_V1 in (exc.value.hint or "")


def test_the_dispatch_does_not_recheck_the_attached_factor_for_every_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The plan's factor and vector were checked once when attached; per block that check
    # cost about a sixth of the encode ([K, B] = [5120, 128], blocks of 2^19 values).
    from ninfer_convert.encoder import gptq
    from ninfer_convert.encoder.dispatch import encode_block
    from ninfer_convert.formats import FORMATS

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the factor was checked again in the row-block dispatch")

    monkeypatch.setattr(gptq, "check_factor", refuse)
    fmt = FORMATS["Q4G64_F16S"]
    x = np.random.default_rng(5).standard_normal((4, K)).astype(np.float32).view(np.uint32)
    codes, scales = np.empty((4, K), np.int8), np.empty((4, 4), np.uint16)
    encode_block(x, "F32", fmt, 0, codes, scales, "t", profile=GPTQ, importance=_weights(),
                 factor=_factor(128))  # fmt: skip
    monkeypatch.undo()
    ref = gptq.encode_compensated(x, "F32", fmt, _factor(128), weights=_weights())
    assert codes.tobytes() == ref.codes.tobytes() and scales.tobytes() == ref.scales.tobytes()
