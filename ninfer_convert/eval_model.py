"""The transformers side of ``ninfer eval`` and ``ninfer calibrate``: prompts, tokens, the
source model, and the artifact's weights loaded into it.

Contract (docs/cli.md, "ninfer eval"): prompts are the packaged default set or a UTF-8 file,
one per line, blank and ``#`` lines ignored; they are tokenized with the source's tokenizer, or
as UTF-8 bytes when the source has no tokenizer files (``vocab_size`` at least 256), and every
prompt needs at least 2 tokens.  :func:`load_source_model` loads the class the source's
config.json names (``architectures[0]``) with transformers' own ``from_pretrained``;
:func:`load_artifact_into` overwrites every model tensor, one at a time, and refuses an
artifact that would leave source weights in the model.  Every refusal is a typed error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ArtifactError, UsageError
from .eval_report import Kind
from .source import open_source

if TYPE_CHECKING:
    import torch

__all__ = [
    "INTEROP_HINT",
    "Progress",
    "default_prompts",
    "load_artifact_into",
    "load_source_model",
    "read_prompts",
]

Progress = Callable[[str], None]


_CAUSAL_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")


INTEROP_HINT = "install the interop extra: pip install 'ninfer-convert[interop]'"


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
