"""``ninfer calibrate --compensation-block``: the GPTQ_F16_SEARCH_IW_V1 factors of a real
transformers run (upper Cholesky factors of the inverted damped diagonal blocks of X^T X / n),
bounded passes, the refusals, and the whole chain calibrate -> convert -> verify on a tiny
random Llama."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD

import ninfer_convert.calibrate as calibrate_mod
from ninfer_convert.calibrate import calibrate_source, compensation_factor, parse_block
from ninfer_convert.cli import main
from ninfer_convert.encoder.gptq import check_factor
from ninfer_convert.errors import UsageError
from ninfer_convert.factors import FACTOR_FILE, FactorFile
from ninfer_convert.formats import GPTQ_F16_SEARCH_IW_V1

pytestmark = pytest.mark.interop

TEXTS = ["one two three four five six seven", "the quick brown fox jumps over it"]
HIDDEN = 160  # K = 160 > 128: two blocks at B = 128, a partial last one


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    out = tmp_path_factory.mktemp("tinyk") / "model"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def cal128(tiny: Path) -> calibrate_mod.Calibration:
    return calibrate_source(tiny, texts=TEXTS, max_tokens=16, compensation_block=128)


def test_factor_is_the_cholesky_factor_of_each_damped_inverse_block(
    tiny: Path, cal128: calibrate_mod.Calibration
) -> None:
    import torch
    import transformers

    cal = cal128
    assert cal.factors is not None and set(cal.factors) == set(cal.vectors)
    # Independent H of lm_head's input (the last hidden state, after the final norm).
    model = transformers.LlamaForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    xs = []
    with torch.inference_mode():
        for t in TEXTS:
            ids = torch.tensor([list(t.encode("utf-8"))[:16]])
            xs.append(model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0])
    x = torch.cat(xs).double().numpy()
    h = x.T @ x / x.shape[0]
    lam = 0.01 * float(np.mean(np.diag(h)))
    f = cal.factors["lm_head.weight"]
    assert f.shape == (HIDDEN, 128)
    check_factor(f, HIDDEN, "lm_head.weight")  # the factor rules hold
    u = f.view(np.float32).astype(np.float64)
    for b0, b1 in ((0, 128), (128, HIDDEN)):
        ub = u[b0:b1, : b1 - b0]
        assert not np.triu(ub).any() or np.array_equal(np.tril(ub, -1), np.zeros_like(ub))
        want = np.linalg.inv(h[b0:b1, b0:b1] + lam * np.eye(b1 - b0))
        np.testing.assert_allclose(ub.T @ ub, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    assert not u[128:, HIDDEN - 128 :].any()  # +0 right of the partial last block


def test_more_passes_give_the_same_factors(
    tiny: Path, cal128: calibrate_mod.Calibration, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = cal128
    monkeypatch.setattr(calibrate_mod, "PASS_BYTES", 1)  # every Linear its own pass
    many = calibrate_source(tiny, texts=TEXTS, max_tokens=16, compensation_block=128)
    assert one.factors is not None and many.factors is not None
    assert many.passes == 1 + len(many.factors) and one.passes == 2
    for name, f in one.factors.items():
        assert f.tobytes() == many.factors[name].tobytes(), name


def test_block_refusals(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("64", "0", "-128", "x", "129"):
        with pytest.raises(UsageError, match="multiple of 128 or 'full'"):
            parse_block(bad)
    assert parse_block("256") == 256 and parse_block("full") == "full"
    monkeypatch.setattr(calibrate_mod, "MAX_FULL_FACTOR_BYTES", 160 * 256 * 4 - 1)
    with pytest.raises(UsageError, match=r"over the .* byte cap"):
        calibrate_source(tiny, texts=TEXTS, max_tokens=8, compensation_block="full")


def test_a_singular_block_gets_damped_to_a_valid_factor() -> None:
    blocks = np.zeros((1, 128, 128))  # no activations at all: lambda falls back to 1
    f = compensation_factor(blocks, 100, 128)
    check_factor(f, 100, "t")
    assert f[0, 0] == np.float32(1.0).view(np.uint32)


def _run(args: list[str]) -> tuple[int, str, str]:
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(args)
    return code, buf.getvalue(), err.getvalue()


def test_calibrate_convert_verify_end_to_end(tiny: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    imp, fac = tmp_path / "imp.safetensors", tmp_path / "fac.safetensors"
    base = ["calibrate", str(tiny), "-o", str(imp), "--prompts", str(texts), "--max-tokens", "8"]
    code, _, err = _run([*base, "--compensation-block", "128"])
    assert code == 2 and "go together" in err and not imp.exists()
    code, out, _ = _run([*base, "--compensation-block", "full", "--factors", str(fac)])
    assert code == 0, out
    assert "compensation factors (block full" in out
    factors = FactorFile(fac)
    assert factors["model.layers.0.mlp.down_proj.weight"].shape == (64, 128)
    assert factors["lm_head.weight"].shape == (HIDDEN, 256)  # one block over the whole row
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        RECIPE_HEAD + "- match: re:.*(proj|lm_head)\\.weight\n  format: Q4G64_F16S\n"
        f"  encoder_profile: {GPTQ_F16_SEARCH_IW_V1}\n  role: r\n  evidence: [e1]\n"
        "- match: re:.*\n  format: FP32\n  role: r\n  evidence: [e1]\n"
    )
    art = tmp_path / "art"
    args = ["convert", str(tiny), "--recipe", str(recipe), "--output", str(art), "--device", "cpu"]
    code, _, err = _run([*args, "--importance", str(imp)])
    assert code == 2 and "no factor file" in err, err
    code, out, err = _run([*args, "--importance", str(imp), "--factors", str(fac)])
    assert code == 0, err
    assert (art / FACTOR_FILE).is_file()
    code, out, err = _run(["verify", str(art), "--source", str(tiny)])
    assert code == 0, out + err
    code, out, _ = _run(["inspect", str(art)])
    assert code == 0 and "factor B=256" in out


def test_a_block_at_or_above_k_is_the_whole_row_under_the_full_cap(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An integer B >= K is one block over the whole row, stored as wide as 'full' stores it
    (K rounded up to 128) and under the same cap: a huge B must not allocate B x B float64
    accumulators (2^20 would be 8 TiB) nor write a factor wider than the row."""
    assert calibrate_mod._block_width(1 << 20, HIDDEN, "x") == 256
    assert calibrate_mod._block_width(256, HIDDEN, "x") == 256
    assert calibrate_mod._block_width(128, HIDDEN, "x") == 128
    monkeypatch.setattr(calibrate_mod, "MAX_FULL_FACTOR_BYTES", HIDDEN * 256 * 4 - 1)
    with pytest.raises(UsageError, match=r"over the .* byte cap"):
        calibrate_mod._block_width(1 << 20, HIDDEN, "x")
    with pytest.raises(UsageError, match=r"over the .* byte cap"):
        calibrate_source(tiny, texts=TEXTS, max_tokens=8, compensation_block=1 << 20)
    assert calibrate_mod._block_width(128, HIDDEN, "x") == 128  # a real block: no cap


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_statistics_are_a_typed_error_naming_the_linear(bad: float) -> None:
    from ninfer_convert.errors import EncodeError

    blocks = np.zeros((1, 128, 128))
    blocks[0] = np.eye(128)
    blocks[0, 3, 3] = bad  # an activation that overflowed in the model
    with pytest.raises(EncodeError, match="not finite") as exc:
        compensation_factor(blocks, 128, 128, name="model.layers.0.mlp.up_proj.weight")
    assert exc.value.tensor == "model.layers.0.mlp.up_proj.weight"


def test_a_block_cholesky_cannot_factor_is_a_typed_error() -> None:
    from ninfer_convert.errors import EncodeError

    blocks = np.zeros((1, 128, 128))
    blocks[0] = -np.eye(128)  # not positive semi-definite (no X^T X is): damping cannot fix it
    with pytest.raises(EncodeError, match="Cholesky") as exc:
        compensation_factor(blocks, 128, 128, name="t.weight")
    assert exc.value.tensor == "t.weight"


def test_factors_and_output_naming_one_file_are_refused_before_the_run(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two spellings of one path: the factor file would be written there first and the
    vectors then refused, leaving a factor file under the importance file's name."""
    monkeypatch.chdir(tmp_path)
    args = ["calibrate", str(tiny), "-o", "imp.safetensors", "--max-tokens", "8"]
    code, _, err = _run([*args, "--compensation-block", "128", "--factors", "./imp.safetensors"])
    assert code == 2 and "another file than --output" in err, err
    assert not (tmp_path / "imp.safetensors").exists()
