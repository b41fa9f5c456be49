"""``ninfer convert --ray`` on a local Ray cluster against ``--jobs 2`` on the same machine, on
the synthetic checkpoint of bench_convert.py (interleaved rounds, same flags, same bytes).

    python benchmarks/bench_ray.py --size-gb 4 [--repeat 2] [--shard 512MB] [--keep]

Steps of each round, every one in a fresh process, with the source's pages evicted before it
(``posix_fadvise(DONTNEED)`` on the source files only, after an fsync): ``local`` (``--jobs 2``),
``ray-cold`` (``--ray``: the command starts a local cluster and shuts it down, start-up
included) and ``ray-warm`` (``--ray ADDRESS`` of a 2-CPU cluster that a child process started
just before with ``ray.init``, not timed: the per-run cost without the start-up; its workers
still start, and import the package, inside the step; the child shuts it down afterwards).
The first round checks that the Ray outputs equal the local one byte for byte.  ``uptime`` is
printed before and after.
Besides wall time each step reports the CPU seconds of the command (``RUSAGE_CHILDREN``: the
process, plus the cluster processes it started and reaped, for ``ray-cold``) and of the shard
tasks (their ``cpu_s``); on a loaded machine the CPU seconds are the steadier measure of the
overhead.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import RECIPE_TEMPLATE, write_checkpoint
from common import evict_files


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, dict[str, Any]]:
    """Wall seconds, CPU seconds of the command's process (and of the descendants it reaped),
    and its JSON summary."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    dt = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return dt, cpu, json.loads(proc.stdout)


_HOLDER = """
import sys, ray
ctx = ray.init(num_cpus=2, include_dashboard=False)
print(ctx.address_info["address"], flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
ray.shutdown()
"""


def start_cluster(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """A 2-CPU local cluster held by a child process of ours (stopped by its pid, never by
    ``ray stop``, which would stop every cluster on the machine); returns it and its address."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def stop_cluster(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def same_tree(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ninfer-bench-ray"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--shard", default="512MB")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = args.workdir
    src = work / "src"
    if not src.exists():
        write_checkpoint(src, int(args.size_gb * 1e9))
    recipe = work / "recipe.yaml"
    recipe.write_text(RECIPE_TEMPLATE.format(name="q4", fmt="Q4G64_F16S",
                                             profile="MAXABS_F16_RECIP_RNE_V1"))  # fmt: skip
    files = sorted(src.glob("*.safetensors"))
    # Ray 2.60's token authentication would refuse a driver the holder did not give its token
    # to: off for these throwaway local clusters.
    env = dict(os.environ, RAY_TMPDIR=str(work / "ray"), RAY_AUTH_MODE="disabled")
    (work / "ray").mkdir(exist_ok=True)
    exe = [sys.executable, "-m", "ninfer_convert"]
    base = ["convert", str(src), "--recipe", str(recipe), "--device", "cpu", "--json",
            "--max-shard-size", args.shard]  # fmt: skip
    steps = {
        "local": ["--jobs", "2"],
        "ray-cold": ["--ray"],
        "ray-warm": [],  # --ray ADDRESS of the cluster started for the step
    }
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    times: dict[str, list[float]] = {k: [] for k in steps}
    try:
        for round_ in range(args.repeat):
            for name, extra in steps.items():
                out = work / f"out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                warm = None
                if name == "ray-warm":  # started (and timed) outside the step
                    warm, address = start_cluster(env)
                    extra = ["--ray", address]
                evict_files(files)
                try:
                    dt, cpu, summary = run([*exe, *base, *extra, "--output", str(out)], env)
                finally:
                    if warm is not None:
                        stop_cluster(warm)
                times[name].append(dt)
                details = (summary.get("runner") or {}).get("ray", {})
                tasks_cpu = sum(n["cpu_s"] for n in details.get("nodes", {}).values())
                print(f"round {round_ + 1} {name}: {dt:.2f} s wall, command CPU {cpu:.2f} s, "
                      f"task CPU {tasks_cpu:.2f} s {json.dumps(details) if details else ''}",
                      flush=True)  # fmt: skip
            if round_ == 0:
                for name in ("ray-cold", "ray-warm"):
                    same = same_tree(work / "out-local", work / f"out-{name}")
                    print(f"{name} output identical to local: {same}", flush=True)
    finally:
        print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    best = {k: min(v) for k, v in times.items()}
    gb = sum(f.stat().st_size for f in files) / 1e9
    for name, t in best.items():
        print(f"best {name}: {t:.2f} s, {gb / t:.3f} GB/s, {t / best['local']:.2f}x local "
              f"(all: {', '.join(f'{x:.2f}' for x in times[name])})")  # fmt: skip
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
