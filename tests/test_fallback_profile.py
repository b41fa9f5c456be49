"""``fallback_profile`` (docs/recipes.md 4.8): a weighted rule's tensor without an importance
vector is encoded with the rule's named fallback profile, recorded as such and re-derived the
same way by verify; the key's schema rules; a file with no vector for any weighted tensor is
refused."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert import encode_grouped_words, open_artifact
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import RecipeError
from ninfer_convert.formats import MSE_F16_SEARCH_IW_V1, MSE_F16_SEARCH_V1
from ninfer_convert.importance import IMPORTANCE_FILE, importance_bytes, write_importance_file
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.recipe.parse import parse_recipe
from ninfer_convert.verify import verify_artifact

IW, MSE = MSE_F16_SEARCH_IW_V1, MSE_F16_SEARCH_V1
K = 192


def _source(tmp: Path) -> tuple[Path, dict[str, np.ndarray]]:
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    rng = np.random.default_rng(3)
    words = {
        n: (rng.standard_normal((16, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        for n in ("a", "b")
    }
    write_safetensors(src / "model.safetensors", {n: ("BF16", w) for n, w in words.items()})
    (src / "config.json").write_text('{"model_type": "llama"}')
    return src, words


def _recipe(tmp: Path, fallback: str = f"  fallback_profile: {MSE}\n") -> Path:
    rule = "- match: {n}\n  format: Q4G64_F16S\n  encoder_profile: " + IW + "\n{fb}"
    rule += "  role: r\n  evidence: [e1]\n"
    p = tmp / "fb.yaml"
    p.write_text(RECIPE_HEAD + rule.format(n="a", fb="") + rule.format(n="b", fb=fallback))
    return p


def _vector() -> np.ndarray:
    return np.random.default_rng(4).lognormal(0, 2, K).astype(np.float32).view(np.uint32)


def test_a_tensor_without_a_vector_takes_the_fallback_and_verifies(tmp_path: Path) -> None:
    src, words = _source(tmp_path)
    imp = tmp_path / "imp.safetensors"
    write_importance_file(imp, {"a": _vector()})  # none for b
    out = tmp_path / "out"
    report = convert_checkpoint(src, _recipe(tmp_path), out, device="cpu", jobs=1, importance=imp)
    profiles = {e.output: (e.encoder_profile, e.importance is None) for e in report.plan.entries}
    assert profiles == {"a": (IW, False), "b": (MSE, True)}
    want = encode_grouped_words(words["b"], "BF16", "Q4G64_F16S", backend="oracle", profile=MSE)
    with open_artifact(out) as art:
        assert art.tensors["b"].provenance["encoder_profile"] == MSE
        assert "importance" not in art.tensors["b"].provenance
        got = art.read("b")
    assert isinstance(got, GroupedCodes)
    assert got.codes.tobytes() == want.codes.tobytes()
    assert got.scales.tobytes() == want.scales.tobytes()
    assert (out / IMPORTANCE_FILE).read_bytes() == importance_bytes({"a": _vector()})
    result = verify_artifact(out, source=src, device="cpu", jobs=1, oracle_groups=8)
    assert result.passed, [(f.check, f.tensor, f.message) for f in result.findings]


def test_a_vector_present_is_used_even_with_a_fallback(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    imp = tmp_path / "imp.safetensors"
    write_importance_file(imp, {"a": _vector(), "b": _vector()})
    report = convert_checkpoint(
        src, _recipe(tmp_path), tmp_path / "out", device="cpu", jobs=1, importance=imp
    )
    assert all(e.encoder_profile == IW and e.importance is not None for e in report.plan.entries)


def test_without_a_fallback_a_missing_vector_is_still_refused(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    imp = tmp_path / "imp.safetensors"
    write_importance_file(imp, {"a": _vector()})
    with pytest.raises(RecipeError, match="no vector named 'b'"):
        convert_checkpoint(
            src, _recipe(tmp_path, ""), tmp_path / "out", device="cpu", jobs=1, importance=imp
        )


def test_a_file_with_no_vector_for_any_weighted_tensor_is_refused(tmp_path: Path) -> None:
    src, _ = _source(tmp_path)
    recipe = tmp_path / "all-fb.yaml"
    recipe.write_text(
        RECIPE_HEAD
        + "".join(
            f"- match: {n}\n  format: Q4G64_F16S\n  encoder_profile: {IW}\n"
            f"  fallback_profile: {MSE}\n  role: r\n  evidence: [e1]\n"
            for n in "ab"
        )
    )
    imp = tmp_path / "imp.safetensors"
    write_importance_file(imp, {"other": _vector()})
    with pytest.raises(RecipeError, match="a vector for none of the 2 tensors"):
        convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", jobs=1, importance=imp)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("profile", "fallback", "message"),
    [
        ("MAXABS_F16_RECIP_RNE_V1", MSE, "only allowed with an importance-weighted"),
        (IW, IW, "needs calibration data itself"),
        (IW, "GPTQ_F16_SEARCH_IW_V1", "needs calibration data itself"),
        (IW, "NOPE_V1", "unknown encoder profile 'NOPE_V1'"),
    ],
)
def test_the_key_is_checked_when_the_recipe_loads(
    profile: str, fallback: str, message: str
) -> None:
    body = textwrap.dedent(f"""\
        - match: w
          format: Q4G64_F16S
          encoder_profile: {profile}
          fallback_profile: {fallback}
          role: r
          evidence: [e1]
        """)
    _recipe_obj, found = parse_recipe(RECIPE_HEAD + body)
    assert [p.line for p in found] == [RECIPE_HEAD.count("\n") + 4], found
    assert message in found[0].message


def test_a_copy_rule_takes_no_fallback_profile() -> None:
    body = "- match: w\n  copy: x\n  format: BF16\n  role: r\n  fallback_profile: " + MSE + "\n"
    _recipe_obj, found = parse_recipe(RECIPE_HEAD + body)
    assert any("unknown key 'fallback_profile'" in p.message for p in found), found


def test_a_factor_file_unused_because_every_compensated_tensor_fell_back_says_so(
    tmp_path: Path,
) -> None:
    """A compensated rule with a fallback whose tensors have no vector all take the fallback,
    so the factor file is used by none: refused, but not as "no recipe rule selects a
    compensated encoder profile" (rule 2 does); the message names the fallback and a tensor."""
    from ninfer_convert.errors import UsageError
    from ninfer_convert.factors import write_factor_file

    src, _ = _source(tmp_path)
    recipe = tmp_path / "gptq-fb.yaml"
    recipe.write_text(
        RECIPE_HEAD + f"- match: a\n  format: Q4G64_F16S\n  encoder_profile: {IW}\n  role: r\n"
        "  evidence: [e1]\n"
        "- match: b\n  format: Q4G64_F16S\n  encoder_profile: GPTQ_F16_SEARCH_IW_V1\n"
        f"  fallback_profile: {MSE}\n  role: r\n  evidence: [e1]\n"
    )
    imp, fac = tmp_path / "imp.safetensors", tmp_path / "fac.safetensors"
    write_importance_file(imp, {"a": _vector()})  # none for b: b falls back
    write_factor_file(fac, {"b": np.zeros((K, 256), np.uint32)})
    with pytest.raises(UsageError) as exc:
        convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", jobs=1,
                           importance=imp, factors=fac)  # fmt: skip
    assert "no recipe rule selects" not in exc.value.message, exc.value.message
    assert "fallback_profile" in exc.value.message and "(first: b)" in exc.value.message
    assert exc.value.path == str(fac) and not (tmp_path / "out").exists()
