"""Peak memory of convert, verify and ``inspect --tensor`` follows a block, not the tensor: a
subprocess converts, verifies and inspects a checkpoint with a 512 MiB tensor (sparse: the
disk holds no data for it) and 32 MiB tensors on the conversion and derive paths, while its
RssAnon is sampled."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
from rss_fixtures import peak_rss_anon_mib

ROOT = Path(__file__).resolve().parents[1]

RECIPE = """\
ninfer_recipe: 1
name: memory
version: "1"
source:
  model_type: [llama]
evidence:
  - id: e1
    citation: test
    summary: memory test only
rules:
  - match: big.weight
    format: Q4G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: weight
    evidence: [e1]
  - match: half.weight
    format: BF16
    conversion: f16-to-bf16-rne
    role: weight
    evidence: [e1]
  - match: widen.weight
    format: FP32
    conversion: bf16-to-f32
    role: weight
  - match: turned.weight
    transforms: [transpose]
    format: Q4G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: weight
    evidence: [e1]
"""

CEILING_MIB = 120
"""Peak RssAnon allowed for the whole process (interpreter and imports: about 25 MiB; each
job's blocks: a few MiB).  Before block streaming this checkpoint peaked near 1 GiB: the F16
conversion alone held about 25x its 32 MiB, and the 512 MiB tensor's planes (136 MiB) were
held whole."""


def _checkpoint(root: Path) -> None:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rng = np.random.default_rng(0)
    values = rng.standard_normal(4096 * 4096, dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    dense = {
        "half.weight": ("F16", [4096, 4096], values.astype(np.float16).tobytes()),
        "widen.weight": ("BF16", [4096, 4096], bf16.tobytes()),
        "turned.weight": ("BF16", [4096, 2048], bf16[: 4096 * 2048].tobytes()),
    }
    big = 32768 * 8192 * 2
    header: dict[str, object] = {"big.weight": {"dtype": "BF16", "shape": [32768, 8192],
                                                "data_offsets": [0, big]}}  # fmt: skip
    offset = big
    for name, (dtype, shape, data) in dense.items():
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
        f.seek(8 + len(raw) + big)  # the big tensor is a hole: all zeros, nothing on disk
        for _dtype, _shape, data in dense.values():
            f.write(data)


def test_convert_and_verify_hold_blocks_not_tensors(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    _checkpoint(src)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from ninfer_convert.convert import convert_checkpoint
        from ninfer_convert.verify.engine import verify_artifact
        convert_checkpoint({str(src)!r}, {str(recipe)!r}, {str(out)!r}, device="cpu", jobs=2)
        report = verify_artifact({str(out)!r}, source={str(src)!r}, jobs=2, device="cpu")
        assert report.exit_code == 0, [c for c in report.checks if c.status == "fail"]
        from ninfer_convert.inspect import inspect_artifact
        for name in ("widen.weight", "turned.weight"):  # inspect --tensor
            assert inspect_artifact({str(out)!r}, tensor=name).details is not None
        print("ok")
        """
    )
    peak, output = peak_rss_anon_mib([sys.executable, "-c", script])
    assert output.strip().endswith("ok")
    assert peak < CEILING_MIB, f"peak RssAnon {peak:.0f} MiB"
    print(f"peak RssAnon {peak:.0f} MiB")
