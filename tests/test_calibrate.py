"""``ninfer calibrate``: mean(x_k^2) per Linear input from a real transformers run, keyed by
weight name, written to a new safetensors file; typed errors without the interop extra."""

from __future__ import annotations

import builtins
import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_convert.calibrate import calibrate_source, default_calibration_texts
from ninfer_convert.cli import main
from ninfer_convert.errors import UsageError
from ninfer_convert.evaluate import default_prompts
from ninfer_convert.importance import load_importance

pytestmark = pytest.mark.interop

TEXTS = ["one two three four five six", "the quick brown fox jumps"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    out = tmp_path_factory.mktemp("tiny") / "model"
    model.save_pretrained(out)  # no tokenizer: calibrate falls back to UTF-8 bytes
    return out


def test_vectors_are_mean_squares_of_each_linear_input(tiny: Path) -> None:
    import torch
    import transformers

    cal = calibrate_source(tiny, texts=TEXTS, max_tokens=16)
    model = transformers.LlamaForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    linears = {f"{n}.weight": m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(cal.vectors) == set(linears)
    for name, m in linears.items():
        assert cal.vectors[name].shape == (m.in_features,)
    # Independent check for lm_head: its input is the last hidden state (after the final norm).
    sq = np.zeros(16)
    n = 0
    with torch.inference_mode():
        for t in TEXTS:
            ids = torch.tensor([list(t.encode("utf-8"))[:16]])
            h = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
            x = h.reshape(-1, 16).double().numpy()
            sq += (x * x).sum(axis=0)
            n += x.shape[0]
    want = (sq / n).astype(np.float32).view(np.uint32)
    assert cal.tokens == n
    assert cal.vectors["lm_head.weight"].tobytes() == want.tobytes()


def test_cli_writes_a_new_file_and_never_overwrites(tiny: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("# a comment\n" + "\n".join(TEXTS) + "\n")
    out = tmp_path / "imp.safetensors"
    args = ["calibrate", str(tiny), "--output", str(out), "--prompts", str(texts)]
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        assert main([*args, "--max-tokens", "8"]) == 0
    vectors = load_importance(out).vectors
    assert "model.layers.0.mlp.down_proj.weight" in vectors
    assert vectors["model.layers.0.mlp.down_proj.weight"].shape == (24,)
    before = out.read_bytes()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        assert main(args) == 2
    assert "never overwrites" in err.getvalue() and out.read_bytes() == before
    assert not list(tmp_path.glob("*.partial"))


def test_missing_transformers_is_a_usage_error_naming_the_extra(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = builtins.__import__

    def no_transformers(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(UsageError, match=r"ninfer calibrate needs transformers.*interop"):
        calibrate_source(tiny, texts=TEXTS)


def test_default_calibration_texts_differ_from_the_eval_prompts() -> None:
    texts = default_calibration_texts()
    assert len(texts) >= 16
    assert not set(texts) & set(default_prompts())
