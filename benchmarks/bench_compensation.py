"""What error compensation across columns buys at Q4G64_F16S: evidence, not product code.

For one model directory (``--model``), in one process, with the metric code of ``ninfer eval``
(``ninfer_convert.evaluate``: the same prompts, top-1 / KL / perplexity for causal LMs, pooled
cosine for encoders):

1. calibration: the packaged calibration texts of ``ninfer calibrate`` are run through the
   source model; a forward pre-hook on every Linear accumulates H = X^T X / n in float64;
2. every variant quantizes the set Q of bench_quality.py (``_RULES``: every linear weight, and
   for BERT the word embeddings) and loads the dequantized values into the same model:

   * ``canonical``, ``mse``: MAXABS_F16_RECIP_RNE_V1, MSE_F16_SEARCH_V1 (the product encoders);
   * ``iw``: MSE_F16_SEARCH_IW_V1 with diag(H) as importance (what ``ninfer calibrate`` writes);
   * ``q4_0``: gguf-py's reference Q4_0 (byte-identical to llama-quantize's Q4_0 on these
     models, docs/targets/encoder-profiles.md), 4.5 bits per weight;
   * ``comp<B>`` / ``comp<B>iw``: the block-compensated encoder of ``encoder/gptq.py`` (the exact
     product code of docs/encoder-profiles.md, "Error compensation across columns"; its C
     kernel where built), factor =
     upper Cholesky factor of the inverse of each damped diagonal B-block of H, rounded to
     binary32; ``iw`` adds diag(H) as the scale search's importance; ``compfull`` is B >= K;

   tensors without a Linear input (BERT's word embeddings) take MSE_F16_SEARCH_V1 in every
   variant but canonical and q4_0.  Also printed: the proxy error sum_n d_n^T H d_n.

Example::

    python benchmarks/bench_compensation.py --model smollm2-135m-st \\
        --variants canonical,iw,q4_0,comp128iw --json smol.json

``--speed`` (no model) instead times the encoder itself, one thread: M weights/s of
``encode_compensated`` with the numpy encoder and with the C kernel (``_gptqkernel.c``), both
bit-identical (checked here on the rows both encode), on [576, 1536] and [4096, 4096] Gaussian
BF16 weights with calibration-like factors (damped AR(1) activations with random column
scales) at B = 128, 256, 512 and B >= K; numpy on the first ``--numpy-rows`` rows only (rows
are independent, so its rate per weight is the same), rounds interleaved, best of
``--repeat``; the thread's CPU time beside the wall time (the machine is shared)::

    python benchmarks/bench_compensation.py --speed --json speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ninfer_convert.calibrate import default_calibration_texts
from ninfer_convert.encoder import encode_grouped_words
from ninfer_convert.encoder.gptq import encode_compensated
from ninfer_convert.evaluate import (
    _causal_metrics,
    _encoder_metrics,
    _pooling,
    _run_causal,
    _run_encoder,
    _tokenize,
    default_prompts,
    load_source_model,
)
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_IW_V1, MSE_F16_SEARCH_V1

FORMAT = "Q4G64_F16S"
G = 64


def in_q(name: str, model_type: str) -> bool:
    """The Q set of bench_quality.py's recipes."""
    if not name.endswith(".weight"):
        return False
    if model_type == "bert":
        return not re.search(
            r"(\.bias|LayerNorm\.weight|position_embeddings\.weight|token_type_embeddings\.weight"
            r"|pooler\.dense\.weight)$",
            name,
        )
    return not (name.endswith("norm.weight") or name == "model.embed_tokens.weight")


def dequant(codes: np.ndarray[Any, Any], scales: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    s = np.repeat(scales.view(np.float16).astype(np.float32), G, axis=1)[:, : codes.shape[1]]
    return (codes.astype(np.float32) * s).astype(np.float32)


def factor(h: np.ndarray[Any, Any], block: int, damp: float) -> np.ndarray[Any, Any]:
    """[K, B] binary32: per diagonal block, upper Cholesky factor of inv(H_bb + lam I)."""
    k = h.shape[0]
    lam = damp * float(np.mean(np.diag(h)))
    if not lam > 0:
        lam = 1.0
    f = np.zeros((k, block), dtype=np.float32)
    for b0 in range(0, k, block):
        b1 = min(k, b0 + block)
        hb = torch.from_numpy(h[b0:b1, b0:b1] + lam * np.eye(b1 - b0))
        inv = torch.cholesky_inverse(torch.linalg.cholesky(hb))
        f[b0:b1, : b1 - b0] = torch.linalg.cholesky(inv, upper=True).numpy()
    return f


def q4_0(w: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    import gguf

    qb = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    back = gguf.quants.dequantize(qb, gguf.GGMLQuantizationType.Q4_0)
    return np.asarray(back, dtype=np.float32).reshape(w.shape)


def quantize(
    v: str, w: np.ndarray[Any, Any], h: np.ndarray[Any, Any] | None, damp: float
) -> np.ndarray[Any, Any]:
    words = w.view(np.uint32)
    if v == "canonical":
        gc = encode_grouped_words(words, "F32", FORMAT)
    elif v == "q4_0":
        return q4_0(w)
    elif v == "mse" or h is None:
        gc = encode_grouped_words(words, "F32", FORMAT, profile=MSE_F16_SEARCH_V1)
    elif v == "iw":
        imp = np.diagonal(h).astype(np.float32)
        gc = encode_grouped_words(
            words, "F32", FORMAT, profile=MSE_F16_SEARCH_IW_V1, importance=imp
        )
    else:
        m = re.fullmatch(r"comp(\d+|full)(iw)?", v)
        if m is None:
            raise SystemExit(f"unknown variant {v!r}")
        k = w.shape[1]
        block = -(-k // 128) * 128 if m.group(1) == "full" else int(m.group(1))
        imp = np.diagonal(h).astype(np.float32) if m.group(2) else None
        gc = encode_compensated(
            words, "F32", FORMATS[FORMAT], factor(h, block, damp), weights=imp
        )
    return dequant(gc.codes, gc.scales)


def speed_factor(k: int, block: int, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """A calibration-like factor: H = D T D with T the AR(1) correlation 0.9^|i-j| and D
    random column scales, through :func:`factor` (damped, per diagonal block)."""
    idx = np.arange(k)
    t = 0.9 ** np.abs(idx[:, None] - idx[None, :]).astype(np.float64)
    d = rng.uniform(0.2, 3.0, k)
    return factor(t * d[:, None] * d[None, :], block, 0.01)


def speed(shapes: list[tuple[int, int]], numpy_rows: int, repeat: int) -> dict[str, Any]:
    """M weights/s of both encoders per shape and block width (see the module docstring)."""
    rng = np.random.default_rng(0)
    fmt = FORMATS[FORMAT]
    out: dict[str, Any] = {"uptime_before": os.getloadavg(), "rows": []}
    for n, k in shapes:
        x = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        words = (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        m = min(n, numpy_rows)
        for block in (128, 256, 512, -(-k // 128) * 128):
            f = speed_factor(k, block, rng)
            best = {"numpy": (np.inf, np.inf), "native": (np.inf, np.inf)}
            got = {}
            for _ in range(repeat):
                for kernel, rows in (("numpy", m), ("native", n)):
                    w0, c0 = time.perf_counter(), time.thread_time()
                    got[kernel] = encode_compensated(words[:rows], "BF16", fmt, f, kernel=kernel)
                    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                    best[kernel] = (min(best[kernel][0], wall), min(best[kernel][1], cpu))
            same = (
                got["numpy"].codes.tobytes() == got["native"].codes[:m].tobytes()
                and got["numpy"].scales.tobytes() == got["native"].scales[:m].tobytes()
            )
            if not same:
                raise SystemExit(f"[{n}, {k}] B = {block}: the encoders differ")
            row: dict[str, Any] = {"shape": [n, k], "block": block, "numpy_rows": m}
            for kernel, rows in (("numpy", m), ("native", n)):
                wall, cpu = best[kernel]
                row[kernel] = {"wall_mw_s": rows * k / wall / 1e6, "cpu_mw_s": rows * k / cpu / 1e6}
            row["speedup_cpu"] = row["native"]["cpu_mw_s"] / row["numpy"]["cpu_mw_s"]
            out["rows"].append(row)
            print(f"[{n}, {k}] B = {block:5d}: numpy {row['numpy']['cpu_mw_s']:7.2f} "
                  f"(wall {row['numpy']['wall_mw_s']:7.2f}), C {row['native']['cpu_mw_s']:7.2f} "
                  f"(wall {row['native']['wall_mw_s']:7.2f}) M weights/s (CPU time); "
                  f"{row['speedup_cpu']:.1f}x", flush=True)  # fmt: skip
    out["uptime_after"] = os.getloadavg()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="model directory (config.json, weights)")
    ap.add_argument("--speed", action="store_true", help="time the encoders (no model)")
    ap.add_argument("--numpy-rows", type=int, default=256, help="--speed: rows numpy encodes")
    ap.add_argument("--repeat", type=int, default=2, help="--speed: rounds (best is kept)")
    ap.add_argument("--variants", default="canonical,mse,iw,q4_0,comp128,comp128iw")
    ap.add_argument("--damp", type=float, default=0.01, help="lambda: H + lambda*mean(diag H)*I")
    ap.add_argument("--calib-tokens", type=int, default=256)
    ap.add_argument("--json", type=Path, required=True, help="results (merged into if present)")
    a = ap.parse_args()
    if a.speed:
        torch.set_num_threads(1)
        result = speed([(576, 1536), (4096, 4096)], a.numpy_rows, a.repeat)
        print(f"load average before {result['uptime_before']}, after {result['uptime_after']}")
        a.json.write_text(json.dumps(result, indent=1))
        return
    if a.model is None:
        raise SystemExit("--model is required (or --speed)")
    torch.set_num_threads(2)
    src = a.model
    transformers, model, _cls, kind = load_source_model(src, "cpu", "float32", lambda m: None)
    cfg = json.loads((Path(src) / "config.json").read_text())
    sd = model.state_dict()
    orig = {k: v.detach().clone() for k, v in sd.items()}
    qnames = [k for k in sd if in_q(k, cfg["model_type"]) and sd[k].dim() == 2]
    if cfg.get("tie_word_embeddings"):
        qnames = [k for k in qnames if k != "lm_head.weight"]
    vocab = int(getattr(model.config.get_text_config(), "vocab_size", 0) or 0)
    ctoks = _tokenize(transformers, Path(src), default_calibration_texts(), vocab)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    handles = []
    for mname, mod in model.named_modules():
        wn = f"{mname}.weight"
        if isinstance(mod, torch.nn.Linear) and wn in sd:

            def hook(_m: Any, args: Any, wn: str = wn) -> None:
                x = args[0].detach().to(torch.float64).reshape(-1, args[0].shape[-1])
                sums[wn] = sums[wn] + x.T @ x if wn in sums else x.T @ x
                counts[wn] = counts.get(wn, 0) + x.shape[0]

            handles.append(mod.register_forward_pre_hook(hook))
    with torch.inference_mode():
        for ids in ctoks.ids:
            model(input_ids=torch.tensor([ids[: a.calib_tokens]]))
    for hd in handles:
        hd.remove()
    hess = {k: (v / counts[k]).numpy() for k, v in sums.items()}
    tokens = sum(min(len(x), a.calib_tokens) for x in ctoks.ids)
    print(f"{len(qnames)} Q tensors; calibration {len(ctoks.ids)} texts, {tokens} tokens")
    toks = _tokenize(transformers, Path(src), default_prompts(), vocab)
    pooling = _pooling(Path(src)) if kind != "causal-lm" else ""
    with torch.inference_mode():
        if kind == "causal-lm":
            ref: Any = _run_causal(model, toks.ids, 16, "cpu")
        else:
            ref = _run_encoder(model, toks.ids, pooling, "cpu")
    results = json.loads(a.json.read_text()) if a.json.exists() else {}
    for v in a.variants.split(","):
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        proxy = 0.0
        new = {}
        for k in qnames:
            w = orig[k].numpy().astype(np.float32)
            h = hess.get(k)
            new[k] = quantize(v, w, h, a.damp)
            if h is not None:
                d = torch.from_numpy(new[k].astype(np.float64) - w.astype(np.float64))
                proxy += float(((d @ torch.from_numpy(h)) * d).sum())
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            for k in qnames:
                sd[k].copy_(torch.from_numpy(new[k]))
        with torch.inference_mode():
            if kind == "causal-lm":
                met = _causal_metrics(toks.ids, ref, _run_causal(model, toks.ids, 16, "cpu"))
            else:
                emb = _run_encoder(model, toks.ids, pooling, "cpu")
                met = _encoder_metrics(ref, emb, pooling)
        with torch.no_grad():
            for k in qnames:
                sd[k].copy_(orig[k])
        row = {"metrics": met.__dict__, "quantize_s": round(seconds, 1), "proxy_error": proxy,
               "load_before": load0, "load_after": os.getloadavg()[0], "damp": a.damp}  # fmt: skip
        results[v] = row
        print(f"{v:14s} {seconds:7.1f}s proxy {proxy:.4e} {met.__dict__}", flush=True)
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
