"""The model runs of ``ninfer eval`` and the metrics that compare two of them.

Contract (docs/cli.md, "ninfer eval"): causal LMs are run once per prompt for the logits of
every position and once through ``generate`` with a fresh greedy generation config (also set as
the model's, and restored afterwards); :func:`_causal_metrics` gives top-1 agreement, KL(source
|| artifact) in float64, perplexities and greedy agreement.  Encoders are pooled (mean or CLS,
from ``1_Pooling/config.json``) and compared by cosine and nearest-neighbour agreement.  The
caller runs everything under ``torch.inference_mode``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import UsageError
from .eval_model import _require_transformers
from .eval_report import CausalMetrics, EncoderMetrics
from .source.header import loads_strict_json

if TYPE_CHECKING:
    import torch


@dataclass
class _CausalRun:
    logits: list[torch.Tensor]
    continuations: list[list[int]]


def _run_causal(model: Any, ids: list[list[int]], max_tokens: int, device: str) -> _CausalRun:
    import torch

    transformers = _require_transformers()
    # Plain greedy decoding: a fresh generation config, so nothing from the checkpoint's
    # generation_config.json (repetition penalty, sampling, EOS) changes the continuation.
    greedy = transformers.GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    logits: list[torch.Tensor] = []
    conts: list[list[int]] = []
    # generate() fills every field the given config leaves unset from model.generation_config
    # (a checkpoint's repetition_penalty, EOS, ...): the model gets the greedy config too.
    saved = model.generation_config
    model.generation_config = greedy
    try:
        for seq in ids:
            x = torch.tensor([seq], dtype=torch.long, device=device)
            mask = torch.ones_like(x)
            logits.append(model(input_ids=x, attention_mask=mask).logits[0].float().cpu())
            out = model.generate(input_ids=x, attention_mask=mask, generation_config=greedy)
            conts.append([int(t) for t in out[0, len(seq) :]])
    finally:
        model.generation_config = saved
    return _CausalRun(logits, conts)


def _causal_metrics(ids: list[list[int]], src: _CausalRun, art: _CausalRun) -> CausalMetrics:
    import torch

    agree = 0
    positions = 0
    kl_sum = 0.0
    kl_max = 0.0
    nll_src = 0.0
    nll_art = 0.0
    targets = 0
    for seq, ls, la in zip(ids, src.logits, art.logits, strict=True):
        lp = torch.log_softmax(ls.double(), dim=-1)
        lq = torch.log_softmax(la.double(), dim=-1)
        agree += int((ls.argmax(-1) == la.argmax(-1)).sum())
        positions += ls.shape[0]
        # KL(P || Q) = sum P (log P - log Q); terms with P = 0 contribute 0.
        p = lp.exp()
        kl = torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1).clamp_min(0.0)
        kl_sum += float(kl.sum())
        kl_max = max(kl_max, float(kl.max()))
        nxt = torch.tensor(seq[1:], dtype=torch.long)
        nll_src -= float(lp[:-1].gather(1, nxt[:, None]).sum())
        nll_art -= float(lq[:-1].gather(1, nxt[:, None]).sum())
        targets += len(seq) - 1
    identical = 0
    fractions = []
    for a, b in zip(src.continuations, art.continuations, strict=True):
        prefix = 0
        for x, y in zip(a, b, strict=True):
            if x != y:
                break
            prefix += 1
        identical += int(prefix == len(a))
        fractions.append(prefix / len(a) if a else 1.0)
    return CausalMetrics(
        positions=positions,
        top1_agreement=agree / positions,
        kl_mean=kl_sum / positions,
        kl_max=kl_max,
        perplexity_source=_exp(nll_src / targets),
        perplexity_artifact=_exp(nll_art / targets),
        greedy_prompts=len(src.continuations),
        greedy_identical=identical,
        greedy_token_agreement=float(np.mean(fractions)) if fractions else 1.0,
    )


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _pooling(source_dir: Path | None) -> str:
    if source_dir is not None:
        cfg = source_dir / "1_Pooling" / "config.json"
        if cfg.is_file():
            try:
                doc = loads_strict_json(cfg.read_text("utf-8"))  # nesting bounded
            except (OSError, ValueError) as exc:
                raise UsageError(f"cannot read pooling config: {exc}", path=str(cfg)) from None
            if not isinstance(doc, dict):
                raise UsageError("the pooling config is not a JSON object", path=str(cfg))
            if doc.get("pooling_mode_cls_token"):
                return "cls"
            if doc.get("pooling_mode_mean_tokens", True):
                return "mean"
            raise UsageError(
                "only mean and CLS pooling are supported", path=str(cfg), hint="use mean pooling"
            )
    return "mean"


def _run_encoder(model: Any, ids: list[list[int]], pooling: str, device: str) -> torch.Tensor:
    import torch

    rows = []
    for seq in ids:
        x = torch.tensor([seq], dtype=torch.long, device=device)
        hidden = model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0]
        rows.append((hidden[0] if pooling == "cls" else hidden.mean(0)).double().cpu())
    return torch.stack(rows)


def _encoder_metrics(src: torch.Tensor, art: torch.Tensor, pooling: str) -> EncoderMetrics:
    import torch

    def unit(x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=1, keepdim=True).clamp_min(1e-300)

    us, ua = unit(src), unit(art)
    cos = (us * ua).sum(1)
    nn: float | None = None
    n = src.shape[0]
    if n >= 3:
        eye = torch.eye(n, dtype=torch.bool)
        ss = (us @ us.T).masked_fill(eye, -2.0)
        sa = (ua @ ua.T).masked_fill(eye, -2.0)
        nn = float((ss.argmax(1) == sa.argmax(1)).double().mean())
    return EncoderMetrics(pooling, float(cos.min()), float(cos.mean()), nn)
