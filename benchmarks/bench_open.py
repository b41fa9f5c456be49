"""``open_artifact`` of the same artifacts by two source trees, interleaved.

    python benchmarks/bench_open.py --tree main=/path/to/main --tree branch=. \\
        [--rounds 3] ARTIFACT [ARTIFACT ...]

For each artifact, ``--rounds`` rounds; each round opens it once per tree, in the order given,
each open in a fresh process with ``PYTHONPATH`` set to the tree (the bench_memory.py open
snippet: the call alone, without the import).  Printed per tree: CPU seconds
(``time.process_time``; the open is single-threaded, and on a shared machine wall time follows
the other tenants' load), wall seconds and the RssAnon the open artifact holds; then the CPU
ratio of each tree to the first one per round.  Make the artifacts with ``bench_memory.py``'s
checkpoints (``many``) and ``ninfer convert``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CODE = (
    "import re, time; from ninfer_convert.container import open_artifact\n"
    "def anon(): return int(re.search(r'RssAnon:\\s+(\\d+)', "
    "open('/proc/self/status').read()).group(1))\n"
    "r0=anon(); c=time.process_time(); t=time.perf_counter(); a=open_artifact({path!r}); "
    "t=time.perf_counter()-t; c=time.process_time()-c; print(c, t, (anon()-r0)/1024)"
)


def open_once(tree: Path, artifact: Path) -> tuple[float, float, float]:
    """(CPU s, wall s, RssAnon MiB held) of one open by ``tree``'s package."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # Run in the tree: `python -c` puts the working directory first on sys.path, ahead of
    # PYTHONPATH, so run from another checkout it would import that one.
    out = subprocess.run([sys.executable, "-c", CODE.format(path=str(artifact.resolve()))],
                         env=env, cwd=tree, check=True, capture_output=True,
                         text=True).stdout.split()  # fmt: skip
    cpu, wall, mib = (float(x) for x in out)
    return cpu, wall, mib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH, twice or more")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("artifacts", nargs="+", type=Path)
    args = ap.parse_args()
    trees = {k: Path(v).resolve() for k, v in (t.split("=", 1) for t in args.tree)}
    for artifact in args.artifacts:
        runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                runs[name].append(open_once(tree, artifact))
        for name, got in runs.items():
            cpu = [round(r[0], 3) for r in got]
            wall = [round(r[1], 2) for r in got]
            mib = [round(r[2]) for r in got]
            print(f"{artifact} {name}: CPU s {cpu}, wall s {wall}, RssAnon MiB {mib}")
        first = runs[next(iter(trees))]
        for name, got in list(runs.items())[1:]:
            ratios = [round(b[0] / a[0], 2) for a, b in zip(first, got, strict=True)]
            print(f"{artifact} {name} / first, CPU per round: {ratios}")


if __name__ == "__main__":
    main()
