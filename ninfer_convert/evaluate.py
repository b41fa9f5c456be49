"""``ninfer eval``: does the dequantized artifact still behave like its source model?

Contract (docs/cli.md, "ninfer eval"):

* One transformers model of the class the source's ``config.json`` names
  (``architectures[0]``) is loaded from the source with transformers' own ``from_pretrained``
  in float32 (or bfloat16 on request: half the memory, but quantized reconstructions are then
  rounded to bfloat16) and run on the prompts; then every parameter and persistent buffer is
  overwritten, one tensor at a time, from :func:`~ninfer_convert.loader.load_state_dict`
  (``names="source"``, float32, cast to the model's dtype) and the same prompts are run
  again.  Only one model is ever in memory.  A model tensor the artifact does not provide
  (other than one tied to a provided tensor), or one whose shape differs, is an
  :class:`~ninfer_convert.errors.ArtifactError`: a partly overwritten model would compare the
  source with itself.  Artifact tensors the model has no place for are listed in the report
  (``unused_tensors``), not compared.
* Causal LMs (``...ForCausalLM``, ``...ForConditionalGeneration``, ``...LMHeadModel``; an
  encoder-decoder model such as T5 is a UsageError): at every prompt position, top-1
  agreement of the next-token argmax and KL(source || artifact) of the next-token
  distributions (float64 log-softmax of float32 logits); perplexity of each model on the
  prompt tokens themselves; and greedy continuations of ``max_tokens`` tokens (``generate``
  with a fresh greedy generation config, also set as the model's so that nothing of the
  checkpoint's generation_config.json applies: no sampling, no penalty, EOS not special),
  compared token by token.
* Encoders (``...Model``, e.g. BERT or a sentence-transformers folder): pooled embeddings (the
  pooling of ``1_Pooling/config.json`` when present: mean or CLS; mean otherwise), cosine
  similarity per prompt (min and mean) and nearest-neighbour agreement (for each prompt, the
  other prompt closest by cosine is the same under both models).
* ``sqnr=True``: per-tensor signal-to-quantization-noise ratio of the artifact's values against
  the source's (no model run needed; ``run_model=False`` skips the model entirely).
* Prompts: the packaged default set (``ninfer_convert/data/eval-prompts.txt``) or a UTF-8 file,
  one prompt per line, blank lines and lines starting with ``#`` ignored.  Tokenized with the
  source's tokenizer; a source without tokenizer files gets UTF-8 bytes as token ids
  (``vocab_size`` must be at least 256), reported as ``utf-8-bytes``.
* Thresholds are checked by :func:`threshold_failures`; the library never raises for a
  number, the CLI turns failures into :class:`~ninfer_convert.errors.QualityError`.

Everything runs under ``torch.inference_mode`` with the model in ``eval()`` mode, so two runs
of identical weights give identical logits (an all-BF16 artifact gives KL exactly 0).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .container import check_artifact_path, open_artifact
from .errors import ResourceError, SourceError, UsageError
from .eval_metrics import _causal_metrics, _encoder_metrics, _pooling, _run_causal, _run_encoder
from .eval_model import (
    Progress,
    _tokenize,
    default_prompts,
    load_artifact_into,
    load_source_model,
    read_prompts,
)
from .eval_report import (
    CausalMetrics,
    EncoderMetrics,
    EvalReport,
    TensorSqnr,
    threshold_failures,
)
from .eval_sqnr import _sqnr
from .loader import ArtifactStateDict, load_state_dict

__all__ = [
    "CausalMetrics",
    "EncoderMetrics",
    "EvalReport",
    "TensorSqnr",
    "default_prompts",
    "evaluate_artifact",
    "load_artifact_into",
    "read_prompts",
    "threshold_failures",
]


def evaluate_artifact(
    artifact: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    prompts: Iterable[str] | None = None,
    prompts_origin: str | None = None,
    max_tokens: int = 16,
    device: str = "cpu",
    dtype: str = "float32",
    sqnr: bool = False,
    run_model: bool = True,
    progress: Progress | None = None,
) -> EvalReport:
    """Compare ``artifact`` with its source (the recorded path unless ``source`` is given).

    Running out of host or device memory is a :class:`ResourceError` (exit 7), not a crash."""
    try:
        return _evaluate(
            artifact, source=source, prompts=prompts, prompts_origin=prompts_origin,
            max_tokens=max_tokens, device=device, dtype=dtype, sqnr=sqnr, run_model=run_model,
            progress=progress,
        )  # fmt: skip
    except MemoryError:
        raise ResourceError(
            "out of host memory while evaluating", kind="out_of_memory", path=str(artifact),
            hint="use --dtype bfloat16, fewer or shorter prompts, or a machine with more memory",
        ) from None  # fmt: skip
    except RuntimeError as exc:
        if "out of memory" not in str(exc).lower():
            raise
        raise ResourceError(
            f"out of memory while evaluating ({str(exc).splitlines()[0]})", path=str(artifact),
            kind="out_of_memory",
            hint="use --dtype bfloat16, --device cpu, or fewer or shorter prompts",
        ) from None  # fmt: skip


def _evaluate(
    artifact: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None,
    prompts: Iterable[str] | None,
    prompts_origin: str | None,
    max_tokens: int,
    device: str,
    dtype: str,
    sqnr: bool,
    run_model: bool,
    progress: Progress | None,
) -> EvalReport:
    started = time.perf_counter()
    _check_options(max_tokens, device, dtype, sqnr=sqnr, run_model=run_model)
    say = progress or (lambda _msg: None)
    art = open_artifact(check_artifact_path(artifact))  # a missing path is exit 2, as for verify
    try:
        recorded = str(art.meta.source.path)
        src_path = str(source) if source is not None else recorded
        if not os.path.exists(src_path):
            raise SourceError(
                "source not found" + ("" if source is not None else " at its recorded path"),
                path=src_path,
                hint="pass the source checkpoint with --source",
            )
        plist = list(prompts) if prompts is not None else default_prompts()
        origin = prompts_origin or ("default" if prompts is None else "argument")
        weights = load_state_dict(art, names="source", dtype=None)  # float32; cast on copy
        report_kw: dict[str, Any] = {
            "artifact": str(artifact),
            "source": src_path,
            "device": device,
            "dtype": dtype,
            "prompts_origin": origin,
            "prompts": len(plist),
            "max_tokens": max_tokens,
        }
        sq = _sqnr(weights, src_path, say) if sqnr else None
        if not run_model:
            return EvalReport(
                model_class=None, kind=None, tokenizer=None, prompt_tokens=0, sqnr=sq,
                elapsed_s=time.perf_counter() - started, **report_kw,
            )  # fmt: skip
        report_kw.update(
            _compare_models(str(artifact), src_path, weights, plist, max_tokens, device, dtype, say)
        )
        return EvalReport(sqnr=sq, elapsed_s=time.perf_counter() - started, **report_kw)
    finally:
        art.close()


def _check_options(
    max_tokens: int, device: str, dtype: str, *, sqnr: bool, run_model: bool
) -> None:
    """Refuse option values eval cannot run with, before anything is opened."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UsageError(f"--max-tokens must be a positive integer, not {max_tokens!r}")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}", hint="use cpu or cuda")
    if dtype not in ("float32", "bfloat16"):
        raise UsageError(f"unknown model dtype {dtype!r}", hint="use float32 or bfloat16")
    if not run_model and not sqnr:
        raise UsageError("nothing to do: the model run is off and SQNR was not asked for")


def _compare_models(
    artifact: str,
    src_path: str,
    weights: ArtifactStateDict,
    plist: list[str],
    max_tokens: int,
    device: str,
    dtype: str,
    say: Progress,
) -> dict[str, Any]:
    """Run the source model on the prompts, overwrite it with the artifact's weights, run it
    again and compare: the report fields of the model run."""
    transformers, model, cls, kind = load_source_model(src_path, device, dtype, say)
    import torch

    src_dir = Path(src_path)
    text_config = model.config.get_text_config()
    vocab = int(getattr(text_config, "vocab_size", 0) or 0)
    toks = _tokenize(transformers, src_dir, plist, vocab)
    longest = max(len(x) for x in toks.ids) + (max_tokens if kind == "causal-lm" else 0)
    limit = getattr(text_config, "max_position_embeddings", None)
    if isinstance(limit, int) and longest > limit:
        raise UsageError(
            f"the longest prompt needs {longest} positions (with the continuation), the "
            f"model has {limit}",
            path=src_path,
            hint="use shorter prompts or a smaller --max-tokens",
        )
    out: dict[str, Any] = {
        "model_class": cls.__name__,
        "kind": kind,
        "tokenizer": toks.how,
        "prompt_tokens": sum(len(x) for x in toks.ids),
    }
    with torch.inference_mode():
        if kind == "causal-lm":
            say(f"running the source on {len(plist)} prompts")
            ref = _run_causal(model, toks.ids, max_tokens, device)
        else:
            pooling = _pooling(src_dir)
            say(f"embedding {len(plist)} prompts with the source")
            emb_src = _run_encoder(model, toks.ids, pooling, device)
    say("loading the artifact's dequantized weights into the same model")
    out["unused_tensors"] = load_artifact_into(model, weights, artifact)
    with torch.inference_mode():
        if kind == "causal-lm":
            say(f"running the artifact on {len(plist)} prompts")
            got = _run_causal(model, toks.ids, max_tokens, device)
            out["causal"] = _causal_metrics(toks.ids, ref, got)
        else:
            say(f"embedding {len(plist)} prompts with the artifact")
            emb_art = _run_encoder(model, toks.ids, pooling, device)
            out["encoder"] = _encoder_metrics(emb_src, emb_art, pooling)
    del model
    return out
