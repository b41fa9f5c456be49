"""Build the golden artifacts: one small single-file artifact per registered format.

The inputs are fixed arithmetic patterns (no random generator whose stream could change between
numpy releases).  ``python tests/golden/make_golden.py`` rewrites the committed files; only do that
for a deliberate, versioned format change.  tests/test_golden_artifacts.py rebuilds each artifact
and compares it with the committed file byte for byte.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ninfer_convert.container import SINGLE_NAME, ArtifactWriter
from ninfer_convert.logical import (
    DirectWords,
    FP8RowWords,
    GroupedCodes,
    LogicalTensor,
    NVFP4Words,
)

HERE = Path(__file__).parent
ALIGNMENT = 64

GOLDEN_META: dict[str, Any] = {
    "producer": {"name": "ninfer-convert", "version": "golden"},
    "recipe": {"name": "golden", "text": "golden: true\n", "digest": "", "evidence": []},
    "source": {"kind": "synthetic", "path": "", "config": None, "files": [], "tensors": {}},
}


def _pattern(shape: tuple[int, int], mul: int, add: int, mod: int, low: int) -> np.ndarray:
    n, k = shape
    i = np.arange(n * k, dtype=np.int64).reshape(n, k)
    return (i * mul + add) % mod + low


def golden_logical(fmt: str) -> LogicalTensor:
    """The fixed logical tensor stored in the golden artifact of ``fmt``."""
    if fmt == "BF16":
        # +0, -0, 1.0, quiet NaN with payload, -inf, minimum subnormal.
        words = np.array([[0x0000, 0x8000, 0x3F80], [0x7FC1, 0xFF80, 0x0001]], np.uint16)
        return DirectWords(words)
    if fmt == "FP32":
        # A 0-D tensor: one signalling NaN with payload.
        return DirectWords(np.array(0x7FA00001, dtype=np.uint32).reshape(()))
    if fmt == "I32":
        return DirectWords(np.array([-(2**31), -1, 2**31 - 1], np.int32))
    if fmt in ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"):
        bits, group, shape = {
            "Q4G64_F16S": (4, 64, (2, 70)),
            "Q5G64_F16S": (5, 64, (1, 130)),
            "Q6G64_F16S": (6, 64, (3, 64)),
            "W8G32_F16S": (8, 32, (2, 33)),
        }[fmt]
        if bits == 8:
            codes = _pattern(shape, 37, 11, 255, -127)
        else:
            codes = _pattern(shape, 5, 3, 1 << bits, -(1 << (bits - 1)))
        groups = -(-shape[1] // group)
        # binary16 scales 0x3C00 (1.0), 0x3800 (0.5), ... and one +0 scale with zero codes.
        scales = (0x3C00 - 0x0400 * np.arange(shape[0] * groups)).reshape(shape[0], groups)
        scales = scales.astype(np.uint16)
        scales[0, 0] = 0x0000
        codes[0, :group] = 0
        return GroupedCodes(codes.astype(np.int8), scales)
    if fmt == "NVFP4":
        codes = _pattern((2, 32), 1, 0, 16, 0).astype(np.uint8)
        scales = np.array([[0x38, 0x40], [0x00, 0x7E]], np.uint8)  # 1.0, 2.0, +0, 448
        return NVFP4Words(codes, scales, 0x40C00000)  # d_w = 6.0
    if fmt == "FP8_E4M3FN_ROW_BF16S":
        codes = np.array([[0x00, 0x80, 0x7E], [0x38, 0xFE, 0x01]], np.uint8)
        scales = np.array([0x3F80, 0x3B80], np.uint16)  # 1.0, 2^-8
        return FP8RowWords(codes, scales)
    raise KeyError(fmt)


def golden_provenance(fmt: str) -> dict[str, Any]:
    grouped = fmt.startswith(("Q", "W8"))
    return {
        "sources": [{"name": "w", "dtype": "F32", "shape": [], "file": "synthetic"}],
        "conversion": None,
        "transforms": [],
        "encoder_profile": "MAXABS_F16_RECIP_RNE_V1" if grouped else None,
        "rule": {"index": 0, "line": 1, "pattern": "w"},
        "constraints": [],
    }


def build(fmt: str, out_dir: Path) -> Path:
    """Write the golden artifact of ``fmt`` into the new directory ``out_dir``; return its file."""
    with ArtifactWriter(out_dir, metadata=GOLDEN_META, alignment=ALIGNMENT) as w:
        w.add("w", fmt, golden_logical(fmt), role="weight", provenance=golden_provenance(fmt))
    return out_dir / SINGLE_NAME


def golden_path(fmt: str) -> Path:
    return HERE / f"{fmt}.ninfer"


def main() -> int:
    from ninfer_convert.formats import FORMATS

    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            data = build(fmt, Path(tmp) / fmt).read_bytes()
            golden_path(fmt).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
