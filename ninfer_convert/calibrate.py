"""``ninfer calibrate``: per-column activation statistics for MSE_F16_SEARCH_IW_V1.

Contract (docs/cli.md, "ninfer calibrate"):

* The source model directory is loaded with transformers exactly as ``ninfer eval`` loads it
  (:func:`~ninfer_convert.eval_model.load_source_model`, float32, the ``interop`` extra; without
  it a :class:`~ninfer_convert.errors.UsageError` names the extra).
* The calibration texts are the packaged default set
  (``ninfer_convert/data/calibration-text.txt``, deliberately different from eval's default
  prompts so that a measurement with the defaults never calibrates on its own test text) or a
  UTF-8 file, one text per line (blank and ``#`` lines ignored).  Each text is tokenized with
  the source's tokenizer, cut to ``max_tokens`` tokens, and run alone (batch of one, so there
  is no padding to exclude).
* A forward pre-hook on every ``torch.nn.Linear`` records its input x; for each input column k
  the statistic is ``mean over all tokens of x_k^2``, accumulated in float64 (sum of squares and
  a token count per module; a module called several times, e.g. a shared one, adds every call)
  and rounded once to binary32.  The vector is keyed by the module's weight name in the model's
  ``state_dict`` (``<module>.weight``), which is the source tensor name ``ninfer eval`` maps
  artifacts by.  A Linear weight is [out, in] = [N, K], so the vector has one entry per column K
  of a rule without transforms.  GPT-2 style ``Conv1D`` ([in, out]) modules are not hooked
  (their K axis is the *output* axis of the source tensor); a recipe rule for them gets no
  vector and is refused at convert time.
* The output is a new safetensors file (:mod:`~ninfer_convert.importance`); an existing file is
  never overwritten.  Vectors are what the model computed on this machine: the converter
  stores the vectors it used in the artifact, so ``verify`` never re-runs calibration.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import SourceError, UsageError
from .eval_model import _parse_prompts, _tokenize, load_source_model
from .importance import write_importance_file

__all__ = ["Calibration", "calibrate_source", "default_calibration_texts", "write_calibration"]

Progress = Callable[[str], None]


def default_calibration_texts() -> list[str]:
    """The packaged calibration texts (ninfer_convert/data/calibration-text.txt)."""
    text = (
        resources.files("ninfer_convert").joinpath("data/calibration-text.txt").read_text("utf-8")
    )
    return _parse_prompts(text)


@dataclass(frozen=True)
class Calibration:
    """The statistics of one run: binary32 words per weight name, plus what produced them."""

    source: str
    model_class: str
    texts: int
    texts_origin: str
    tokens: int
    vectors: dict[str, npt.NDArray[np.uint32]]


def calibrate_source(
    source: str | os.PathLike[str],
    *,
    texts: Iterable[str] | None = None,
    texts_origin: str | None = None,
    max_tokens: int = 256,
    device: str = "cpu",
    progress: Progress | None = None,
) -> Calibration:
    """Run the source model on the calibration texts and return mean(x_k^2) per Linear."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        raise UsageError(f"--max-tokens must be an integer >= 2, not {max_tokens!r}")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}", hint="use cpu or cuda")
    src_path = str(source)
    if not os.path.exists(src_path):
        raise SourceError("source not found", path=src_path)
    say = progress or (lambda _msg: None)
    tlist = list(texts) if texts is not None else default_calibration_texts()
    if not tlist:
        raise UsageError("no calibration text")
    transformers, model, cls, _kind = load_source_model(
        src_path, device, "float32", say, command="ninfer calibrate"
    )
    import torch

    vocab = int(getattr(model.config.get_text_config(), "vocab_size", 0) or 0)
    toks = _tokenize(transformers, Path(src_path), tlist, vocab)
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    cut = max_tokens if not isinstance(limit, int) else min(max_tokens, limit)
    ids = [x[:cut] for x in toks.ids]
    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}
    handles = []

    def hook_for(name: str) -> Callable[..., None]:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0].detach().to(torch.float64)
            x = x.reshape(-1, x.shape[-1])
            s = (x * x).sum(dim=0)
            sums[name] = s if name not in sums else sums[name] + s
            counts[name] = counts.get(name, 0) + int(x.shape[0])

        return hook

    state_names = set(model.state_dict().keys())
    for mname, module in model.named_modules():
        wname = f"{mname}.weight"
        if isinstance(module, torch.nn.Linear) and wname in state_names:
            handles.append(module.register_forward_pre_hook(hook_for(wname)))
    try:
        say(f"running {len(ids)} calibration texts ({sum(map(len, ids))} tokens)")
        with torch.inference_mode():
            for x in ids:
                model(input_ids=torch.tensor([x], dtype=torch.long, device=device))
    finally:
        for h in handles:
            h.remove()
    vectors: dict[str, npt.NDArray[np.uint32]] = {}
    for name in sorted(sums):
        mean64 = (sums[name] / counts[name]).cpu().numpy().astype(np.float64)
        vectors[name] = mean64.astype(np.float32).view(np.uint32)  # one RNE rounding
    del model
    return Calibration(
        source=src_path,
        model_class=cls.__name__,
        texts=len(ids),
        texts_origin=texts_origin or ("default" if texts is None else "argument"),
        tokens=sum(len(x) for x in ids),
        vectors=vectors,
    )


def write_calibration(cal: Calibration, output: str | os.PathLike[str]) -> None:
    """Write the vectors as a new importance file (metadata says how they were made)."""
    write_importance_file(
        output,
        cal.vectors,
        {
            "ninfer.statistic": "mean(x_k^2) over tokens, float64 sums, binary32",
            "ninfer.model_class": cal.model_class,
            "ninfer.texts": str(cal.texts),
            "ninfer.texts_origin": cal.texts_origin,
            "ninfer.tokens": str(cal.tokens),
        },
    )
