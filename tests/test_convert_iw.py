"""MSE_F16_SEARCH_IW_V1 end to end: convert with an importance file, the vectors stored in the
artifact (side file + provenance digest), verify re-deriving from them, inspect, the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert import encode_grouped_words, open_artifact
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import EncodeError, RecipeError, UsageError
from ninfer_convert.formats import MSE_F16_SEARCH_IW_V1
from ninfer_convert.importance import (
    IMPORTANCE_FILE,
    importance_bytes,
    load_importance,
    vector_digest,
    write_importance_file,
)
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.verify import verify_artifact

IW = MSE_F16_SEARCH_IW_V1
K = 200


def _source(tmp: Path) -> tuple[Path, np.ndarray]:
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((24, K)).astype(np.float32)
    words = (w.view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(
        src / "model.safetensors", {"w": ("BF16", words), "v": ("BF16", words[:8].copy())}
    )
    (src / "config.json").write_text('{"model_type": "llama"}')
    return src, words


def _recipe(tmp: Path, extra: str = "") -> Path:
    recipe = tmp / "iw.yaml"
    recipe.write_text(
        RECIPE_HEAD + f"- match: w\n  format: Q4G64_F16S\n  encoder_profile: {IW}\n"
        "  role: r\n  evidence: [e1]\n" + extra + "- match: v\n  format: BF16\n  role: r\n"
        "  evidence: [e1]\n"
    )
    return recipe


def _weights(seed: int = 9, k: int = K) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(0, 2, k).astype(np.float32).view(np.uint32)


def _importance(tmp: Path, vectors: dict[str, np.ndarray], name: str = "imp") -> Path:
    p = tmp / f"{name}.safetensors"
    write_importance_file(p, vectors)
    return p


def test_convert_stores_the_vector_and_verify_rederives_from_it(tmp_path: Path) -> None:
    src, words = _source(tmp_path)
    w = _weights()
    imp = _importance(tmp_path, {"w": w, "unused": _weights(1, 7)})
    out = tmp_path / "out"
    convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=2, importance=imp)
    ref = encode_grouped_words(words, "BF16", "Q4G64_F16S", backend="oracle", profile=IW,
                               importance=w)  # fmt: skip
    with open_artifact(out) as art:
        got = art.read("w")
        prov = art.tensors["w"].provenance
        assert prov["encoder_profile"] == IW
        assert prov["importance"] == vector_digest(w)
        assert "importance" not in art.tensors["v"].provenance
        assert IMPORTANCE_FILE in art.side_files
    assert isinstance(got, GroupedCodes)
    assert got.codes.tobytes() == ref.codes.tobytes()
    assert got.scales.tobytes() == ref.scales.tobytes()
    # Only the vectors used are stored, under the tensor's name, byte for byte.
    stored = (out / IMPORTANCE_FILE).read_bytes()
    assert stored == importance_bytes({"w": w})
    report = verify_artifact(out, device="cpu", oracle_groups=8)
    assert report.exit_code == 0, report
    assert report.check("oracle-sample").tensors == 1


def test_verify_catches_an_edited_importance_vector(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    imp = _importance(tmp_path, {"w": _weights()})
    out = tmp_path / "out"
    convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
    data = bytearray((out / IMPORTANCE_FILE).read_bytes())
    data[-4:] = np.float32(1e6).tobytes()  # the last weight: the side file digest now differs
    (out / IMPORTANCE_FILE).write_bytes(bytes(data))
    assert verify_artifact(out, device="cpu").exit_code != 0


def test_the_weights_change_the_words(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    outs = []
    for seed in (1, 2):
        imp = _importance(tmp_path, {"w": _weights(seed)}, f"imp{seed}")
        out = tmp_path / f"out{seed}"
        convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
        with open_artifact(out) as art:
            got = art.read("w")
            assert isinstance(got, GroupedCodes)
            outs.append(got.scales.tobytes())
    assert outs[0] != outs[1]


def test_refusals(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    recipe = _recipe(tmp_path)
    with pytest.raises(UsageError, match="no importance file"):
        convert_checkpoint(src, recipe, tmp_path / "a", device="cpu")
    with pytest.raises(RecipeError, match="no vector named 'w'"):
        convert_checkpoint(src, recipe, tmp_path / "b", device="cpu",
                           importance=_importance(tmp_path, {"x": _weights()}, "x"))  # fmt: skip
    with pytest.raises(EncodeError, match="199 weights but the matrix has K = 200"):
        convert_checkpoint(
            src,
            recipe,
            tmp_path / "c",
            device="cpu",
            importance=_importance(tmp_path, {"w": _weights(k=199)}, "s"),
        )
    bad = _weights().copy()
    bad[77] = 0xFFC00000
    with pytest.raises(EncodeError, match="tensor w: importance weight of column 77"):
        convert_checkpoint(src, recipe, tmp_path / "d", device="cpu",
                           importance=_importance(tmp_path, {"w": bad}, "bad"))  # fmt: skip
    moved = tmp_path / "t.yaml"
    moved.write_text(
        RECIPE_HEAD + f"- match: w\n  format: Q4G64_F16S\n  encoder_profile: {IW}\n"
        "  transforms: [transpose]\n  role: r\n  evidence: [e1]\n"
        "- match: v\n  format: BF16\n  role: r\n  evidence: [e1]\n"
    )
    with pytest.raises(RecipeError, match="transpose transform"):
        convert_checkpoint(
            src,
            moved,
            tmp_path / "e",
            device="cpu",
            importance=_importance(tmp_path, {"w": _weights(k=24)}, "t"),
        )
    plain = tmp_path / "plain.yaml"
    plain.write_text(
        RECIPE_HEAD + "- match: 're:.*'\n  format: BF16\n  role: r\n  evidence: [e1]\n"
    )
    with pytest.raises(UsageError, match="no recipe rule selects"):
        convert_checkpoint(src, plain, tmp_path / "f", device="cpu",
                           importance=_importance(tmp_path, {"w": _weights()}, "p"))  # fmt: skip
    for letter in "abcdef":
        assert not (tmp_path / letter).exists()


def test_importance_files_are_never_overwritten_and_round_trip(tmp_path: Path) -> None:
    w = _weights()
    p = _importance(tmp_path, {"w": w})
    with pytest.raises(UsageError, match="never overwrites"):
        write_importance_file(p, {"w": w})
    assert load_importance(p).vectors["w"].tobytes() == w.tobytes()
    with pytest.raises(UsageError, match=r"\.safetensors"):
        write_importance_file(tmp_path / "x.bin", {"w": w})


def test_inspect_shows_which_tensors_used_importance(tmp_path: Path) -> None:
    import contextlib
    import io

    from ninfer_convert.cli import main

    src, _ = _source(tmp_path)
    imp = _importance(tmp_path, {"w": _weights()})
    out = tmp_path / "out"
    convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["inspect", str(out), "--json"]) == 0
    doc = json.loads(buf.getvalue())
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert tensors["w"]["importance"] == vector_digest(_weights())
    assert tensors["v"]["importance"] is None


def _fused_source(tmp: Path) -> tuple[Path, np.ndarray, Path]:
    src = tmp / "fsrc"
    src.mkdir()
    rng = np.random.default_rng(8)
    a = (rng.standard_normal((70, 96)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = (rng.standard_normal((30, 96)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    write_safetensors(src / "model.safetensors", {"a": ("BF16", a), "b": ("BF16", b)})
    (src / "config.json").write_text('{"model_type": "llama"}')
    recipe = tmp / "fused.yaml"
    recipe.write_text(
        RECIPE_HEAD + "- derive: ab\n  inputs: [a, b]\n  concat_axis: 0\n"
        f"  format: Q4G64_F16S\n  encoder_profile: {IW}\n  role: r\n  evidence: [e1]\n"
    )
    return src, np.concatenate([a, b], axis=0), recipe


def test_a_row_concat_takes_its_inputs_shared_vector(tmp_path: Path) -> None:
    src, words, recipe = _fused_source(tmp_path)
    w = _weights(3, 96)
    out = tmp_path / "out"
    imp = _importance(tmp_path, {"a": w, "b": w})
    convert_checkpoint(src, recipe, out, device="cpu", jobs=2, importance=imp)
    ref = encode_grouped_words(words, "BF16", "Q4G64_F16S", backend="oracle", profile=IW,
                               importance=w)  # fmt: skip
    with open_artifact(out) as art:
        got = art.read("ab")
        assert art.tensors["ab"].provenance["importance"] == vector_digest(w)
    assert isinstance(got, GroupedCodes)
    assert got.scales.tobytes() == ref.scales.tobytes()
    assert got.codes.tobytes() == ref.codes.tobytes()
    assert (out / IMPORTANCE_FILE).read_bytes() == importance_bytes({"ab": w})
    assert verify_artifact(out, device="cpu", oracle_groups=8).exit_code == 0
    differ = _importance(tmp_path, {"a": w, "b": _weights(4, 96)}, "differ")
    with pytest.raises(RecipeError, match="different importance vectors"):
        convert_checkpoint(src, recipe, tmp_path / "x", device="cpu", importance=differ)
