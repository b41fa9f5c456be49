"""Convert stores every large tensor through its reservation's sink (a ``pwrite`` into the
reserved bytes), never by writing mapped file pages: storing into freshly allocated mapped
pages cost a fault and a zeroed page per page and made the 4 GB Q4 convert 16 % slower
(docs/performance.md, issue 12).  Proven by converting with the mapped planes made read-only:
the artifact is byte-identical to a normal run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ninfer_convert.container import writer as writer_module
from ninfer_convert.convert import convert_checkpoint

RECIPE = """\
ninfer_recipe: 1
name: sink
version: "1"
source:
  model_type: [llama]
evidence:
  - id: e1
    citation: test
    summary: sink test only
rules:
  - match: copy.weight
    format: BF16
    role: weight
  - match: half.weight
    format: BF16
    conversion: f16-to-bf16-rne
    role: weight
    evidence: [e1]
  - match: re:q.*
    format: Q4G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: weight
    evidence: [e1]
"""


def _checkpoint(root: Path) -> None:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    values = np.random.default_rng(3).standard_normal(512 * 1024, dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    tensors = {  # each above the writer's 256 KiB in-memory limit: mapped reservations
        "copy.weight": ("BF16", [256, 1024], bf16[: 256 * 1024].tobytes()),
        "half.weight": ("F16", [256, 1024], values[: 256 * 1024].astype("<f2").tobytes()),
        "q.weight": ("BF16", [512, 1024], bf16.tobytes()),
        "q16.weight": ("F16", [512, 1024], values.astype("<f2").tobytes()),
    }
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(root / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _dtype, _shape, data in tensors.values():
            f.write(data)


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix == ".ninfer"}


def test_convert_never_writes_the_mapped_planes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    _checkpoint(src)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    convert_checkpoint(src, recipe, tmp_path / "normal", device="cpu", jobs=2)

    real = writer_module.ArtifactWriter.reserve
    mapped: list[str] = []

    def read_only(self: writer_module.ArtifactWriter, *args: object, **kw: object) -> object:
        res = real(self, *args, **kw)  # type: ignore[arg-type]
        if not res.inline:
            mapped.append(res.name)
            for plane in res.planes:
                plane.flags.writeable = False
        return res

    monkeypatch.setattr(writer_module.ArtifactWriter, "reserve", read_only)
    convert_checkpoint(src, recipe, tmp_path / "sink", device="cpu", jobs=2)
    assert sorted(mapped) == ["copy.weight", "half.weight", "q.weight", "q16.weight"]
    assert _files(tmp_path / "sink") == _files(tmp_path / "normal")
