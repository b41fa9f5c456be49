"""``verify``'s read-ahead of many tiny tensors: the runner requests the stored planes and the
source bytes of every tensor, merged per batch and file into a few ranges (not two requests
per tensor), also when the source stores the tensors in another order than the artifact."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_scaling import RECIPE

from ninfer_convert import readahead
from ninfer_convert.container import open_artifact
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.source import open_source
from ninfer_convert.verify.engine import verify_artifact

COUNT = 700  # three batches of at most 256 tensors


def _shuffled_source(root: Path) -> None:
    """One-element BF16 tensors whose bytes lie in the source in a shuffled order (the
    artifact stores them in name order)."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    slot = np.random.default_rng(7).permutation(COUNT)  # tensor i's position in the data
    header = {
        f"model.layers.{i}.w.weight": {
            "dtype": "BF16",
            "shape": [1],
            "data_offsets": [2 * int(slot[i]), 2 * int(slot[i]) + 2],
        }
        for i in range(COUNT)
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    words = np.zeros(COUNT, dtype=np.uint16)
    words[slot] = np.arange(COUNT) % 0x3F00
    (root / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + words.tobytes())


def _covered(requests: list[tuple[str, int, int]], path: Path, start: int, end: int) -> bool:
    return any(p == str(path) and o <= start and end <= o + n for p, o, n in requests)


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_stored_plane_and_source_range_is_requested_in_few_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    src, out, recipe = tmp_path / "src", tmp_path / "out", tmp_path / "r.yaml"
    _shuffled_source(src)
    recipe.write_text(RECIPE)
    convert_checkpoint(src, recipe, out, device="cpu", jobs=1)
    requests: list[tuple[str, int, int]] = []
    monkeypatch.setattr(readahead, "_submit", lambda p, o, n: requests.append((str(p), o, n)))
    report = verify_artifact(out, source=src, jobs=jobs)
    assert report.exit_code == 0
    art, source = open_artifact(out), open_source(src)
    missing = []
    for name, info in art.tensors.items():
        for plane in info.planes:
            if not _covered(requests, info.file, plane.offset, plane.offset + plane.nbytes):
                missing.append((name, plane.name))
        s = source.tensors[name]
        if not _covered(requests, source.file_path(s.file), s.offset, s.offset + s.nbytes):
            missing.append((name, "source"))
    assert not missing, missing[:5]
    # Back-to-back ranges merged: a few requests per batch at most, not two per tensor.
    assert len(requests) <= 4 * (COUNT // 256 + 1), requests
