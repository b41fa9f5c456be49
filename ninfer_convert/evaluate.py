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

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .container import Artifact, check_artifact_path, open_artifact
from .errors import ArtifactError, ResourceError, SourceError, UsageError
from .loader import ArtifactStateDict, load_state_dict
from .source import open_source
from .source.header import loads_strict_json
from .words import bf16_to_f32_words, f16_to_f32_words

if TYPE_CHECKING:
    import torch

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

Kind = Literal["causal-lm", "encoder"]
Progress = Callable[[str], None]

_CAUSAL_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")
INTEROP_HINT = "install the interop extra: pip install 'ninfer-convert[interop]'"


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


# ---------------------------------------------------------------------------------------------
# prompts


def _parse_prompts(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def default_prompts() -> list[str]:
    """The packaged default prompts (ninfer_convert/data/eval-prompts.txt)."""
    text = resources.files("ninfer_convert").joinpath("data/eval-prompts.txt").read_text("utf-8")
    return _parse_prompts(text)


def read_prompts(path: str | os.PathLike[str]) -> list[str]:
    """Prompts from a UTF-8 file: one per line; blank lines and ``#`` lines ignored."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read prompts: {exc}", path=str(p)) from None
    prompts = _parse_prompts(text)
    if not prompts:
        raise UsageError("the prompts file holds no prompt", path=str(p))
    return prompts


# ---------------------------------------------------------------------------------------------
# model loading


def _require_transformers(command: str = "ninfer eval") -> Any:
    try:
        import transformers
    except ImportError:
        raise UsageError(
            f"{command} needs transformers, which is not installed", hint=INTEROP_HINT
        ) from None
    return transformers


def _model_class(
    transformers: Any, config: Mapping[str, Any] | None, where: str
) -> tuple[Any, Kind]:
    archs = config.get("architectures") if config else None
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise UsageError(
            "the source config.json names no architectures, so the model class is unknown",
            path=where,
            hint="add architectures to config.json",
        )
    name = archs[0]
    cls = getattr(transformers, name, None)
    if cls is None:
        raise UsageError(
            f"transformers {transformers.__version__} has no model class {name!r}",
            path=where,
            hint="upgrade transformers",
        )
    if name.endswith(_CAUSAL_SUFFIXES):
        return cls, "causal-lm"
    if name.endswith("Model"):
        return cls, "encoder"
    raise UsageError(
        f"{name} is neither a causal LM nor an encoder model; eval supports those two",
        path=where,
    )


def load_source_model(
    src_path: str, device: str, dtype: str, say: Progress, command: str = "ninfer eval"
) -> tuple[Any, Any, Any, Kind]:
    """Load the source model directory with transformers (``architectures[0]`` of its
    config.json) in eval mode on ``device``; returns (transformers, model, class, kind).  Shared
    by ``ninfer eval`` and ``ninfer calibrate``: typed errors for a missing extra, a single file,
    a quantized source, an unknown class and encoder-decoder models."""
    transformers = _require_transformers(command)
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was requested but torch sees no CUDA device")
    src_dir = Path(src_path)
    if not src_dir.is_dir():
        raise UsageError(
            f"{command} runs the source with transformers, which needs a model directory "
            "(config.json and weights), not a single file",
            path=src_path,
            hint="pass the model directory"
            + (" with --source, or use --sqnr-only" if command == "ninfer eval" else ""),
        )
    # The source reader's checks (weights present, config.json a bounded JSON object):
    # typed errors here rather than a traceback from from_pretrained.
    config = open_source(src_dir).config
    if config is not None and "quantization_config" in config:
        raise UsageError(
            f"the source is itself quantized (config.json has a quantization_config); {command} "
            "needs a dense source model",
            path=src_path,
            hint="use the dense checkpoint the quantized one was made from"
            + (
                ", or --sqnr-only (copied words are checked bit for bit by ninfer verify)"
                if command == "ninfer eval"
                else ""
            ),
        )
    cls, kind = _model_class(transformers, config, src_path)
    say(f"loading the source into {cls.__name__}")
    model_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    model = cls.from_pretrained(src_path, dtype=model_dtype).to(device).eval()
    if getattr(model.config, "is_encoder_decoder", False):
        # T5, BART, Whisper: "...ForConditionalGeneration" too, but not run like either kind.
        raise UsageError(
            f"{cls.__name__} is an encoder-decoder model; {command} supports causal LMs and "
            "encoders",
            path=src_path,
            hint="use --sqnr-only to compare the values" if command == "ninfer eval" else None,
        )
    return transformers, model, cls, kind


def load_artifact_into(
    model: Any, weights: Mapping[str, torch.Tensor], where: str
) -> tuple[str, ...]:
    """Overwrite every model tensor from ``weights``, one at a time; returns the artifact
    tensors the model has no place for (in stored order; e.g. ``mtp.*`` for Qwen3.5 or a
    non-persistent buffer a checkpoint carries).

    Raises ArtifactError when a model tensor is not provided (unless tied to a provided one)
    or a provided tensor's shape differs from the model's: either would leave source weights
    in the model and make the comparison meaningless."""
    import torch

    targets = model.state_dict(keep_vars=True)
    unused: list[str] = []
    shape_bad: list[str] = []
    done: set[str] = set()
    with torch.no_grad():
        for key in weights:
            target = targets.get(key)
            if target is None:
                unused.append(key)
                continue
            value = weights[key]
            if tuple(value.shape) != tuple(target.shape):
                shape_bad.append(f"{key} {list(value.shape)} vs model {list(target.shape)}")
                continue
            target.copy_(value)
            done.add(key)
            del value
    covered = {targets[k].data_ptr() for k in done}
    missing = [k for k in targets if k not in done and targets[k].data_ptr() not in covered]
    if missing or shape_bad:
        parts = []
        if missing:
            parts.append(f"{len(missing)} model tensors not in the artifact ({missing[:5]})")
        if shape_bad:
            parts.append(f"shape differences: {shape_bad[:5]}")
        if unused:
            parts.append(f"{len(unused)} artifact tensors not in the model ({unused[:5]})")
        raise ArtifactError(
            "the artifact does not fill the source's model class: " + "; ".join(parts),
            path=where,
            hint="the recipe must keep every tensor the model uses, under its source name",
        )
    return tuple(unused)


# ---------------------------------------------------------------------------------------------
# tokenization


@dataclass(frozen=True)
class _Tokens:
    ids: list[list[int]]
    how: str


def _tokenize(transformers: Any, source_dir: Path, prompts: list[str], vocab: int) -> _Tokens:
    has_tok = any((source_dir / f).is_file() for f in _TOKENIZER_FILES)
    if has_tok:
        tok = transformers.AutoTokenizer.from_pretrained(str(source_dir))
        ids = [list(tok(p)["input_ids"]) for p in prompts]
        how = type(tok).__name__
    else:
        if vocab < 256:
            raise UsageError(
                f"the source has no tokenizer and a vocabulary of {vocab} (< 256), so prompts "
                "cannot be encoded as bytes",
                path=str(source_dir),
                hint="add tokenizer files to the source directory",
            )
        ids = [list(p.encode("utf-8")) for p in prompts]
        how = "utf-8-bytes"
    empty = [i for i, x in enumerate(ids) if len(x) < 2]
    if empty:
        raise UsageError(
            f"prompt {empty[0] + 1} has fewer than 2 tokens; every prompt needs at least 2",
            hint="use longer prompts",
        )
    return _Tokens(ids, how)


# ---------------------------------------------------------------------------------------------
# runs


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


def _json_number(x: float | None) -> float | None:
    """JSON has no NaN or infinity: a non-finite metric (NaN weights, overflow) is null."""
    return x if x is not None and math.isfinite(x) else None


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


# ---------------------------------------------------------------------------------------------
# SQNR


def _source_f64(words: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    if dtype == "BF16":
        return (
            bf16_to_f32_words(np.asarray(words, dtype=np.uint16))
            .view(np.float32)
            .astype(np.float64)
        )
    if dtype == "F16":
        return (
            f16_to_f32_words(np.asarray(words, dtype=np.uint16)).view(np.float32).astype(np.float64)
        )
    if dtype == "F32":
        return np.asarray(words, dtype=np.uint32).view(np.float32).astype(np.float64)
    if dtype == "F64":
        return np.asarray(words, dtype=np.uint64).view(np.float64)
    return np.asarray(words).astype(np.float64)


def _sqnr(
    weights: ArtifactStateDict, source_path: str, progress: Progress | None
) -> tuple[TensorSqnr, ...]:
    src = open_source(source_path)
    out: list[TensorSqnr] = []
    art: Artifact = weights.artifact
    for i, key in enumerate(weights):
        stored = weights.stored_name(key)
        fmt = art.tensors[stored].format
        copied = any(
            t["op"] == "copy-quantized" for t in art.tensors[stored].provenance["transforms"]
        )
        if copied or key not in src.tensors:
            continue  # a copy-path output: its source is an encoding, not values
        x = _source_f64(src.read(key).words, src.tensors[key].dtype)
        y = weights[key].double().numpy()
        # A NaN or infinity the artifact keeps in place (stored losslessly) is no noise.
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        with np.errstate(invalid="ignore", over="ignore"):
            noise = float(np.sum(np.where(same, 0.0, x - y) ** 2))
            signal = float(np.sum(np.where(np.isnan(x) & np.isnan(y), 0.0, x) ** 2))
        finite = math.isfinite(noise) and math.isfinite(signal)
        db = (
            10 * (math.log10(signal) - math.log10(noise))
            if finite and noise > 0 and signal > 0
            else None
        )
        out.append(TensorSqnr(key, stored, fmt, db, noise == 0))
        if progress is not None and (i + 1) % 50 == 0:
            progress(f"sqnr {i + 1}/{len(weights)}")
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# entry point


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
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise UsageError(f"--max-tokens must be a positive integer, not {max_tokens!r}")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}", hint="use cpu or cuda")
    if dtype not in ("float32", "bfloat16"):
        raise UsageError(f"unknown model dtype {dtype!r}", hint="use float32 or bfloat16")
    if not run_model and not sqnr:
        raise UsageError("nothing to do: the model run is off and SQNR was not asked for")
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
        report_kw.update(
            model_class=cls.__name__,
            kind=kind,
            tokenizer=toks.how,
            prompt_tokens=sum(len(x) for x in toks.ids),
        )
        with torch.inference_mode():
            if kind == "causal-lm":
                say(f"running the source on {len(plist)} prompts")
                ref = _run_causal(model, toks.ids, max_tokens, device)
            else:
                pooling = _pooling(src_dir)
                say(f"embedding {len(plist)} prompts with the source")
                emb_src = _run_encoder(model, toks.ids, pooling, device)
        say("loading the artifact's dequantized weights into the same model")
        report_kw["unused_tensors"] = load_artifact_into(model, weights, str(artifact))
        with torch.inference_mode():
            if kind == "causal-lm":
                say(f"running the artifact on {len(plist)} prompts")
                got = _run_causal(model, toks.ids, max_tokens, device)
                report_kw["causal"] = _causal_metrics(toks.ids, ref, got)
            else:
                say(f"embedding {len(plist)} prompts with the artifact")
                emb_art = _run_encoder(model, toks.ids, pooling, device)
                report_kw["encoder"] = _encoder_metrics(emb_src, emb_art, pooling)
        del model
        return EvalReport(sqnr=sq, elapsed_s=time.perf_counter() - started, **report_kw)
    finally:
        art.close()


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
