"""Per-tensor signal-to-quantization-noise ratio of an artifact against its source.

Contract (docs/cli.md, "ninfer eval", ``--sqnr``): for every artifact tensor made from source
values (copy-path outputs are left out: their source is an encoding), 10 log10(sum x^2 / sum
(x - y)^2) in float64 of the source's exact values x and the artifact's dequantized values y;
a NaN or infinity the artifact keeps in place is no noise.  No model is run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .container import Artifact
from .eval_model import Progress
from .eval_report import TensorSqnr
from .loader import ArtifactStateDict
from .source import open_source
from .words import bf16_to_f32_words, f16_to_f32_words


def _source_f64(words: np.ndarray[Any, Any], dtype: str) -> np.ndarray[Any, Any]:
    if dtype == "BF16":
        return (
            bf16_to_f32_words(np.asarray(words, dtype=np.uint16))
            .view(np.float32)
            .astype(np.float64)
        )
    if dtype == "F16":
        return (
            f16_to_f32_words(np.asarray(words, dtype=np.uint16)).view(np.float32).astype(np.float64)
        )
    if dtype == "F32":
        return np.asarray(words, dtype=np.uint32).view(np.float32).astype(np.float64)
    if dtype == "F64":
        return np.asarray(words, dtype=np.uint64).view(np.float64)
    return np.asarray(words).astype(np.float64)


def _sqnr(
    weights: ArtifactStateDict, source_path: str, progress: Progress | None
) -> tuple[TensorSqnr, ...]:
    src = open_source(source_path)
    out: list[TensorSqnr] = []
    art: Artifact = weights.artifact
    for i, key in enumerate(weights):
        stored = weights.stored_name(key)
        fmt = art.tensors[stored].format
        copied = any(
            t["op"] == "copy-quantized" for t in art.tensors[stored].provenance["transforms"]
        )
        if copied or key not in src.tensors:
            continue  # a copy-path output: its source is an encoding, not values
        x = _source_f64(src.read(key).words, src.tensors[key].dtype)
        y = weights[key].double().numpy()
        # A NaN or infinity the artifact keeps in place (stored losslessly) is no noise.
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        with np.errstate(invalid="ignore", over="ignore"):
            noise = float(np.sum(np.where(same, 0.0, x - y) ** 2))
            signal = float(np.sum(np.where(np.isnan(x) & np.isnan(y), 0.0, x) ** 2))
        finite = math.isfinite(noise) and math.isfinite(signal)
        db = (
            10 * (math.log10(signal) - math.log10(noise))
            if finite and noise > 0 and signal > 0
            else None
        )
        out.append(TensorSqnr(key, stored, fmt, db, noise == 0))
        if progress is not None and (i + 1) % 50 == 0:
            progress(f"sqnr {i + 1}/{len(weights)}")
    return tuple(out)
