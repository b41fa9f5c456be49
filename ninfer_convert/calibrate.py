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
* Tied weights: a hooked Linear whose weight is also the model's ``state_dict`` entry under
  another name (the same tensor: data pointer, shape and strides; never guessed from names)
  that the source checkpoint's safetensors headers store gets its vector, and its factor, under
  that name too, beside its own.  With ``tie_word_embeddings`` the head's statistics are thus
  also ``model.embed_tokens.weight``'s, the only name a tied checkpoint stores the table under.
  Linears sharing one weight share one accumulator.  :attr:`Calibration.aliases` lists the
  ties; the files' metadata records them as ``ninfer.tied``.
* With ``compensation_block`` (an int B, a positive multiple of 128, or ``"full"``: one block
  over the whole row, B = K rounded up to 128) it also computes, per hooked Linear, the factor
  of GPTQ_F16_SEARCH_IW_V1 (docs/encoder-profiles.md): H = X^T X / n over the same tokens
  (float64 sums of each diagonal B x B block of x^T x, so an accumulator holds K * B float64
  values, never K x K for B < K); damping lambda = 0.01 * mean(diag H) (1.0 where that is not
  > 0); per diagonal block, U = the upper Cholesky factor of inv(H_bb + lambda I) in float64
  (torch.linalg), rounded once to binary32 into a [K, B] factor (+0 left of the diagonal and
  right of a partial last block) and checked with the factor rules.  The accumulators of one
  pass are bounded by :data:`PASS_BYTES`: when the model's together exceed it the calibration
  texts are run again for the next batch of Linears (same tokens, same order), so memory
  follows the largest K (x B), not the model.  ``"full"`` is refused before any text is run
  when a factor K x B x 4 bytes would exceed :data:`MAX_FULL_FACTOR_BYTES`; an int B >= K is
  ``"full"`` for that Linear (the same width and cap).  Tensors that
  share an input (q/k/v) each get their own factor (the same values, stored once per tensor).
* The output is a new safetensors file (:mod:`~ninfer_convert.importance`); an existing file is
  never overwritten; the factors go to a second new file (a factor file).
  Vectors are what the model computed on this machine: the converter
  stores the vectors it used in the artifact, so ``verify`` never re-runs calibration.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from .encoder.gptq_reference import BLOCK_UNIT
from .errors import SourceError, UsageError
from .eval_model import _parse_prompts, _tokenize, load_source_model
from .factors import write_factor_file
from .ieee import BINARY32
from .importance import write_importance_file
from .layouts.base import ceil_div

__all__ = [
    "MAX_FULL_FACTOR_BYTES",
    "PASS_BYTES",
    "Calibration",
    "calibrate_source",
    "compensation_factor",
    "default_calibration_texts",
    "parse_block",
    "write_calibration",
]

DAMPING = 0.01
"""lambda = DAMPING * mean(diag H), the damping docs/targets/encoder-profiles.md measured."""

MAX_FULL_FACTOR_BYTES = 64 << 20
"""``--compensation-block full`` refuses a Linear whose K x B binary32 factor exceeds this
(64 MiB: K up to 4096); pick a block size instead."""

PASS_BYTES = 1 << 30
"""The float64 block accumulators of one calibration pass stay within this (1 GiB), unless a
single Linear needs more on its own (then it has a pass to itself)."""

Block = int | str


def parse_block(value: str | int | None) -> Block | None:
    """``--compensation-block``: None, a positive multiple of 128, or ``"full"``."""
    if value is None:
        return None
    if value == "full":
        return "full"
    try:
        b = int(value)
    except (TypeError, ValueError):
        b = -1
    if isinstance(value, bool) or b <= 0 or b % 128:
        raise UsageError(
            f"--compensation-block must be a positive multiple of 128 or 'full', not {value!r}"
        )
    return b


def _block_width(block: Block, k: int, name: str) -> int:
    """The factor width of a Linear with K inputs: B, or for ``"full"`` and any B >= K (one
    block over the whole row either way) K rounded up to 128, under the full-row cap."""
    width = ceil_div(k, BLOCK_UNIT) * BLOCK_UNIT
    if block != "full":
        assert isinstance(block, int)
        if block < k:
            return block
    if k * width * 4 > MAX_FULL_FACTOR_BYTES:
        raise UsageError(
            f"--compensation-block full: {name} has K = {k}, so its factor would take "
            f"{k * width * 4} bytes, over the {MAX_FULL_FACTOR_BYTES} byte cap",
            hint="choose a block size, e.g. --compensation-block 512",
        )
    return width


def compensation_factor(
    blocks: npt.NDArray[np.float64],
    k: int,
    width: int,
    damping: float = DAMPING,
    *,
    name: str | None = None,
) -> npt.NDArray[np.uint32]:
    """The [K, B] binary32 factor words from the diagonal blocks of H ([nblocks, B, B]
    float64, the last one zero-padded past K): see the module contract.  Statistics that are
    not finite (an activation overflowed in the model) or a damped block that Cholesky cannot
    factor are an :class:`~ninfer_convert.errors.EncodeError` naming the Linear ``name``."""
    import torch

    from .errors import EncodeError

    hint = "check the model's activations on the calibration texts (or use other texts)"
    if not np.isfinite(blocks).all():
        raise EncodeError(
            "calibration statistics X^T X / n are not finite, so no compensation factor "
            "can be computed",
            tensor=name,
            hint=hint,
        )
    lam = damping * float(np.mean([blocks[i // width, i % width, i % width] for i in range(k)]))
    if not lam > 0:
        lam = 1.0
    f = np.zeros((k, width), dtype=np.float32)
    for b, b0 in enumerate(range(0, k, width)):
        b1 = min(k, b0 + width)
        hb = torch.from_numpy(blocks[b, : b1 - b0, : b1 - b0] + lam * np.eye(b1 - b0))
        try:
            inv = torch.cholesky_inverse(torch.linalg.cholesky(hb))
            upper = torch.linalg.cholesky(inv, upper=True).numpy()
        except RuntimeError as exc:  # torch.linalg.LinAlgError: not positive-definite
            raise EncodeError(
                f"the damped block of columns {b0}..{b1 - 1} of X^T X / n cannot be "
                f"inverted by Cholesky: {exc}",
                tensor=name,
                hint=hint,
            ) from None
        f[b0:b1, : b1 - b0] = np.triu(upper).astype(np.float32)  # one RNE rounding
    words = f.view(np.uint32)
    words[words == np.uint32(BINARY32.sign_mask)] = 0  # -0 left of the diagonal: one spelling
    return words


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
    factors: dict[str, npt.NDArray[np.uint32]] | None = None
    block: Block | None = None
    passes: int = 1
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    """Linear weight name -> the other names the source stores that same tensor under (a
    tied head); ``vectors`` and ``factors`` hold the statistics under those names too."""


def calibrate_source(
    source: str | os.PathLike[str],
    *,
    texts: Iterable[str] | None = None,
    texts_origin: str | None = None,
    max_tokens: int = 256,
    device: str = "cpu",
    progress: Progress | None = None,
    compensation_block: Block | None = None,
) -> Calibration:
    """Run the source model on the calibration texts and return mean(x_k^2) per Linear (and,
    with ``compensation_block``, the compensation factor per Linear)."""
    block = parse_block(compensation_block)
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

    vocab = int(getattr(model.config.get_text_config(), "vocab_size", 0) or 0)
    toks = _tokenize(transformers, Path(src_path), tlist, vocab)
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    cut = max_tokens if not isinstance(limit, int) else min(max_tokens, limit)
    ids = [x[:cut] for x in toks.ids]
    linears, aliases = _hooked_linears(model, _source_names(src_path))
    for name, extra in aliases.items():
        say(f"{name} is tied to {', '.join(extra)}: its statistics are stored under both names")
    widths = (
        {}
        if block is None
        else {name: _block_width(block, int(m.in_features), name) for name, m in linears}
    )
    say(f"running {len(ids)} calibration texts ({sum(map(len, ids))} tokens)")
    vectors = _mean_squares(model, ids, device, linears)
    factors = None
    passes = 1
    if block is not None:
        factors, passes = _factors(model, ids, device, linears, widths, say)
        passes += 1
    del model
    return Calibration(
        source=src_path,
        model_class=cls.__name__,
        texts=len(ids),
        texts_origin=texts_origin or ("default" if texts is None else "argument"),
        tokens=sum(len(x) for x in ids),
        vectors=_with_aliases(vectors, aliases),
        factors=None if factors is None else _with_aliases(factors, aliases),
        block=block,
        passes=passes,
        aliases=MappingProxyType(aliases),
    )


def _source_names(src_path: str) -> frozenset[str]:
    """The tensor names the source checkpoint itself stores (its safetensors headers)."""
    from .source import open_source

    with open_source(src_path) as src:
        return frozenset(src.tensors)


def _hooked_linears(
    model: Any, stored: frozenset[str]
) -> tuple[list[tuple[str, Any]], dict[str, tuple[str, ...]]]:
    """The Linears to hook as (key, module), and the other names their weights are stored
    under in the source.

    Ties are found by tensor identity (the same data pointer, shape and strides in the
    model's ``state_dict``), never from names: a Linear whose weight Parameter is also the
    model's ``<other>.weight`` gets that name as an alias when the source stores it (a tied
    head: ``lm_head.weight`` is ``model.embed_tokens.weight``, and a tied checkpoint stores
    only the latter).  Linears sharing one weight share one key (the first one's weight
    name), so their statistics add up over every use of that weight."""
    import torch

    state = model.state_dict(keep_vars=True)

    def ident(t: Any) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        ptr = int(t.data_ptr())  # 0 for an empty tensor: identity of the object instead
        return (ptr, tuple(t.shape), tuple(t.stride())) if ptr else (-id(t), (), ())

    names_of: dict[tuple[int, tuple[int, ...], tuple[int, ...]], list[str]] = {}
    for name, t in state.items():
        names_of.setdefault(ident(t), []).append(name)
    linears: list[tuple[str, Any]] = []
    keys: dict[tuple[int, tuple[int, ...], tuple[int, ...]], str] = {}
    own: set[str] = set()
    for mname, module in model.named_modules():
        name = f"{mname}.weight"
        if isinstance(module, torch.nn.Linear) and name in state:
            key = keys.setdefault(ident(state[name]), name)
            linears.append((key, module))
            own.add(name)
    aliases: dict[str, tuple[str, ...]] = {}
    for tid, key in keys.items():
        # Other Linears' own names of the same weight, and the names the source stores.
        extra = tuple(sorted(n for n in names_of[tid] if n != key and (n in own or n in stored)))
        if extra:
            aliases[key] = extra
    return linears, aliases


def _with_aliases(
    arrays: dict[str, npt.NDArray[np.uint32]], aliases: Mapping[str, tuple[str, ...]]
) -> dict[str, npt.NDArray[np.uint32]]:
    """``arrays`` plus, for each key with aliases, the same words under every alias."""
    out = dict(arrays)
    for key, extra in aliases.items():
        if key in arrays:
            out.update((name, arrays[key]) for name in extra)
    return dict(sorted(out.items()))


def _mean_squares(
    model: Any, ids: list[list[int]], device: str, linears: list[tuple[str, Any]]
) -> dict[str, npt.NDArray[np.uint32]]:
    """One pass over the texts: mean(x_k^2) per Linear input, float64 sums, binary32."""
    import torch

    sums: dict[str, Any] = {}
    counts: dict[str, int] = {}

    def hook_for(name: str) -> Callable[..., None]:
        def hook(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0].detach().to(torch.float64)
            x = x.reshape(-1, x.shape[-1])
            s = (x * x).sum(dim=0)
            sums[name] = s if name not in sums else sums[name] + s
            counts[name] = counts.get(name, 0) + int(x.shape[0])

        return hook

    _run_texts(model, ids, device, [(m, hook_for(name)) for name, m in linears])
    vectors: dict[str, npt.NDArray[np.uint32]] = {}
    for name in sorted(sums):
        mean64 = (sums[name] / counts[name]).cpu().numpy().astype(np.float64)
        vectors[name] = mean64.astype(np.float32).view(np.uint32)  # one RNE rounding
    return vectors


def _run_texts(
    model: Any, ids: list[list[int]], device: str, hooks: list[tuple[Any, Callable[..., None]]]
) -> None:
    """Run every calibration text once with ``hooks`` as forward pre-hooks."""
    import torch

    handles = [m.register_forward_pre_hook(h) for m, h in hooks]
    try:
        with torch.inference_mode():
            for x in ids:
                model(input_ids=torch.tensor([x], dtype=torch.long, device=device))
    finally:
        for h in handles:
            h.remove()


def _factors(
    model: Any,
    ids: list[list[int]],
    device: str,
    linears: list[tuple[str, Any]],
    widths: dict[str, int],
    say: Progress,
) -> tuple[dict[str, npt.NDArray[np.uint32]], int]:
    """The factor of every Linear, accumulating its diagonal blocks of x^T x over the texts in
    passes of at most :data:`PASS_BYTES` of accumulators; (factors, passes run)."""

    shared: dict[str, list[tuple[str, Any]]] = {}  # Linears sharing one weight: one pass
    for name, m in linears:
        shared.setdefault(name, []).append((name, m))
    batches: list[list[tuple[str, Any]]] = [[]]
    used = 0
    for name, group in shared.items():
        k = int(group[0][1].in_features)
        need = ceil_div(k, widths[name]) * widths[name] ** 2 * 8
        if batches[-1] and used + need > PASS_BYTES:
            batches.append([])
            used = 0
        batches[-1].extend(group)
        used += need
    factors: dict[str, npt.NDArray[np.uint32]] = {}
    for i, batch in enumerate(batches):
        acc: dict[str, Any] = {}
        counts: dict[str, int] = {}
        say(f"compensation pass {i + 1}/{len(batches)}: {len(batch)} Linear inputs")
        hooks = [
            (m, _block_hook(name, int(m.in_features), widths[name], acc, counts))
            for name, m in batch
        ]
        _run_texts(model, ids, device, hooks)
        for name, m in batch:
            if name not in acc:
                continue
            h = (acc.pop(name) / counts[name]).numpy()
            factors[name] = _checked(
                compensation_factor(h, int(m.in_features), widths[name], name=name), name
            )
    return factors, len(batches)


def _block_hook(
    name: str, k: int, width: int, acc: dict[str, Any], counts: dict[str, int]
) -> Callable[..., None]:
    """A pre-hook adding the diagonal ``width``-blocks of x^T x (float64) to ``acc[name]``."""
    import torch

    def hook(_module: Any, args: tuple[Any, ...]) -> None:
        x = args[0].detach().to(torch.float64).reshape(-1, k).cpu()
        if name not in acc:
            acc[name] = torch.zeros((ceil_div(k, width), width, width), dtype=torch.float64)
        for b, b0 in enumerate(range(0, k, width)):
            xb = x[:, b0 : min(k, b0 + width)]
            acc[name][b, : xb.shape[1], : xb.shape[1]] += xb.T @ xb
        counts[name] = counts.get(name, 0) + int(x.shape[0])

    return hook


def _checked(words: npt.NDArray[np.uint32], name: str) -> npt.NDArray[np.uint32]:
    from .encoder.gptq import check_factor
    from .errors import EncodeError

    try:
        return check_factor(words, words.shape[0], name)
    except EncodeError as exc:
        raise EncodeError(
            f"calibration produced an invalid compensation factor: {exc.message}",
            tensor=name,
            hint="the damped block was too ill-conditioned for binary32; use more or other "
            "calibration texts",
        ) from None


def write_calibration(
    cal: Calibration,
    output: str | os.PathLike[str],
    factors_output: str | os.PathLike[str] | None = None,
) -> None:
    """Write the vectors as a new importance file (metadata says how they were made), and
    the factors, when computed, as a new factor file ``factors_output``.  With ties, both
    files' metadata has ``ninfer.tied``: ``LINEAR=ALIAS[,ALIAS]`` pairs, ``;``-separated."""
    tied = (
        {"ninfer.tied": ";".join(f"{k}={','.join(v)}" for k, v in sorted(cal.aliases.items()))}
        if cal.aliases
        else {}
    )
    if cal.factors is not None:
        if factors_output is None:
            raise UsageError("the factors need an output file (--factors FILE)")
        write_factor_file(
            factors_output,
            cal.factors,
            {
                "ninfer.statistic": "upper Cholesky factor of inv(H_bb + lambda I) per "
                "diagonal block, H = X^T X / n in float64, binary32",
                "ninfer.damping": f"{DAMPING} * mean(diag H)",
                "ninfer.block": str(cal.block),
                "ninfer.model_class": cal.model_class,
                "ninfer.texts": str(cal.texts),
                "ninfer.tokens": str(cal.tokens),
            }
            | tied,
        )
    write_importance_file(
        output,
        cal.vectors,
        {
            "ninfer.statistic": "mean(x_k^2) over tokens, float64 sums, binary32",
            "ninfer.model_class": cal.model_class,
            "ninfer.texts": str(cal.texts),
            "ninfer.texts_origin": cal.texts_origin,
            "ninfer.tokens": str(cal.tokens),
        }
        | tied,
    )
