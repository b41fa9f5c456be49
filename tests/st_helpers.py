"""Write safetensors files with any dtype (including BF16 and F8_E4M3) from raw numpy words."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, np.ndarray]], metadata: dict[str, str] | None = None
) -> None:
    """``tensors`` maps name -> (safetensors dtype string, array of words in that width)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    blobs = []
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)
