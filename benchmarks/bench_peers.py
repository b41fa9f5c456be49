"""Convert speed against llama.cpp: ``llama-quantize in.gguf out.gguf Q4_K_M 2`` vs
``ninfer convert --jobs 2`` (Q4G64_F16S, canonical profile and MSE_F16_SEARCH_V1) on the same
synthetic checkpoint, interleaved in one run; prints ratios.

    python benchmarks/bench_peers.py --llama-quantize /tmp/build/bin/llama-quantize \\
        --llama-cpp /tmp/llama.cpp --size-gb 4 [--repeat 2] [--workdir /tmp/x]

The checkpoint is bench_convert.py's (``write_checkpoint``: a [32768, 4096] embedding, then
layers of up / down / o_proj matrices and a norm, BF16, ~1 GiB shards).  The GGUF given to
llama-quantize holds the same tensors with the same BF16 words, written with gguf-py's
``GGUFWriter`` straight from the safetensors (llama GGUF names, the llama hyperparameters
llama-quantize reads); writing it is preparation, not timed.  Both tools get 2 threads
(llama-quantize's ``nthread`` argument, ninfer's ``--jobs 2``).  Before every timed step the
page cache of this benchmark's own input files is dropped with ``posix_fadvise(DONTNEED)``
after an fsync (``--cache warm`` keeps it), so each step reads from disk.  Rounds interleave the
three steps so a slow spell of the shared machine hits all of them; the fastest of
``--repeat`` runs of each is reported, with the ratios of those fastest times, and the CPU
seconds (user + system) of every run, which a loaded machine distorts less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import RECIPE_TEMPLATE, write_checkpoint
from common import PeakRssAnon, machine

PROFILES = ("MAXABS_F16_RECIP_RNE_V1", "MSE_F16_SEARCH_V1")


def gguf_name(hf: str) -> str:
    """The llama GGUF name of each tensor write_checkpoint makes (an unknown name is an error)."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"]:
        raise SystemExit(f"unexpected tensor {hf}")
    blk = f"blk.{int(parts[2])}."
    rest = ".".join(parts[3:])
    table = {
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "input_layernorm.weight": "attn_norm.weight",
    }
    if rest not in table:
        raise SystemExit(f"unexpected tensor {hf}")
    return blk + table[rest]


def write_gguf(gguf: Any, src: Path, out: Path) -> int:
    """The same tensors and BF16 words as the safetensors checkpoint, as a llama GGUF."""
    index = json.loads((src / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    entries: list[tuple[str, np.ndarray[Any, Any]]] = []
    n_layers = 0
    for fname in files:
        path = src / fname
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        base = 8 + n
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            shape = info["shape"]
            arr = mm[base + a : base + b].view(np.uint16).reshape(shape)
            if name.endswith("norm.weight"):
                arr = arr.reshape(-1)  # 1-D in GGUF, as convert_hf_to_gguf writes norms
            entries.append((gguf_name(name), arr))
            if name.startswith("model.layers."):
                n_layers = max(n_layers, int(name.split(".")[2]) + 1)
    hidden = entries[0][1].shape[1]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(4 * hidden)
    w.add_head_count(32)
    w.add_head_count_kv(32)
    w.add_rope_dimension_count(hidden // 32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(entries[0][1].shape[0])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    for name, arr in entries:
        w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return len(entries)


def evict(paths: list[Path]) -> None:
    """Drop only these files from the page cache (fsync first so nothing dirty is kept)."""
    for p in paths:
        for f in [p] if p.is_file() else sorted(x for x in p.iterdir() if x.is_file()):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RssAnon bytes and CPU seconds (user + system) of one command."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakRssAnon(proc.pid) as peak:
        _out, err = proc.communicate()
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return dt, peak.peak_kib * 1024, cpu


def uptime() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--llama-quantize", type=Path, required=True)
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp tree (gguf-py)")
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ninfer-bench-peers"))
    ap.add_argument("--cache", choices=["cold", "warm"], default="cold")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(a.llama_cpp / "gguf-py"))
    import gguf

    work = a.workdir
    src = work / "source"
    shutil.rmtree(src, ignore_errors=True)
    total, largest = write_checkpoint(src, int(a.size_gb * 1e9))
    in_gguf = work / "in-bf16.gguf"
    n = write_gguf(gguf, src, in_gguf)
    print(
        f"checkpoint {total / 1e9:.2f} GB ({n} tensors, largest {largest / 1e6:.0f} MB), "
        "and its GGUF, written"
    )
    recipes = {}
    for prof in PROFILES:
        r = work / f"recipe-{prof}.yaml"
        r.write_text(RECIPE_TEMPLATE.format(name=f"peers-{prof}", fmt="Q4G64_F16S", profile=prof))
        recipes[prof] = r
    steps: dict[str, list[tuple[float, int, float]]] = {"llama-quantize Q4_K_M": []}
    steps.update({f"ninfer {p}": [] for p in PROFILES})
    loads: list[str] = [uptime()]
    out_gguf = work / "out-Q4_K_M.gguf"
    exe = [sys.executable, "-m", "ninfer_convert"]
    for _ in range(a.repeat):
        if a.cache == "cold":
            evict([in_gguf])
        steps["llama-quantize Q4_K_M"].append(
            timed([str(a.llama_quantize), str(in_gguf), str(out_gguf), "Q4_K_M", "2"])
        )
        out_bytes = out_gguf.stat().st_size
        out_gguf.unlink()
        for prof in PROFILES:
            out = work / f"out-{prof}"
            shutil.rmtree(out, ignore_errors=True)
            if a.cache == "cold":
                evict([src])
            steps[f"ninfer {prof}"].append(
                timed([*exe, "convert", str(src), "--recipe", str(recipes[prof]), "--output",
                       str(out), "--device", "cpu", "--jobs", "2"])
            )  # fmt: skip
            shutil.rmtree(out)
        loads.append(uptime())
    best = {k: min(v) for k, v in steps.items()}
    base = best["llama-quantize Q4_K_M"][0]
    canon = best["ninfer MAXABS_F16_RECIP_RNE_V1"][0]
    report: dict[str, Any] = {
        "machine": machine(),
        "source_bytes": total,
        "cache": a.cache,
        "repeat": a.repeat,
        "loadavg": loads,
        "llama_quantize_output_bytes": out_bytes,
        "steps": {},
    }
    for k, v in steps.items():
        t = best[k][0]
        report["steps"][k] = {
            "seconds": t,
            "seconds_all": [x[0] for x in v],
            "peak_rss_anon_bytes": max(x[1] for x in v),
            "cpu_seconds_all": [x[2] for x in v],
            "gb_per_s": total / t / 1e9,
            "speed_vs_llama_quantize": base / t,
            "speed_vs_ninfer_canonical": canon / t,
        }
        print(
            f"{k:32s} {t:7.2f} s ({total / t / 1e9:.3f} GB/s)  x{base / t:.2f} vs llama-quantize"
            f"  x{canon / t:.2f} vs canonical  peak RssAnon {max(x[1] for x in v) / 2**20:.0f} MiB"
            f"  (all: {', '.join(f'{x[0]:.1f}' for x in v)}; CPU s: "
            f"{', '.join(f'{x[2]:.1f}' for x in v)})"
        )
    print(f"load average (1/5/15 min) before and after each round: {loads}")
    if not a.keep:
        shutil.rmtree(work)
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
