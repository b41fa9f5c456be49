"""Peak memory and time of convert, verify and ``inspect --tensor`` on the full Qwen3.6-27B
inventory: every one of its 1,199 tensors at its real shape (27,781,427,952 BF16 weights,
55.56 GB), in sparse files, converted with ``recipes/qwen3.6-27b.yaml``.

    python benchmarks/bench_inventory.py [--workdir /tmp/ninfer-bench-inventory] [--jobs 2]
                                         [--shard-gb 5] [--keep] [--json out.json]

The names and shapes are those of docs/targets/qwen3.6-27b.md Section 2 (the table there is
the contract; :func:`inventory` rebuilds it and checks its totals: 1,199 tensors and
27,781,427,952 parameters).  The source is written as safetensors shards of about
``--shard-gb`` GB with a ``model.safetensors.index.json`` and the config of the committed tiny
example (the recipe's identity fields are the same), every tensor's data a hole: reading it
costs no disk, the encoder sees zeros (every group takes the all-zero scale), and the disk holds
only the artifact (about 21 GB).  Each command is a fresh ``python -m ninfer_convert`` process
whose RssAnon is sampled every 10 ms.  Issue 12's target: peak RssAnon <= 256 MiB + 64 MiB x
jobs, whatever the tensor size; before issue 12 the same inventory took 1.3 GiB to convert and
0.4-0.5 GiB to verify (the 2.4 GiB embedding and lm_head were held whole).
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PeakRssAnon, machine

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "qwen3.6-27b.yaml"
CONFIG_FROM = ROOT / "examples" / "tiny-qwen3.5"
TENSORS = 1199
PARAMETERS = 27_781_427_952

H, FF, V = 5120, 17408, 248320  # hidden, intermediate (MLP), vocabulary
FULL = {3 + 4 * k for k in range(16)}  # full-attention layer indices; the other 48 are linear


def _full_layer(p: str) -> dict[str, list[int]]:
    return {
        f"{p}.input_layernorm.weight": [H], f"{p}.post_attention_layernorm.weight": [H],
        f"{p}.mlp.gate_proj.weight": [FF, H], f"{p}.mlp.up_proj.weight": [FF, H],
        f"{p}.mlp.down_proj.weight": [H, FF],
        f"{p}.self_attn.q_proj.weight": [12288, H], f"{p}.self_attn.k_proj.weight": [1024, H],
        f"{p}.self_attn.v_proj.weight": [1024, H], f"{p}.self_attn.o_proj.weight": [H, 6144],
        f"{p}.self_attn.q_norm.weight": [256], f"{p}.self_attn.k_norm.weight": [256],
    }  # fmt: skip


def _linear_layer(p: str) -> dict[str, list[int]]:
    a = f"{p}.linear_attn"
    return {
        f"{p}.input_layernorm.weight": [H], f"{p}.post_attention_layernorm.weight": [H],
        f"{p}.mlp.gate_proj.weight": [FF, H], f"{p}.mlp.up_proj.weight": [FF, H],
        f"{p}.mlp.down_proj.weight": [H, FF],
        f"{a}.in_proj_qkv.weight": [10240, H], f"{a}.in_proj_z.weight": [6144, H],
        f"{a}.in_proj_b.weight": [48, H], f"{a}.in_proj_a.weight": [48, H],
        f"{a}.conv1d.weight": [10240, 1, 4], f"{a}.A_log": [48], f"{a}.dt_bias": [48],
        f"{a}.norm.weight": [128], f"{a}.out_proj.weight": [H, 6144],
    }  # fmt: skip


def _vision() -> dict[str, list[int]]:
    v = "model.visual"
    out: dict[str, list[int]] = {
        f"{v}.patch_embed.proj.weight": [1152, 3, 2, 16, 16],
        f"{v}.patch_embed.proj.bias": [1152],
        f"{v}.pos_embed.weight": [2304, 1152],
        f"{v}.merger.norm.weight": [1152], f"{v}.merger.norm.bias": [1152],
        f"{v}.merger.linear_fc1.weight": [4608, 4608], f"{v}.merger.linear_fc1.bias": [4608],
        f"{v}.merger.linear_fc2.weight": [H, 4608], f"{v}.merger.linear_fc2.bias": [H],
    }  # fmt: skip
    for b in range(27):
        p = f"{v}.blocks.{b}"
        for n in ("norm1", "norm2"):
            out[f"{p}.{n}.weight"] = [1152]
            out[f"{p}.{n}.bias"] = [1152]
        linears = [("attn.qkv", 3456, 1152), ("attn.proj", 1152, 1152),
                   ("mlp.linear_fc1", 4304, 1152), ("mlp.linear_fc2", 1152, 4304)]  # fmt: skip
        for name, rows, cols in linears:
            out[f"{p}.{name}.weight"] = [rows, cols]
            out[f"{p}.{name}.bias"] = [rows]
    return out


def inventory() -> dict[str, list[int]]:
    """Every tensor name of Qwen3.6-27B and its shape, checked against the documented totals."""
    lm = "model.language_model"
    out: dict[str, list[int]] = {f"{lm}.embed_tokens.weight": [V, H], "lm_head.weight": [V, H],
                                 f"{lm}.norm.weight": [H]}  # fmt: skip
    for i in range(64):
        p = f"{lm}.layers.{i}"
        out.update(_full_layer(p) if i in FULL else _linear_layer(p))
    out["mtp.fc.weight"] = [H, 2 * H]
    for name in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        out[f"mtp.{name}.weight"] = [H]
    out.update(_full_layer("mtp.layers.0"))
    out.update(_vision())
    params = sum(_count(s) for s in out.values())
    if len(out) != TENSORS or params != PARAMETERS:
        raise SystemExit(f"inventory drifted: {len(out)} tensors, {params} parameters")
    return out


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def write_source(root: Path, shard_bytes: int) -> int:
    """Sparse BF16 shards of the inventory plus an index and the example's config."""
    root.mkdir(parents=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copyfile(CONFIG_FROM / name, root / name)
    shards: list[list[tuple[str, list[int]]]] = [[]]
    size = 0
    for name, shape in sorted(inventory().items()):
        nbytes = 2 * _count(shape)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for k, members in enumerate(shards, 1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, object] = {}
        offset = 0
        for name, shape in members:
            nbytes = 2 * _count(shape)
            header[name] = {"dtype": "BF16", "shape": shape,
                            "data_offsets": [offset, offset + nbytes]}  # fmt: skip
            offset += nbytes
            weight_map[name] = file
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(root / file, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # the data: one hole
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def measure(cmd: list[str]) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakRssAnon(proc.pid) as peak:
        _out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return {"wall_s": wall, "peak_rss_anon_mib": peak.peak_kib / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ninfer-bench-inventory"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    src, out = args.workdir / "src", args.workdir / "out"
    total = write_source(src, int(args.shard_gb * 1e9))
    exe = [sys.executable, "-m", "ninfer_convert"]
    jobs = ["--jobs", str(args.jobs)]
    steps = {
        "convert": [*exe, "convert", str(src), "--recipe", str(RECIPE), "--output", str(out),
                    "--device", "cpu", *jobs, "--json"],
        "verify": [*exe, "verify", str(out), "--source", str(src), *jobs, "--json"],
        "inspect --tensor lm_head.weight": [*exe, "inspect", str(out), "--tensor",
                                            "lm_head.weight", "--json"],
    }  # fmt: skip
    target = 256 + 64 * args.jobs
    print(f"{TENSORS} tensors, {total / 1e9:.2f} GB BF16 source (sparse); target {target} MiB")
    print("| step | wall s | peak RssAnon MiB |\n|---|---|---|")
    results: dict[str, object] = {"machine": machine(), "jobs": args.jobs, "source_bytes": total}
    for step, cmd in steps.items():
        r = measure(cmd)
        results[step] = r
        print(f"| {step} | {r['wall_s']:.1f} | {r['peak_rss_anon_mib']:.0f} |", flush=True)
    artifact = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    results["artifact_bytes"] = artifact
    print(f"artifact {artifact / 1e9:.2f} GB")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if not args.keep:
        shutil.rmtree(args.workdir)


if __name__ == "__main__":
    main()
