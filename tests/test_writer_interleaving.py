"""Any interleaving of ``reserve``/``complete`` runs (small tensors queued in memory without a
flush or seek of the shard handle, large ones written through the sink) and ``add_packed``
calls gives the bytes that ``add_packed`` alone gives, with and without shard splits."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from artifact_fixtures import META, make_logical, provenance
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer_convert.container import ArtifactWriter
from ninfer_convert.layouts import layout_for

# Sizes on both sides of the writer's 256 KiB in-memory bound, and empty ones.
SHAPES = {"tiny": (3,), "small": (2, 64), "edge": (128, 1024), "large": (160, 1024),
          "empty": (0, 5)}  # fmt: skip


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(sorted(SHAPES)), min_size=1, max_size=10),
    runs=st.lists(st.integers(0, 4), min_size=10, max_size=10),
    split=st.sampled_from([None, 300 << 10, 700 << 10]),
    pieces=st.booleans(),
)
def test_any_interleaving_gives_the_bytes_of_add_packed(
    kinds: list[str], runs: list[int], split: int | None, pieces: bool
) -> None:
    fmt = "BF16"
    tensors = [(f"t{i}", SHAPES[k]) for i, k in enumerate(kinds)]
    packed = {n: layout_for(fmt).pack(fmt, make_logical(fmt, s, i))
              for i, (n, s) in enumerate(tensors)}  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="reviewA-", dir="/tmp"))
    try:
        with ArtifactWriter(root / "p", metadata=META, alignment=64, max_shard_size=split) as w:
            for name, shape in tensors:
                w.add_packed(name, fmt, shape, packed[name], role="r",
                             provenance=provenance(fmt))  # fmt: skip
        with ArtifactWriter(root / "r", metadata=META, alignment=64, max_shard_size=split) as w:
            i = 0
            for run in runs:
                if i >= len(tensors):
                    break
                if run == 0:  # one add_packed between reservation runs
                    name, shape = tensors[i]
                    w.add_packed(name, fmt, shape, packed[name], role="r",
                                 provenance=provenance(fmt))  # fmt: skip
                    i += 1
                    continue
                held = [w.reserve(n, fmt, s, role="r", provenance=provenance(fmt))
                        for n, s in tensors[i : i + run]]  # fmt: skip
                i += len(held)
                for res in reversed(held):
                    data = np.asarray(packed[res.name][0]).reshape(-1).view(np.uint8)
                    if pieces and data.size > 1:
                        cut = data.size // 2
                        res.sink.write(0, cut, data[cut:])
                        res.sink.write(0, 0, data[:cut])
                    else:
                        res.sink.write(0, 0, data)
                for res in held:
                    w.complete(res)
            for name, shape in tensors[i:]:
                w.add_packed(name, fmt, shape, packed[name], role="r",
                             provenance=provenance(fmt))  # fmt: skip
        assert _files(root / "r") == _files(root / "p")
    finally:
        shutil.rmtree(root)
