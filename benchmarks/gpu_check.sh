#!/usr/bin/env bash
# One script for a GPU machine: the CUDA parity tests, a CUDA-vs-CPU conversion that must be
# byte-identical, and the GPU encoder benchmark.  Results go to $OUT (default ./gpu-results).
#
#   bash benchmarks/gpu_check.sh            # after: pip install -e ".[test]"
#
# Exit status is non-zero if any parity check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"

python - <<'PY' | tee "$OUT/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE")
assert torch.cuda.is_available(), "no CUDA device visible to torch"
PY

# 1. IEEE behaviour of every operation used, the boundary corpus, the three-backend parity and
#    the pinned, double-buffered chunk staging (many small chunks, errors in later chunks),
#    on CPU and CUDA (the tests parametrize over the devices torch sees).
python -m pytest -q tests/test_torch_ieee.py tests/test_encoder.py tests/test_torch_staging.py 2>&1 | tee "$OUT/parity-tests.txt"

# 2. The converter on CUDA must write the same bytes as on the CPU.
rm -rf "$OUT/cpu" "$OUT/cuda"
python -m ninfer_convert convert examples/tiny-qwen3.5 --recipe recipes/qwen3.6-27b.yaml \
    --output "$OUT/cpu" --device cpu --json > "$OUT/convert-cpu.json"
python -m ninfer_convert convert examples/tiny-qwen3.5 --recipe recipes/qwen3.6-27b.yaml \
    --output "$OUT/cuda" --device cuda --json > "$OUT/convert-cuda.json"
cmp "$OUT/cpu/model.ninfer" "$OUT/cuda/model.ninfer"
echo "CUDA and CPU artifacts are byte-identical" | tee "$OUT/identical.txt"

# 3. Encoder throughput on the GPU next to numpy in the same run.
python benchmarks/bench_encode.py --device cuda --json "$OUT/bench-encode-cuda.json" \
    | tee "$OUT/bench-encode-cuda.txt"
