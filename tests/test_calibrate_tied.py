"""``ninfer calibrate`` on a model whose output head is tied to the token embedding: the head's
vector and factor are also stored under the source's name of the shared Parameter."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from ninfer_convert.calibrate import calibrate_source, write_calibration
from ninfer_convert.cli import main
from ninfer_convert.factors import FactorFile
from ninfer_convert.importance import load_importance
from ninfer_convert.source import open_source

pytestmark = pytest.mark.interop

TEXTS = ["one two three four five six", "the quick brown fox jumps"]
EMBED = "model.embed_tokens.weight"
HEAD = "lm_head.weight"


def _tiny(out: Path, *, tie: bool) -> Path:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=tie, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).eval().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory.mktemp("tied") / "model", tie=True)


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory.mktemp("untied") / "model", tie=False)


def test_the_tied_source_stores_only_the_embedding(tied: Path) -> None:
    with open_source(tied) as src:
        names = set(src.tensors)
    assert EMBED in names and HEAD not in names  # the premise of the tests below


def test_an_untied_model_gets_no_embedding_vector(untied: Path) -> None:
    cal = calibrate_source(untied, texts=TEXTS, max_tokens=16)
    assert HEAD in cal.vectors and EMBED not in cal.vectors
    assert dict(cal.aliases) == {}


def test_the_tied_vector_and_factor_are_stored_under_both_names(tied: Path, tmp_path: Path) -> None:
    cal = calibrate_source(tied, texts=TEXTS, max_tokens=16, compensation_block=128)
    assert HEAD in cal.vectors  # the Linear's own state_dict name is kept
    assert cal.vectors[EMBED].tobytes() == cal.vectors[HEAD].tobytes()
    assert cal.vectors[EMBED].shape == (16,)
    assert dict(cal.aliases) == {HEAD: (EMBED,)}
    assert cal.factors is not None
    assert cal.factors[EMBED].tobytes() == cal.factors[HEAD].tobytes()
    imp, fac = tmp_path / "imp.safetensors", tmp_path / "fac.safetensors"
    write_calibration(cal, imp, fac)
    vectors = load_importance(imp).vectors
    assert vectors[EMBED].tobytes() == cal.vectors[HEAD].tobytes()
    factors = FactorFile(fac)
    assert factors[EMBED].tobytes() == cal.factors[HEAD].tobytes()


def test_the_cli_says_which_names_are_tied(tied: Path, tmp_path: Path) -> None:
    out = tmp_path / "imp.safetensors"
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        assert main(["calibrate", str(tied), "--output", str(out), "--max-tokens", "8"]) == 0
    assert f"{HEAD} is tied to {EMBED}" in err.getvalue()
    meta = load_importance(out)
    assert EMBED in meta.vectors
    assert np.array_equal(meta.vectors[EMBED], meta.vectors[HEAD])


def test_ties_are_found_by_tensor_identity_not_by_name() -> None:
    import torch

    from ninfer_convert.calibrate import _hooked_linears

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(3, 4)
            self.a = torch.nn.Linear(4, 3, bias=False)
            self.b = torch.nn.Linear(4, 3, bias=False)
            self.c = torch.nn.Linear(4, 3, bias=False)  # same shape, its own weight
            self.a.weight = self.emb.weight
            self.b.weight = self.emb.weight

    m = M()
    linears, aliases = _hooked_linears(m, frozenset({"emb.weight", "c.weight"}))
    assert [(k, mod) for k, mod in linears] == [("a.weight", m.a), ("a.weight", m.b),
                                                ("c.weight", m.c)]  # fmt: skip
    # b shares a's accumulator and gets its vector too; emb only because the source stores it.
    assert aliases == {"a.weight": ("b.weight", "emb.weight")}
    _linears, aliases = _hooked_linears(m, frozenset({"c.weight"}))
    assert aliases == {"a.weight": ("b.weight",)}
