"""The ``ninfer eval`` report: its metrics, their JSON form and the opt-in thresholds.

Contract: every type is a frozen dataclass whose ``to_dict`` is the ``--json`` form of
docs/cli.md ("ninfer eval"); a non-finite metric is written as ``null`` (JSON has no NaN or
infinity).  :func:`threshold_failures` turns the thresholds the user asked for into sentences;
the library never raises for a number, the CLI turns failures into
:class:`~ninfer_convert.errors.QualityError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import UsageError

__all__ = [
    "CausalMetrics",
    "EncoderMetrics",
    "EvalReport",
    "Kind",
    "TensorSqnr",
    "threshold_failures",
]


Kind = Literal["causal-lm", "encoder"]


@dataclass(frozen=True)
class CausalMetrics:
    positions: int
    """Prompt positions compared (every token of every prompt)."""
    top1_agreement: float
    kl_mean: float
    kl_max: float
    perplexity_source: float
    perplexity_artifact: float
    greedy_prompts: int
    greedy_identical: int
    """Prompts whose whole greedy continuation is identical."""
    greedy_token_agreement: float
    """Mean over prompts of (common prefix length / continuation length)."""

    def to_dict(self) -> dict[str, Any]:
        src, art = self.perplexity_source, self.perplexity_artifact
        change = art / src - 1.0 if math.isfinite(src) and math.isfinite(art) and src else None
        return {
            "positions": self.positions,
            "top1_agreement": self.top1_agreement,
            "kl_mean": _json_number(self.kl_mean),
            "kl_max": _json_number(self.kl_max),
            "perplexity_source": _json_number(src),
            "perplexity_artifact": _json_number(art),
            "perplexity_change": _json_number(change),
            "greedy": {
                "prompts": self.greedy_prompts,
                "identical": self.greedy_identical,
                "token_agreement": self.greedy_token_agreement,
            },
        }


@dataclass(frozen=True)
class EncoderMetrics:
    pooling: str
    cosine_min: float
    cosine_mean: float
    nearest_neighbour_agreement: float | None
    """None with fewer than three prompts."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pooling": self.pooling,
            "cosine_min": _json_number(self.cosine_min),
            "cosine_mean": _json_number(self.cosine_mean),
            "nearest_neighbour_agreement": self.nearest_neighbour_agreement,
        }


@dataclass(frozen=True)
class TensorSqnr:
    name: str
    """Source name of the tensor (names="source")."""
    stored: str
    format: str
    sqnr_db: float | None
    """10 log10(sum x^2 / sum (x - y)^2); None when ``exact``, when the source is all zeros
    and the artifact is not, or when a sum is not finite (an infinity, or a NaN in one of the
    two only): no finite ratio.  A NaN or infinity at the same place in both counts as equal."""
    exact: bool
    """The artifact's values equal the source's (no noise)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stored": self.stored,
            "format": self.format,
            "sqnr_db": self.sqnr_db,
            "exact": self.exact,
        }


@dataclass(frozen=True)
class EvalReport:
    artifact: str
    source: str
    model_class: str | None
    kind: Kind | None
    tokenizer: str | None
    device: str
    dtype: str
    """The model's compute dtype (``float32`` or ``bfloat16``)."""
    prompts_origin: str
    prompts: int
    prompt_tokens: int
    max_tokens: int
    causal: CausalMetrics | None = None
    encoder: EncoderMetrics | None = None
    sqnr: tuple[TensorSqnr, ...] | None = None
    elapsed_s: float = 0.0
    unused_tensors: tuple[str, ...] = ()
    """Artifact tensors the model class has no place for (not compared)."""
    thresholds: dict[str, float | None] = field(default_factory=dict)
    failures: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        sq: dict[str, Any] | None = None
        if self.sqnr is not None:
            finite = [t.sqnr_db for t in self.sqnr if t.sqnr_db is not None]
            sq = {
                "tensors": [t.to_dict() for t in self.sqnr],
                "min_db": min(finite) if finite else None,
                "exact": sum(1 for t in self.sqnr if t.exact),
            }
        return {
            "artifact": self.artifact,
            "source": self.source,
            "model": {"class": self.model_class, "kind": self.kind, "tokenizer": self.tokenizer},
            "device": self.device,
            "dtype": self.dtype,
            "prompts": {
                "origin": self.prompts_origin,
                "count": self.prompts,
                "tokens": self.prompt_tokens,
            },
            "max_tokens": self.max_tokens,
            "causal_lm": None if self.causal is None else self.causal.to_dict(),
            "encoder": None if self.encoder is None else self.encoder.to_dict(),
            "sqnr": sq,
            "unused_tensors": list(self.unused_tensors),
            "thresholds": dict(self.thresholds),
            "failures": list(self.failures),
            "elapsed_s": round(self.elapsed_s, 3),
        }


def threshold_failures(
    report: EvalReport,
    *,
    min_top1: float | None = None,
    max_kl: float | None = None,
    min_cosine: float | None = None,
) -> list[str]:
    """Each opt-in threshold the report misses, as a sentence (empty: all met).

    A threshold for a metric the report does not have (``--min-cosine`` on a causal LM) is a
    usage error, never silently met."""
    out: list[str] = []
    c, e = report.causal, report.encoder
    if (min_top1 is not None or max_kl is not None) and c is None:
        raise UsageError("--min-top1 / --max-kl apply to causal LMs; this model is not one")
    if min_cosine is not None and e is None:
        raise UsageError("--min-cosine applies to encoder models; this model is not one")
    if c is not None and min_top1 is not None and not c.top1_agreement >= min_top1:
        out.append(f"top-1 agreement {c.top1_agreement:.4f} is below --min-top1 {min_top1}")
    if c is not None and max_kl is not None and not c.kl_mean <= max_kl:
        out.append(f"mean KL {c.kl_mean:.6f} is above --max-kl {max_kl}")
    if e is not None and min_cosine is not None and not e.cosine_min >= min_cosine:
        out.append(f"minimum cosine {e.cosine_min:.6f} is below --min-cosine {min_cosine}")
    return out


def _json_number(x: float | None) -> float | None:
    """JSON has no NaN or infinity: a non-finite metric (NaN weights, overflow) is null."""
    return x if x is not None and math.isfinite(x) else None
