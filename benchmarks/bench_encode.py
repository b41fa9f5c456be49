"""Encoder throughput on a [4096, 16384] BF16 matrix, per grouped format and backend.

Prints source elements/s, source GB/s and the ratio to a memory-copy baseline measured in the
same run (``np.copyto`` of the same BF16 bytes), plus the gguf package's pure-numpy Q8_0
quantizer on the same values as a well-known peer (``pip install -e ".[bench]"``).

    python benchmarks/bench_encode.py [--rows 4096] [--cols 16384] [--json out.json]

``--mse`` adds rows for the encoder profile MSE_F16_SEARCH_V1 through the same fused
encode-and-pack the converter runs: its numpy encoder, its C kernel (when built) and, unless
``--no-torch``, its float64 torch backend on ``--device``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import best_of, machine

from ninfer_convert.derive.fused import encode_pack_grouped
from ninfer_convert.encoder import encode_grouped_words
from ninfer_convert.encoder.host import native_available, native_mse_available
from ninfer_convert.formats import MSE_F16_SEARCH_V1
from ninfer_convert.layouts.row_split import native_packer_available

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


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
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.rows, args.cols), dtype=np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)  # BF16 words (truncation is fine here)
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
