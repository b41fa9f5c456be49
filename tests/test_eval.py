"""``ninfer eval`` machinery on the tiny example (random weights: the numbers mean nothing, so
these tests assert what the machinery must give: identical weights -> KL exactly 0 and
agreement 1; a deliberately broken artifact -> low agreement and a failed threshold)."""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD

from ninfer_convert.cli import main
from ninfer_convert.container import ArtifactWriter, open_artifact
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import ArtifactError, ResourceError, UsageError
from ninfer_convert.evaluate import (
    CausalMetrics,
    default_prompts,
    evaluate_artifact,
    threshold_failures,
)
from ninfer_convert.layouts import lookup_layout
from ninfer_convert.logical import DirectWords

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parent.parent
BF16_DIR = ROOT / "examples" / "tiny-qwen3.5"
PROMPTS = ["The capital of France is", "one two three four", "def f(x): return"]

ALL_BF16 = """\
ninfer_recipe: 1
name: all-bf16
version: "1"
source:
  model_type: {model_type}
evidence:
  - id: e1
    citation: none
    summary: lossless
rules:
  - match: 're:.*'
    format: {fmt}
    role: all
"""


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("eval")
    recipe = tmp / "all-bf16.yaml"
    recipe.write_text(ALL_BF16.format(model_type="qwen3_5", fmt="BF16"))
    good = tmp / "good"
    convert_checkpoint(BF16_DIR, recipe, good, device="cpu", jobs=1)
    # Broken on purpose: the same words, but lm_head's rows reversed (a wrong derivation that
    # every stored-word check would accept, because the recipe itself is what is wrong).
    broken = tmp / "broken"
    with (
        open_artifact(good) as art,
        ArtifactWriter(broken, metadata=art.metadata, alignment=art.meta.alignment) as w,
    ):
        for name, info in art.tensors.items():
            logical = art.read(name)
            if name == "lm_head.weight":
                assert isinstance(logical, DirectWords)
                logical = DirectWords(np.ascontiguousarray(logical.words[::-1]))
            planes = lookup_layout(info.layout).pack(info.format, logical)
            w.add_packed(name, info.format, info.shape, planes, role=info.role,
                         provenance=info.provenance)  # fmt: skip
    return {"good": good, "broken": broken}


def _cli_json(*args: str) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, json.loads(out.getvalue()) if out.getvalue() else {}, err.getvalue()


@pytest.fixture(scope="module")
def prompts_file(artifacts: dict[str, Path]) -> Path:
    path = artifacts["good"].parent / "prompts.txt"
    path.write_text("# comment lines and blank lines are skipped\n\n" + "\n".join(PROMPTS))
    return path


@pytest.fixture(scope="module")
def good_run(artifacts: dict[str, Path], prompts_file: Path) -> tuple[int, dict[str, Any], str]:
    args = ["--max-tokens", "2", "--json", "-q", "--min-top1", "1.0", "--max-kl", "0"]
    return _cli_json("eval", str(artifacts["good"]), "--prompts", str(prompts_file), *args)


def test_identical_weights_give_kl_exactly_zero(
    good_run: tuple[int, dict[str, Any], str], prompts_file: Path
) -> None:
    code, doc, err = good_run
    assert code == 0, err
    tokens = sum(len(p.encode()) for p in PROMPTS)
    assert doc["model"] == {
        "class": "Qwen3_5ForConditionalGeneration", "kind": "causal-lm", "tokenizer": "utf-8-bytes"
    }  # fmt: skip
    assert doc["prompts"] == {"origin": str(prompts_file), "count": 3, "tokens": tokens}
    c = doc["causal_lm"]
    assert c["positions"] == tokens
    assert c["kl_mean"] == 0.0 and c["kl_max"] == 0.0
    assert c["top1_agreement"] == 1.0
    assert c["perplexity_artifact"] == c["perplexity_source"] and c["perplexity_change"] == 0.0
    assert c["greedy"] == {"prompts": 3, "identical": 3, "token_agreement": 1.0}
    assert doc["encoder"] is None and doc["sqnr"] is None and doc["failures"] == []
    assert doc["dtype"] == "float32" and doc["device"] == "cpu"
    # transformers has no MTP module: those 15 tensors are listed, not compared.
    assert len(doc["unused_tensors"]) == 15
    assert all(k.startswith("mtp.") for k in doc["unused_tensors"])


def test_a_broken_artifact_shows_low_agreement_and_fails_thresholds(
    artifacts: dict[str, Path], prompts_file: Path, good_run: tuple[int, dict[str, Any], str]
) -> None:
    code, doc, err = _cli_json("eval", str(artifacts["broken"]), "--prompts", str(prompts_file),
                               "--max-tokens", "2", "--json", "-q", "--min-top1", "0.9",
                               "--max-kl", "0.01")  # fmt: skip
    assert code == 9, err  # QualityError, after the report was printed
    c = doc["causal_lm"]
    assert c["top1_agreement"] < 0.5 and c["kl_mean"] > 0.1 and c["greedy"]["identical"] < 3
    # The source side is the same model on the same prompts as in the good run.
    assert c["perplexity_source"] == good_run[1]["causal_lm"]["perplexity_source"]
    assert c["perplexity_artifact"] != c["perplexity_source"]
    assert doc["thresholds"] == {"min_top1": 0.9, "max_kl": 0.01, "min_cosine": None}
    assert len(doc["failures"]) == 2 and "below --min-top1 0.9" in err


def test_thresholds_for_metrics_not_measured_are_usage_errors(
    artifacts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", str(artifacts["broken"]), "--sqnr-only", "--min-top1", "0.5", "-q"])
    assert code == 2
    assert "apply to causal LMs" in capsys.readouterr().err


def test_sqnr_only_needs_no_model_run(artifacts: dict[str, Path]) -> None:
    r = evaluate_artifact(artifacts["broken"], sqnr=True, run_model=False)
    assert r.causal is None and r.kind is None and r.sqnr is not None
    by_name = {t.name: t for t in r.sqnr}
    assert len(by_name) == 104
    assert all(t.exact for n, t in by_name.items() if n != "lm_head.weight")
    head = by_name["lm_head.weight"]
    assert not head.exact and head.sqnr_db is not None and head.sqnr_db < 3


def test_missing_transformers_is_a_usage_error_naming_the_extra(
    artifacts: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = builtins.__import__

    def no_transformers(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(UsageError, match=r"needs transformers.*interop"):
        evaluate_artifact(artifacts["good"], prompts=PROMPTS, max_tokens=1)


def test_an_artifact_missing_a_model_tensor_is_refused(tmp_path: Path) -> None:
    """A partly overwritten model would compare the source with itself: refused."""
    pytest.importorskip("transformers")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        ALL_BF16.format(model_type="qwen3_5", fmt="BF16").replace(
            "rules:\n", "rules:\n  - skip: model.language_model.norm.weight\n    reason: test\n"
        )
    )
    convert_checkpoint(BF16_DIR, recipe, tmp_path / "o", device="cpu", jobs=1)
    with pytest.raises(ArtifactError, match=r"1 model tensors not in the artifact"):
        evaluate_artifact(tmp_path / "o", prompts=PROMPTS, max_tokens=1)


def test_encoder_models_report_cosine_and_neighbours(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=48, max_position_embeddings=64,
    )  # fmt: skip
    src = tmp_path / "bert"
    transformers.BertModel(config).save_pretrained(src)
    recipe = tmp_path / "fp32.yaml"
    recipe.write_text(ALL_BF16.format(model_type="bert", fmt="FP32"))
    convert_checkpoint(src, recipe, tmp_path / "o", device="cpu", jobs=1)
    r = evaluate_artifact(tmp_path / "o", prompts=PROMPTS)
    e = r.encoder
    assert r.kind == "encoder" and r.causal is None and e is not None
    assert e.pooling == "mean"
    assert e.cosine_min == pytest.approx(1.0, abs=1e-12)  # identical weights, float rounding
    assert e.nearest_neighbour_agreement == 1.0
    with pytest.raises(UsageError, match="apply to causal LMs"):
        threshold_failures(r, min_top1=0.5)


def test_default_prompts_are_packaged() -> None:
    prompts = default_prompts()
    assert len(prompts) >= 8 and not any(p.startswith("#") for p in prompts)


def test_non_finite_metrics_are_null_in_json() -> None:
    c = CausalMetrics(
        positions=3, top1_agreement=0.0, kl_mean=math.nan, kl_max=math.inf,
        perplexity_source=10.0, perplexity_artifact=math.inf, greedy_prompts=1,
        greedy_identical=0, greedy_token_agreement=0.0,
    )  # fmt: skip
    doc = json.loads(json.dumps(c.to_dict(), allow_nan=False))
    assert doc["kl_mean"] is None and doc["kl_max"] is None
    assert doc["perplexity_artifact"] is None and doc["perplexity_change"] is None
    assert doc["perplexity_source"] == 10.0


def test_a_quantized_source_is_refused_but_sqnr_only_runs(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    nvfp4 = ROOT / "examples" / "tiny-qwen3.5-nvfp4"
    convert_checkpoint(
        nvfp4, ROOT / "recipes" / "qwen3.6-27b-nvfp4.yaml", tmp_path / "o", device="cpu", jobs=1
    )
    with pytest.raises(UsageError, match="itself quantized"):
        evaluate_artifact(tmp_path / "o", prompts=PROMPTS, max_tokens=1)
    r = evaluate_artifact(tmp_path / "o", sqnr=True, run_model=False)
    assert r.sqnr is not None
    names = {t.name for t in r.sqnr}
    # Copied NVFP4 weights have no source values (their source is an encoding): left out.
    assert "model.language_model.layers.0.mlp.down_proj.weight" not in names
    assert all(t.exact for t in r.sqnr if t.format in ("BF16", "FP32"))


def test_bfloat16_compute_keeps_identical_weights_identical(artifacts: dict[str, Path]) -> None:
    r = evaluate_artifact(artifacts["good"], prompts=PROMPTS[:2], max_tokens=1, dtype="bfloat16")
    assert r.dtype == "bfloat16" and r.causal is not None
    assert r.causal.kl_max == 0.0 and r.causal.top1_agreement == 1.0
    with pytest.raises(UsageError, match="unknown model dtype"):
        evaluate_artifact(artifacts["good"], dtype="float16")


def test_a_missing_artifact_path_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        evaluate_artifact(tmp_path / "nothing", sqnr=True, run_model=False)


def test_a_prompt_longer_than_the_model_is_a_usage_error(artifacts: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match=r"needs 302 positions .* the model has 256"):
        evaluate_artifact(artifacts["good"], prompts=["x" * 300], max_tokens=2)


def test_running_out_of_memory_is_a_resource_error(
    artifacts: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ninfer_convert.evaluate as ev

    def oom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(ev, "_evaluate", oom)
    with pytest.raises(ResourceError, match="out of memory"):
        evaluate_artifact(artifacts["good"])


def test_greedy_continuations_ignore_the_checkpoints_generation_config(tmp_path: Path) -> None:
    """generate() fills unset fields from model.generation_config; a checkpoint's
    repetition_penalty must not turn the greedy comparison into something else."""
    transformers = pytest.importorskip("transformers")
    import shutil

    import torch

    from ninfer_convert.eval_metrics import _run_causal

    src = tmp_path / "src"
    shutil.copytree(BF16_DIR, src)
    gen = {"repetition_penalty": 3.0, "eos_token_id": 80, "transformers_version": "5.0.0"}
    (src / "generation_config.json").write_text(json.dumps(gen))
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    seq = list(b"one two three four")
    with torch.inference_mode():
        got = _run_causal(model, [seq], 10, "cpu").continuations[0]
        x = torch.tensor([seq])
        want = []
        for _ in range(10):
            want.append(int(model(input_ids=x).logits[0, -1].argmax()))
            x = torch.cat([x, torch.tensor([[want[-1]]])], 1)
    assert got == want
    assert model.generation_config.repetition_penalty == 3.0  # restored afterwards


_COPY_RULES = """\
  - match: p.weight
    copy: {scheme}
    format: {fmt}
    role: w
  - match: '*'
    format: FP32
    role: other
"""


@pytest.mark.parametrize(
    ("scheme", "fmt"),
    [("compressed-tensors-fp8-channel", "FP8_E4M3FN_ROW_BF16S"), ("modelopt-nvfp4", "NVFP4")],
)
def test_sqnr_leaves_out_copy_path_tensors_stored_under_their_source_name(
    tmp_path: Path, scheme: str, fmt: str
) -> None:
    """FP8-channel and ModelOpt NVFP4 keep the weight's own name (X.weight): its source words
    are codes, not values, so they must not be compared (bogus dB, or a shape crash)."""
    import torch
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    u8 = np.tile(np.arange(0, 8, dtype=np.uint8), (3, 4))  # [3, 32]
    if scheme == "modelopt-nvfp4":
        tensors = {
            "p.weight": torch.from_numpy(np.ascontiguousarray(u8[:, :16])),
            "p.weight_scale": torch.full((3, 2), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn),
            "p.weight_scale_2": torch.tensor(0.125),
        }
    else:
        tensors = {
            "p.weight": torch.from_numpy(u8).view(torch.float8_e4m3fn),
            "p.weight_scale": torch.tensor([[0.5], [1.5], [2.0]]),
        }
    tensors["n.weight"] = torch.ones(4)
    save_file(tensors, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE_HEAD + _COPY_RULES.format(scheme=scheme, fmt=fmt))
    convert_checkpoint(src, recipe, tmp_path / "o", device="cpu", jobs=1)
    r = evaluate_artifact(tmp_path / "o", sqnr=True, run_model=False)
    assert r.sqnr is not None
    assert "p.weight" not in {t.name for t in r.sqnr}
    assert "n.weight" in {t.name for t in r.sqnr}


def test_sqnr_json_survives_a_losslessly_stored_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN copied word for word is no noise (the tensor is exact), and no NaN reaches the
    JSON (json.dumps(allow_nan=False) raised a traceback)."""
    import torch
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    nan = torch.tensor([1.0, float("nan"), float("-inf")], dtype=torch.bfloat16)
    save_file({"a.weight": nan, "b.weight": torch.ones(2, dtype=torch.bfloat16)},
              str(src / "model.safetensors"))  # fmt: skip
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(ALL_BF16.format(model_type="llama", fmt="BF16"))
    convert_checkpoint(src, recipe, tmp_path / "o", device="cpu", jobs=1)
    code = main(["eval", str(tmp_path / "o"), "--sqnr-only", "--json", "-q"])
    out = capsys.readouterr().out
    assert code == 0
    tensors = {t["name"]: t for t in json.loads(out)["sqnr"]["tensors"]}
    assert tensors["a.weight"]["exact"] is True and tensors["a.weight"]["sqnr_db"] is None


def test_deeply_nested_source_json_is_a_typed_error_not_a_recursion_error(
    artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from ninfer_convert.eval_metrics import _pooling

    src = tmp_path / "src"
    shutil.copytree(BF16_DIR, src)
    deep = "[" * 100_000 + "]" * 100_000
    cfg = (src / "config.json").read_text().rstrip().removesuffix("}")
    (src / "config.json").write_text(cfg + f', "x": {deep}}}')
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n")
    code = main(["eval", str(artifacts["good"]), "--source", str(src), "--prompts", str(prompts),
                 "-q"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4 and "nested deeper" in err and "Traceback" not in err
    (src / "1_Pooling").mkdir()
    for text, needle in [(deep, "nested deeper"), ("[]", "not a JSON object")]:
        (src / "1_Pooling" / "config.json").write_text(text)
        with pytest.raises(UsageError, match=needle):
            _pooling(src)


def test_an_encoder_decoder_model_is_a_usage_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """T5's class ends in ForConditionalGeneration like Qwen3.5's, but it is no causal LM."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=300, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                   num_heads=2, decoder_start_token_id=0)  # fmt: skip
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path / "t5")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(ALL_BF16.format(model_type="t5", fmt="FP32"))
    convert_checkpoint(tmp_path / "t5", recipe, tmp_path / "o", device="cpu", jobs=1)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n")
    code = main(["eval", str(tmp_path / "o"), "--prompts", str(prompts), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "encoder-decoder" in err and "Traceback" not in err


def test_a_source_without_weights_is_a_source_error_not_a_traceback(
    artifacts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "cfg-only"
    src.mkdir()
    (src / "config.json").write_text((BF16_DIR / "config.json").read_text())
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n")
    code = main(["eval", str(artifacts["good"]), "--source", str(src), "--prompts", str(prompts),
                 "-q"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4 and "Traceback" not in err and str(src) in err


def test_encoder_metrics_compare_the_two_models_row_by_row() -> None:
    """The encoder test above only sees identical weights (1.0 whatever is compared): known
    embeddings whose cosines and nearest neighbours differ."""
    import torch

    from ninfer_convert.eval_metrics import _encoder_metrics

    src = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]], dtype=torch.float64)
    art = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.1, 0.9]], dtype=torch.float64)
    e = _encoder_metrics(src, art, "mean")
    cos = [1.0, 0.1 / math.hypot(0.9, 0.1), 0.9 / math.hypot(0.1, 0.9)]
    assert e.cosine_min == pytest.approx(min(cos), rel=1e-12)
    assert e.cosine_mean == pytest.approx(sum(cos) / 3, rel=1e-12)
    # Neighbours: source 0->1, 1->0, 2->1; artifact 0->2, 1->2, 2->1: one of three agrees.
    assert e.nearest_neighbour_agreement == pytest.approx(1 / 3)
    assert _encoder_metrics(src[:2], art[:2], "cls").nearest_neighbour_agreement is None


def test_causal_metrics_direction_shift_and_greedy_prefix() -> None:
    """KL is KL(source || artifact), not the reverse; perplexity scores token t+1 with the
    logits at t; greedy agreement is the common prefix (identical runs alone cannot tell)."""
    import torch

    from ninfer_convert.eval_metrics import _causal_metrics, _CausalRun

    ls = torch.tensor([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0], [1.0, 1.0, 1.0]])
    la = torch.tensor([[0.0, 0.5, 3.0], [0.0, 3.0, 0.5], [1.0, 1.0, 1.0]])
    seq = [0, 1, 2]
    m = _causal_metrics([seq], _CausalRun([ls], [[5, 6, 7, 8]]), _CausalRun([la], [[5, 6, 9, 8]]))
    lp, lq = torch.log_softmax(ls.double(), -1), torch.log_softmax(la.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    reverse = (lq.exp() * (lq - lp)).sum(-1)
    assert abs(float(kl.mean() - reverse.mean())) > 1e-3  # the two directions differ here
    assert m.kl_mean == pytest.approx(float(kl.mean()), rel=1e-12)
    assert m.kl_max == pytest.approx(float(kl.max()), rel=1e-12)
    assert m.top1_agreement == pytest.approx(2 / 3)  # position 0 differs, 1 and 2 agree
    want_ppl = math.exp(-(float(lp[0, 1]) + float(lp[1, 2])) / 2)
    assert m.perplexity_source == pytest.approx(want_ppl, rel=1e-12)
    assert m.perplexity_artifact == pytest.approx(
        math.exp(-(float(lq[0, 1]) + float(lq[1, 2])) / 2), rel=1e-12
    )
    assert (m.greedy_identical, m.greedy_token_agreement) == (0, 0.5)
