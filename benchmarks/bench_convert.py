"""End-to-end throughput and peak memory of ``ninfer convert`` and ``ninfer verify`` on a
synthetic multi-GB BF16 checkpoint, against a plain file copy of the same bytes measured in the
same run (read + write + fsync).

    python benchmarks/bench_convert.py --size-gb 4 [--repeat 2] [--cache cold|warm] [--keep]
        [--profiles MAXABS_F16_RECIP_RNE_V1,MSE_F16_SEARCH_V1]

The checkpoint mimics a dense decoder: a [vocab, hidden] embedding (the largest tensor), layers
of [4h, h] / [h, 4h] matrices, and norms, in several shards with an index.  Each conversion runs
in a fresh subprocess whose RssAnon is sampled every 10 ms.  With ``--cache cold`` (the
default, needs root) the page cache is dropped before every timed step, so the copy, every
conversion and every verification all start from disk; otherwise whichever step runs after
another one finds a different cache (a 13 GB source does not stay cached beside its copy).
Every step is timed ``--repeat`` times and the fastest run is reported: the disks of shared
virtual machines vary by tens of percent from one run to the next.  ``--profiles`` converts
every format with each listed encoder profile (interleaved in every round) and reports each
profile's convert throughput as a ratio to the first one's.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PeakRssAnon, machine

HIDDEN = 4096
RECIPE_TEMPLATE = """\
ninfer_recipe: 1
name: bench-{name}
version: "1"
source:
  model_type: [llama]
rules:
  - match: "re:.*norm\\\\.weight"
    format: BF16
    role: norm
  - match: "re:.*\\\\.weight"
    format: {fmt}
    encoder_profile: {profile}
    role: weight
    evidence: [bench]
evidence:
  - id: bench
    citation: synthetic benchmark, no quality claim
    summary: throughput measurement only
"""


def write_checkpoint(root: Path, size_bytes: int) -> tuple[int, int]:
    """Write shards of ~1 GiB; returns (total tensor bytes, largest tensor bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    rng = np.random.default_rng(0)
    # A pool of BF16 words (normal values), reused with rolls so generation stays cheap.
    pool = (rng.standard_normal(1 << 24, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    tensors: list[tuple[str, tuple[int, int]]] = [("model.embed_tokens.weight", (32768, HIDDEN))]
    total = 32768 * HIDDEN * 2
    layer = 0
    while total < size_bytes:
        p = f"model.layers.{layer}."
        for name, shape in (
            (p + "mlp.up_proj.weight", (4 * HIDDEN, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, 4 * HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
        ):
            tensors.append((name, shape))
            total += shape[0] * shape[1] * 2
        tensors.append((p + "input_layernorm.weight", (1, HIDDEN)))
        total += HIDDEN * 2
        layer += 1
    shards: list[list[tuple[str, tuple[int, int]]]] = [[]]
    acc = 0
    for t in tensors:
        nb = t[1][0] * t[1][1] * 2
        if acc and acc + nb > (1 << 30):
            shards.append([])
            acc = 0
        shards[-1].append(t)
        acc += nb
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, object] = {}
        off = 0
        for name, shape in shard:
            nb = shape[0] * shape[1] * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
            weight_map[name] = fname
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(root / fname, "wb") as f:
            f.write(len(raw).to_bytes(8, "little"))
            f.write(raw)
            k = 0
            for _name, shape in shard:
                left = shape[0] * shape[1]
                while left:
                    step = min(left, pool.size)
                    f.write(np.roll(pool, k)[:step].tobytes())
                    k += 7919
                    left -= step
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    largest = max(s[0] * s[1] * 2 for _n, s in tensors)
    return total, largest


def drop_caches(mode: str) -> None:
    """Write back dirty pages and drop the page cache (cold mode, when permitted)."""
    if mode != "cold":
        return
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        print("cannot drop the page cache (not root?): timings are warm", file=sys.stderr)


def copy_baseline(src: Path, dst: Path) -> float:
    """Read every weight file, write it to ``dst`` and fsync: the plain-copy throughput."""
    dst.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for f in sorted(src.glob("*.safetensors")):
        with open(f, "rb") as fin, open(dst / f.name, "wb") as fout:
            shutil.copyfileobj(fin, fout, 16 << 20)
            fout.flush()
            os.fsync(fout.fileno())
    return time.perf_counter() - t0


def run_measured(cmd: list[str]) -> tuple[float, int, str, float]:
    """Wall seconds, peak RssAnon bytes, stdout and CPU seconds (user + system) of one step."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakRssAnon(proc.pid) as peak:
        out, err = proc.communicate()
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return dt, peak.peak_kib * 1024, out, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ninfer-bench"))
    ap.add_argument("--formats", default="Q4G64_F16S,W8G32_F16S")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cache", choices=["cold", "warm"], default="cold")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profiles", default="MAXABS_F16_RECIP_RNE_V1",
                    help="comma-separated encoder profiles; ratios are to the first")  # fmt: skip
    args = ap.parse_args()

    work = args.workdir
    src = work / "source"
    if src.exists():
        shutil.rmtree(src)
    t0 = time.perf_counter()
    total, largest = write_checkpoint(src, int(args.size_gb * 1e9))
    print(
        f"wrote synthetic checkpoint: {total / 1e9:.2f} GB, largest tensor "
        f"{largest / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s"
    )
    results: dict[str, object] = {
        "cache": args.cache,
        "repeat": args.repeat,
        "machine": machine(),
        "source_bytes": total,
        "largest_tensor_bytes": largest,
        "runs": [],
    }
    exe = [sys.executable, "-m", "ninfer_convert"]
    profiles = args.profiles.split(",")
    # One variant per format and profile: "Q4G64_F16S" for the first profile, else
    # "Q4G64_F16S/<profile>".
    variants = {
        (fmt if i == 0 else f"{fmt}/{profile}"): (fmt, profile)
        for fmt in args.formats.split(",")
        for i, profile in enumerate(profiles)
    }
    formats = list(variants)
    recipes = {v: work / f"recipe-{v.replace('/', '-')}.yaml" for v in formats}
    for v, recipe in recipes.items():
        fmt, profile = variants[v]
        recipe.write_text(
            RECIPE_TEMPLATE.format(fmt=fmt, profile=profile, name=v.replace("/", "-").lower())
        )
    copies: list[float] = []
    convs: dict[str, list[tuple[float, int, str, float]]] = {fmt: [] for fmt in formats}
    vers: dict[str, list[tuple[float, int, str, float]]] = {fmt: [] for fmt in formats}
    # Rounds interleave every step (copy, then convert and verify of each format), so a slow
    # spell of the shared VM hits all of them rather than one step's repeats.
    for _ in range(args.repeat):
        drop_caches(args.cache)
        copies.append(copy_baseline(src, work / "copy"))
        shutil.rmtree(work / "copy")
        for fmt in formats:
            out = work / f"out-{fmt.replace('/', '-')}"
            if out.exists():
                shutil.rmtree(out)
            drop_caches(args.cache)
            convs[fmt].append(
                run_measured(
                    [*exe, "convert", str(src), "--recipe", str(recipes[fmt]), "--output",
                     str(out), "--device", "cpu", "--jobs", str(args.jobs), "--json"]
                )
            )  # fmt: skip
            drop_caches(args.cache)
            vers[fmt].append(
                run_measured(
                    [*exe, "verify", str(out), "--source", str(src), "--jobs", str(args.jobs),
                     "--json"]
                )
            )  # fmt: skip
    t_copy = min(copies)
    copy_rate = total / t_copy
    print(
        f"file copy (read+write+fsync): {t_copy:.2f} s, {copy_rate / 1e9:.3f} GB/s "
        f"(all runs: {', '.join(f'{t:.2f}' for t in copies)})"
    )
    results["copy_seconds"] = t_copy
    results["copy_seconds_all"] = copies

    for fmt in formats:
        out = work / f"out-{fmt.replace('/', '-')}"
        t_conv, peak_conv = min(c[0] for c in convs[fmt]), max(c[1] for c in convs[fmt])
        t_ver, peak_ver = min(v[0] for v in vers[fmt]), max(v[1] for v in vers[fmt])
        elems = total // 2
        limit = 2 * largest + (256 << 20)
        row = {
            "format": variants[fmt][0],
            "encoder_profile": variants[fmt][1],
            "convert_seconds": t_conv,
            "convert_gb_per_s": total / t_conv / 1e9,
            "convert_melem_per_s": elems / t_conv / 1e6,
            "convert_vs_copy": t_copy / t_conv,
            "convert_peak_rss_anon_bytes": peak_conv,
            "verify_seconds": t_ver,
            "verify_gb_per_s": total / t_ver / 1e9,
            "verify_vs_convert": t_conv / t_ver,
            "verify_peak_rss_anon_bytes": peak_ver,
            "convert_seconds_all": [c[0] for c in convs[fmt]],
            "verify_seconds_all": [v[0] for v in vers[fmt]],
            "convert_cpu_seconds_all": [c[3] for c in convs[fmt]],
            "verify_cpu_seconds_all": [v[3] for v in vers[fmt]],
            "rss_limit_bytes": limit,
            "artifact_bytes": sum(p.stat().st_size for p in out.iterdir()),
        }
        results["runs"].append(row)  # type: ignore[union-attr]
        print(
            f"{fmt}: convert {t_conv:.2f} s ({row['convert_gb_per_s']:.3f} GB/s, "
            f"{row['convert_melem_per_s']:.0f} Melem/s, {row['convert_vs_copy']:.2f}x copy), "
            f"peak RssAnon {peak_conv / 2**20:.0f} MiB (limit {limit / 2**20:.0f} MiB); "
            f"verify {t_ver:.2f} s ({row['verify_vs_convert']:.2f}x convert), "
            f"peak RssAnon {peak_ver / 2**20:.0f} MiB\n"
            f"    all runs: convert {', '.join(f'{c[0]:.2f}' for c in convs[fmt])}; "
            f"verify {', '.join(f'{v[0]:.2f}' for v in vers[fmt])}\n"
            f"    CPU s (user+sys): convert {', '.join(f'{c[3]:.2f}' for c in convs[fmt])}; "
            f"verify {', '.join(f'{v[3]:.2f}' for v in vers[fmt])}"
        )
        base = variants[fmt][0]
        if base != fmt:  # same format with the first profile, measured in the same rounds
            t_base = min(c[0] for c in convs[base])
            row["convert_vs_first_profile"] = t_base / t_conv
            cpu_base = min(c[3] for c in convs[base])
            cpu_conv = min(c[3] for c in convs[fmt])
            row["convert_cpu_vs_first_profile"] = cpu_base / cpu_conv
            print(f"    convert throughput vs {profiles[0]}: {t_base / t_conv:.2f}x "
                  f"(in CPU seconds {cpu_base / cpu_conv:.2f}x)")  # fmt: skip
        if not args.keep:
            shutil.rmtree(out)
    if not args.keep:
        shutil.rmtree(src)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
