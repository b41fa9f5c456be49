"""Encoder throughput on a [4096, 16384] BF16 matrix, per grouped format and backend.

Prints source elements/s, source GB/s and the ratio to a memory-copy baseline measured in the
same run (``np.copyto`` of the same BF16 bytes), plus the gguf package's pure-numpy Q8_0
quantizer on the same values as a well-known peer (``pip install -e ".[bench]"``).

    python benchmarks/bench_encode.py [--rows 4096] [--cols 16384] [--json out.json]

``--mse`` adds rows for the encoder profile MSE_F16_SEARCH_V1 through the same fused
encode-and-pack the converter runs: its numpy encoder, its C kernel (when built) and, unless
``--no-torch``, its float64 torch backend on ``--device``.

``--mse-kernel-against OLD.so`` times the profile's C kernel alone instead: the built
``_msekernel`` against another build of it (e.g. a copy of main's), both loaded in this process,
one thread, CPU time of the thread, interleaved rounds (best of ``--repeat``), on every vector
path both can run; it asserts that both write the same bytes.

    python benchmarks/bench_encode.py --rows 4096 --cols 4096 --mse-kernel-against /tmp/old.so
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import best_of, machine

from ninfer_convert.derive.fused import encode_pack_grouped
from ninfer_convert.encoder import encode_grouped_words
from ninfer_convert.encoder.host import native_available, native_mse_available
from ninfer_convert.formats import MSE_F16_SEARCH_V1
from ninfer_convert.layouts.row_split import native_packer_available

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _load_kernel(path: Path) -> ModuleType:
    name = "ninfer_convert._msekernel"
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def mse_kernel_against(old_path: Path, words: np.ndarray, formats: list[str], repeat: int) -> None:
    """The built _msekernel against the build at old_path, kernel alone (see the docstring)."""
    from ninfer_convert.formats import FORMATS
    from ninfer_convert.native import optional_module

    new = optional_module("_msekernel")
    if new is None:
        raise SystemExit("_msekernel is not built")
    old = _load_kernel(old_path)
    n, k = words.shape
    print(f"machine: {machine()}")
    print(f"kernel alone, [{n}, {k}] BF16, one thread, thread CPU time, best of {repeat}")
    for path in ("avx512", "avx2", "sse2"):
        try:
            old.kernel_path(path)
            new.kernel_path(path)
        except ValueError:
            continue
        for fmt in formats:
            f = FORMATS[fmt]
            assert f.group_size is not None and f.qmin is not None and f.qmax is not None
            best = {"old": float("inf"), "new": float("inf")}
            out: dict[str, bytes] = {}
            for _ in range(repeat):
                for label, mod in (("old", old), ("new", new)):
                    codes = np.empty((n, k), np.int8)
                    scales = np.empty((n, -(-k // f.group_size)), np.uint16)
                    t = time.thread_time()
                    got = mod.encode_rows(
                        words, 0, n, k, f.group_size, f.qmin, f.qmax, codes, scales
                    )
                    t = time.thread_time() - t
                    assert got is None
                    best[label] = min(best[label], t)
                    out[label] = codes.tobytes() + scales.tobytes()
            assert out["old"] == out["new"], f"{path} {fmt}: the two builds write different bytes"
            rate = {label: n * k / t / 1e6 for label, t in best.items()}
            print(f"{path:<8}{fmt:<12} old {rate['old']:7.1f}  new {rate['new']:7.1f} M values/s"
                  f"  new/old {best['old'] / best['new']:.3f}x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--mse", action="store_true", help="also time MSE_F16_SEARCH_V1")
    ap.add_argument("--formats", default=",".join(GROUPED))
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--mse-kernel-against", type=Path, metavar="OLD.so")
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols), dtype=np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)  # BF16 words (truncation is fine here)
    if args.mse_kernel_against is not None:
        mse_kernel_against(args.mse_kernel_against, words, args.formats.split(","), args.repeat)
        return
    n = words.size
    nbytes = words.nbytes
    results: dict[str, object] = {"machine": machine(), "shape": [args.rows, args.cols]}

    dst = np.empty_like(words)
    t_copy = best_of(lambda: np.copyto(dst, words), args.repeat)
    rows = [("memcpy (np.copyto)", "-", t_copy)]

    for fmt in args.formats.split(","):
        t_np = best_of(lambda f=fmt: encode_grouped_words(words, "BF16", f), args.repeat)
        rows.append((fmt, "numpy", t_np))
        if args.mse:
            for kernel in ("numpy", "native") if native_mse_available() else ("numpy",):
                t_m = best_of(
                    lambda f=fmt, kern=kernel: encode_pack_grouped(
                        words, "BF16", f, kernel=kern, profile=MSE_F16_SEARCH_V1
                    ),
                    args.repeat,
                )
                rows.append((fmt, f"fused+pack MSE {kernel}", t_m))
            if not args.no_torch:
                t_mt = best_of(
                    lambda f=fmt: encode_grouped_words(
                        words, "BF16", f, backend="torch", device=args.device,
                        profile=MSE_F16_SEARCH_V1,
                    ),
                    args.repeat,
                )  # fmt: skip
                rows.append((fmt, f"MSE torch-{args.device}", t_mt))
        if not args.no_torch:
            t_t = best_of(
                lambda f=fmt: encode_grouped_words(
                    words, "BF16", f, backend="torch", device=args.device
                ),
                args.repeat,
            )
            rows.append((fmt, f"torch-{args.device}", t_t))
        # "native" is the C encoder with the C packer; with only one of them built, say so.
        native = {(True, True): "native", (True, False): "native encoder + numpy pack",
                  (False, True): "numpy encoder + native pack"}.get(
            (native_available(), native_packer_available()))  # fmt: skip
        for kernel in ("numpy", "native") if native is not None else ("numpy",):
            t_f = best_of(
                lambda f=fmt, kern=kernel: encode_pack_grouped(words, "BF16", f, kernel=kern),
                args.repeat,
            )
            rows.append((fmt, f"fused+pack {native if kernel == 'native' else kernel}", t_f))

    try:
        import gguf

        xf = (words.astype(np.uint32) << 16).view(np.float32)
        t_g = best_of(lambda: gguf.quants.quantize(xf, gguf.GGMLQuantizationType.Q8_0), args.repeat)
        rows.append(("gguf Q8_0 (peer)", "gguf numpy", t_g))
    except ImportError:
        print("gguf not installed: pip install -e '.[bench]' to include the peer", file=sys.stderr)

    print(f"machine: {results['machine']}")
    print(
        f"matrix: {args.rows} x {args.cols} BF16 = {n / 1e6:.1f} M elements, {nbytes / 1e6:.0f} MB"
    )
    print(f"{'format':<20}{'backend':<20}{'seconds':>9}{'Melem/s':>10}{'GB/s':>8}{'vs memcpy':>11}")
    table = []
    for fmt, backend, t in rows:
        rate, gbs = n / t / 1e6, nbytes / t / 1e9
        print(f"{fmt:<20}{backend:<20}{t:9.3f}{rate:10.1f}{gbs:8.2f}{t_copy / t:10.3f}x")
        table.append(
            {
                "format": fmt,
                "backend": backend,
                "seconds": t,
                "melem_per_s": rate,
                "gb_per_s": gbs,
                "ratio_vs_memcpy": t_copy / t,
            }
        )
    results["rows"] = table
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
