"""Quality of 4-bit models: ninfer Q4G64_F16S (every grouped encoder profile) vs llama.cpp.

Evidence for issue 16, not product code.  For each model directory given with ``--model``:

* **ninfer**: one artifact per encoder profile registered in ``formats.ENCODER_PROFILES`` that
  can produce Q4G64_F16S (``ninfer convert --jobs 2``).  A profile that needs an importance
  vector (``EncoderProfile.importance``) gets one from ``ninfer calibrate`` on its default
  calibration texts (run once per model, ``importance.safetensors`` in the work folder, reused
  by ``--resume``) and ``convert --importance``; a Q tensor with no Linear input (BERT's word
  embeddings) has no vector and takes ``MSE_F16_SEARCH_V1`` in that variant.
* ``--embeddings bf16`` (BERT only) keeps the three embedding tables out of Q, stored BF16
  (``f32-to-bf16-rne``) in every variant, as the issue's own measurement did; the default
  (``quantized``) puts the word embeddings in Q.
* **llama.cpp**: the model's F32 GGUF (``convert_hf_to_gguf.py --outtype f32``) quantized with
  ``llama-quantize ... Q4_0`` and ``... Q4_K_M``, then dequantized with gguf-py
  (``gguf.quants.dequantize``) and mapped back to the HF names.
* **gguf-py reference Q4_0** (``gguf.quants.quantize``) as a cross-check: its bytes are
  compared with llama-quantize's Q4_0 bytes tensor by tensor; if they differ it is evaluated
  as its own variant.

Same weights in every variant: the set Q of tensors quantized is the set the canonical ninfer
artifact stores as Q4G64_F16S (the recipe's last rule); every other tensor is kept exactly as the
ninfer recipe keeps it.  A peer variant is a folder of F32 safetensors (the dequantized Q
tensors, the source's other tensors unchanged) converted by ninfer with the same recipe except
that the Q rule says ``FP32`` (lossless), and then measured by the same
:func:`ninfer_convert.evaluate.evaluate_artifact` as the ninfer artifacts (``--source`` the
original model), so every number comes from one metric implementation.

Name mapping GGUF -> HF: gguf-py's own ``TensorNameMap`` (the table convert_hf_to_gguf uses),
inverted over Q, plus the inverse of convert_hf_to_gguf's Q/K row permutation for llama.  It is
checked bit for bit on every run before anything is measured: every Q tensor of the F32 GGUF,
mapped back, must equal the source's words exactly (an error aborts the run).

Example (see docs/targets/encoder-profiles.md, "Against llama.cpp", for the full commands)::

    python benchmarks/bench_quality.py --work /tmp/q \\
        --llama-cpp /tmp/llama.cpp --llama-quantize /tmp/build/bin/llama-quantize \\
        --model minilm=/path/to/all-MiniLM-L6-v2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ninfer_convert.evaluate import evaluate_artifact
from ninfer_convert.formats import ENCODER_PROFILES, FORMATS
from ninfer_convert.loader import load_state_dict

FORMAT = "Q4G64_F16S"
PEER_TYPES = ("Q4_0", "Q4_K_M")

# Recipe rules per source model_type: (head rules, Q rule match).  The Q rule is the last rule;
# its format is Q4G64_F16S (ninfer variants) or FP32 (peer variants, already dequantized).
# bert: llama.cpp never quantizes position or token-type embeddings, so they are FP32 here in
# every variant (the same weights quantized everywhere); the word embeddings are quantized.
# The pooler is not in llama.cpp's GGUF and not used by mean pooling: FP32 everywhere too.
_RULES: dict[str, tuple[str, str]] = {
    "bert": (
        """  - match: embeddings.position_ids
    format: I32
    conversion: [int-to-i32]
    role: positions
  - match: 're:.*(\\.bias|LayerNorm\\.weight)'
    format: FP32
    role: small
  - match: 're:.*(position_embeddings|token_type_embeddings|pooler\\.dense)\\.weight'
    format: FP32
    role: kept-as-llama-cpp-keeps-it
""",
        "'re:.*\\.weight'",
    ),
    "llama": (
        """  - match: 're:.*norm\\.weight'
    format: FP32
    conversion: [SRCCONV]
    role: norm
  - match: model.embed_tokens.weight
    format: BF16
    role: token-embedding
""",
        "'re:.*\\.weight'",
    ),
}


# --embeddings bf16: BERT's three embedding tables leave Q and are stored BF16 in every variant.
_BERT_EMBEDDINGS_BF16 = """\
  - match: 're:embeddings\\.(word|position|token_type)_embeddings\\.weight'
    format: BF16
    conversion: [f32-to-bf16-rne]
    role: embeddings-kept-bf16
    evidence: [local]
"""
_BERT_KEPT_FP32 = "(position_embeddings|token_type_embeddings|pooler\\.dense)"

# A Q tensor without a Linear input gets no importance vector: the weighted variant encodes it
# with the weights-only search (a weighted rule without a vector is refused by convert).
_NO_VECTOR = {"bert": "embeddings.word_embeddings.weight"}
_UNWEIGHTED = "MSE_F16_SEARCH_V1"


def recipe_text(
    model_type: str,
    src_dtype: str,
    q_format: str,
    profile: str | None,
    *,
    embeddings: str = "quantized",
    weighted: bool = False,
) -> str:
    head, q_match = _RULES[model_type]
    if embeddings == "bf16":
        if model_type != "bert":
            raise SystemExit("--embeddings bf16 is for BERT models only")
        head = head.replace(_BERT_KEPT_FP32, "pooler\\.dense") + _BERT_EMBEDDINGS_BF16
    elif weighted and model_type in _NO_VECTOR:
        head += (
            f"  - match: {_NO_VECTOR[model_type]}\n    format: {q_format}\n"
            f"    encoder_profile: {_UNWEIGHTED}\n    role: no-importance-vector\n"
            "    evidence: [local]\n"
        )
    conv = {"BF16": "bf16-to-f32", "F16": "f16-to-f32"}.get(src_dtype)
    if conv is None:  # F32 norms need no conversion
        head = head.replace("    conversion: [SRCCONV]\n", "")
    else:
        head = head.replace("SRCCONV", conv)
    q_rule = f"  - match: {q_match}\n    format: {q_format}\n"
    if profile is not None:
        q_rule += f"    encoder_profile: {profile}\n"
    elif q_format == "FP32" and conv is not None:
        pass  # the peer folder stores its Q tensors as F32: FP32 needs no conversion
    q_rule += "    role: linear\n    evidence: [local]\n"
    return f"""ninfer_recipe: 1
name: bench-quality-{model_type}
version: "1"
source:
  model_type: {model_type}
evidence:
  - id: local
    citation: local check, benchmarks/bench_quality.py
    summary: not evidence; a measurement of this recipe on one model
rules:
{head}{q_rule}"""


def run(cmd: list[str], **kw: Any) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}"
        )
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# GGUF <-> HF names


def _unpermute(w: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """Inverse of convert_hf_to_gguf's LlamaModel.permute (rows regrouped for GGML's RoPE)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class NameMap:
    gguf_of: dict[str, str]
    """HF name -> GGUF name, over Q."""
    heads: dict[str, int]
    """HF name -> n_head of the row permutation to undo (llama q/k only)."""


def name_map(gguf: Any, arch: str, config: dict[str, Any], q_names: list[str]) -> NameMap:
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    n_blocks = int(config["num_hidden_layers"])
    tmap = gguf.get_tensor_name_map(arch_enum, n_blocks)
    out: dict[str, str] = {}
    heads: dict[str, int] = {}
    for hf in q_names:
        g = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        if g is None:
            raise SystemExit(f"gguf-py has no GGUF name for {hf} ({arch})")
        out[hf] = g
        if arch == "llama" and hf.endswith("self_attn.q_proj.weight"):
            heads[hf] = int(config["num_attention_heads"])
        elif arch == "llama" and hf.endswith("self_attn.k_proj.weight"):
            heads[hf] = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    if len(set(out.values())) != len(out):
        raise SystemExit("the GGUF name map is not one-to-one over the quantized tensors")
    return NameMap(out, heads)


def gguf_tensors(gguf: Any, path: Path) -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def dequantized(gguf: Any, t: Any, nm: NameMap, hf: str) -> np.ndarray[Any, Any]:
    w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    w = w.reshape([int(x) for x in reversed(t.shape)])
    if hf in nm.heads:
        w = _unpermute(w, nm.heads[hf])
    return np.ascontiguousarray(w)


# ---------------------------------------------------------------------------------------------


def source_tensors(src: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in sorted(src.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def quantized_names(artifact: Path) -> list[str]:
    """Source names of the tensors the artifact stores in FORMAT (the set Q)."""
    sd = load_state_dict(artifact, names="source")
    try:
        return [k for k in sd if sd.artifact.tensors[sd.stored_name(k)].format == FORMAT]
    finally:
        sd.close()


def evaluate(artifact: Path, source: Path, max_tokens: int) -> dict[str, Any]:
    rep = evaluate_artifact(artifact, source=source, max_tokens=max_tokens).to_dict()
    return {k: rep[k] for k in ("model", "prompts", "causal_lm", "encoder", "elapsed_s")}


def metrics_row(rep: dict[str, Any]) -> str:
    if rep.get("encoder"):
        e = rep["encoder"]
        nn = e["nearest_neighbour_agreement"]
        return f"cos min {e['cosine_min']:.4f} mean {e['cosine_mean']:.4f} nn {nn}"
    c = rep["causal_lm"]
    return (
        f"top1 {c['top1_agreement']:.4f} KL mean {c['kl_mean']:.4f} max {c['kl_max']:.3f} "
        f"ppl {c['perplexity_change']:+.3f} greedy {c['greedy']['token_agreement']:.3f}"
    )


def bench_model(
    label: str, src: Path, a: argparse.Namespace, gguf: Any, work: Path
) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file

    config = json.loads((src / "config.json").read_text())
    model_type = config["model_type"]
    if model_type not in _RULES:
        raise SystemExit(f"{label}: no recipe rules for model_type {model_type!r}")
    tensors = source_tensors(src)
    dtypes = {str(v.dtype) for k, v in tensors.items() if k.endswith("norm.weight")}
    src_dtype = {"torch.bfloat16": "BF16", "torch.float16": "F16"}.get(
        next(iter(dtypes), ""), "F32"
    )
    mdir = work / label
    mdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"model": label, "source": str(src), "variants": [], "skipped": []}

    def record(
        name: str, bpw: float, rep: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> None:
        row = {"variant": name, "bits_per_weight_q": round(bpw, 4), **rep, **(extra or {})}
        result["variants"].append(row)
        row_file(name).write_text(json.dumps(row, indent=1))
        print(f"[{label}] {name:34s} bpw {bpw:.3f}  {metrics_row(rep)}", flush=True)

    def row_file(name: str) -> Path:
        return mdir / ("row-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".json")

    def cached(name: str) -> bool:
        """--resume: reuse a variant measured by an earlier run (its row file)."""
        f = row_file(name)
        if not (a.resume and f.exists()):
            return False
        row = json.loads(f.read_text())
        result["variants"].append(row)
        print(f"[{label}] {name:34s} (earlier run)  {metrics_row(row)}", flush=True)
        return True

    # 1. ninfer, every grouped profile
    fmt = FORMATS[FORMAT]
    bpw_ninfer = fmt.code_bits + 16 / int(fmt.group_size or 1)  # binary16 scale per group
    q_names: list[str] | None = None
    has_calibrate = (
        subprocess.run(["ninfer", "calibrate", "--help"], capture_output=True).returncode == 0
    )
    for prof in ENCODER_PROFILES.values():
        if FORMAT not in prof.formats:
            continue
        if a.profiles and prof.name not in a.profiles:
            msg = f"{prof.name}: not in --profiles: skipped"
            print(f"[{label}] {msg}", flush=True)
            result["skipped"].append(msg)
            continue
        if getattr(prof, "importance", False) and not has_calibrate:
            msg = f"{prof.name}: needs an importance file; no `ninfer calibrate` here: skipped"
            print(f"[{label}] {msg}", flush=True)
            result["skipped"].append(msg)
            continue
        weighted = bool(getattr(prof, "importance", False))
        out = mdir / f"ninfer-{prof.name}"
        vname = f"ninfer {FORMAT} {prof.name}"
        if cached(vname):
            if q_names is None:
                q_names = quantized_names(out)
            continue
        extra_args: list[str] = []
        if weighted:
            imp = mdir / "importance.safetensors"
            if not imp.exists():  # one calibration per model (the packaged texts)
                t_cal = run(["ninfer", "calibrate", str(src), "-o", str(imp)])
                print(f"[{label}] ninfer calibrate: {t_cal:.0f} s", flush=True)
            extra_args = ["--importance", str(imp)]
        rec = mdir / f"recipe-{prof.name}.yaml"
        rec.write_text(
            recipe_text(
                model_type, src_dtype, FORMAT, prof.name, embeddings=a.embeddings, weighted=weighted
            )
        )
        shutil.rmtree(out, ignore_errors=True)
        t = run(
            ["ninfer", "convert", str(src), "--recipe", str(rec), "--output", str(out),
             "--jobs", "2", *extra_args]
        )  # fmt: skip
        if q_names is None:
            q_names = quantized_names(out)
        record(
            vname,
            bpw_ninfer,
            evaluate(out, src, a.max_tokens),
            {"convert_s": round(t, 1)},
        )
    assert q_names, "the canonical artifact stores no Q4G64_F16S tensor"
    q_elems = sum(tensors[k].numel() for k in q_names)
    result["quantized_tensors"] = len(q_names)
    result["quantized_weights"] = q_elems

    # 2. the F32 GGUF and the name map, checked bit for bit
    arch = {"bert": "bert", "llama": "llama"}[model_type]
    nm = name_map(gguf, arch, config, q_names)
    f32 = mdir / "f32.gguf"
    if not f32.exists():
        conv = str(a.llama_cpp / "convert_hf_to_gguf.py")
        run([sys.executable, conv, str(src), "--outtype", "f32", "--outfile", str(f32)],
            env={**os.environ, "PYTHONPATH": str(a.llama_cpp / "gguf-py")})  # fmt: skip
    g32 = gguf_tensors(gguf, f32)
    for hf in q_names:
        back = dequantized(gguf, g32[nm.gguf_of[hf]], nm, hf)
        want = tensors[hf].to(torch.float32).numpy()
        if back.shape != want.shape or not np.array_equal(
            back.view(np.uint32), want.view(np.uint32)
        ):
            raise SystemExit(
                f"name map check failed: {hf} <- {nm.gguf_of[hf]} is not bit-identical"
            )
    print(
        f"[{label}] name map: {len(q_names)} tensors bit-identical through the F32 GGUF", flush=True
    )

    def peer_variant(
        name: str, qvals: dict[str, np.ndarray[Any, Any]], bpw: float, extra: dict[str, Any]
    ) -> None:
        if cached(name):
            return
        folder = mdir / f"src-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        sd = {k: (torch.from_numpy(qvals[k]) if k in qvals else v) for k, v in tensors.items()}
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
        del sd
        shutil.copy(src / "config.json", folder / "config.json")
        rec = mdir / f"recipe-{name}.yaml"
        rec.write_text(recipe_text(model_type, src_dtype, "FP32", None, embeddings=a.embeddings))
        out = mdir / f"art-{name}"
        shutil.rmtree(out, ignore_errors=True)
        run(
            [
                "ninfer",
                "convert",
                str(folder),
                "--recipe",
                str(rec),
                "--output",
                str(out),
                "--jobs",
                "2",
            ]
        )
        record(name, bpw, evaluate(out, src, a.max_tokens), extra)
        shutil.rmtree(folder)

    # 3. llama-quantize
    q40_bytes: dict[str, bytes] = {}
    for qt in a.peer_types:
        qf = mdir / f"{qt}.gguf"
        t = run([str(a.llama_quantize), str(f32), str(qf), qt, "2"])
        gq = gguf_tensors(gguf, qf)
        vals: dict[str, np.ndarray[Any, Any]] = {}
        types: dict[str, int] = {}
        nbytes = 0
        for hf in q_names:
            gt = gq[nm.gguf_of[hf]]
            types[gt.tensor_type.name] = types.get(gt.tensor_type.name, 0) + 1
            nbytes += int(gt.n_bytes)
            vals[hf] = dequantized(gguf, gt, nm, hf)
            if qt == "Q4_0" and gt.tensor_type.name == "Q4_0":
                q40_bytes[hf] = bytes(np.asarray(gt.data).tobytes())
        peer_variant(f"llama.cpp {qt}", vals, nbytes * 8 / q_elems,
                     {"tensor_types": types, "quantize_s": round(t, 1)})  # fmt: skip
        del vals

    # 4. gguf-py's reference Q4_0 (checked against llama-quantize's Q4_0 when that ran)
    if "Q4_0" not in a.peer_types:
        return result
    same = 0
    ref_vals: dict[str, np.ndarray[Any, Any]] = {}
    for hf in q_names:
        w = tensors[hf].to(torch.float32).numpy()
        if hf in nm.heads:  # quantize in GGUF row order, as llama-quantize saw it
            w = np.asarray(g32[nm.gguf_of[hf]].data, dtype=np.float32).reshape(w.shape)
        qb = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
        same += int(hf in q40_bytes and bytes(qb.tobytes()) == q40_bytes[hf])
        back = np.asarray(
            gguf.quants.dequantize(qb, gguf.GGMLQuantizationType.Q4_0), dtype=np.float32
        )
        back = back.reshape(w.shape)
        ref_vals[hf] = np.ascontiguousarray(
            _unpermute(back, nm.heads[hf]) if hf in nm.heads else back
        )
    # Compared where llama-quantize stored Q4_0 (its policy stores a tied embedding at Q6_K or
    # Q8_0); the reference row below quantizes every Q tensor to Q4_0.
    result["gguf_py_q4_0_bytes_identical"] = f"{same}/{len(q40_bytes)}"
    print(
        f"[{label}] gguf-py reference Q4_0: {same}/{len(q40_bytes)} tensors byte-identical "
        "to those llama-quantize stored as Q4_0",
        flush=True,
    )
    # Identical to llama-quantize's Q4_0 on every Q tensor: the same model, already measured.
    if not (same == len(q40_bytes) == len(q_names)) or a.eval_reference:
        peer_variant("gguf-py reference Q4_0", ref_vals, 4.5, {})
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", action="append", required=True, metavar="LABEL=DIR")
    ap.add_argument(
        "--llama-cpp",
        type=Path,
        required=True,
        help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)",
    )
    ap.add_argument("--llama-quantize", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (big files)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument(
        "--eval-reference",
        action="store_true",
        help="evaluate gguf-py's Q4_0 even when byte-identical",
    )
    ap.add_argument(
        "--resume", action="store_true", help="reuse variants measured earlier in --work"
    )
    ap.add_argument(
        "--profiles", type=lambda v: v.split(","), default=None,
        help="comma-separated subset of the grouped profiles (default: every one registered)",
    )  # fmt: skip
    ap.add_argument(
        "--peer-types", type=lambda v: v.split(","), default=list(PEER_TYPES),
        help="llama-quantize types to run (default Q4_0,Q4_K_M)",
    )  # fmt: skip
    ap.add_argument(
        "--embeddings", choices=("quantized", "bf16"), default="quantized",
        help="BERT: word embeddings in Q (default) or all three embedding tables BF16",
    )  # fmt: skip
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(a.llama_cpp / "gguf-py"))
    import gguf

    results = []
    for spec in a.model:
        label, _, d = spec.partition("=")
        results.append(bench_model(label, Path(d), a, gguf, a.work))
        if a.json:
            a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
