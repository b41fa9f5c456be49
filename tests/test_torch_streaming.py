"""The torch (CUDA) path streams: :func:`~ninfer_convert.derive.fused.encode_pack_torch` encodes a
row block at a time with the torch backend and stores each packed block before the next one
starts, with the bytes of the host path.  Runs on torch's CPU device (the same code as CUDA
apart from the stager); a CUDA variant runs where a GPU is present."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ninfer_convert import convert
from ninfer_convert.derive import entry as entry_module
from ninfer_convert.derive.fused import encode_pack_grouped, encode_pack_torch
from ninfer_convert.errors import EncodeError

torch = pytest.importorskip("torch")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _words(source: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    if source == "BF16":
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    if source == "F16":
        return x.astype(np.float16).view(np.uint16)
    return x.view(np.uint32)


class _Recording:
    """A sink that keeps what it is given and the largest single write."""

    def __init__(self, sizes: list[int]) -> None:
        self.planes = [np.zeros(s, dtype=np.uint8) for s in sizes]
        self.largest = 0

    def write(self, plane: int, offset: int, data: np.ndarray, /) -> None:
        self.planes[plane][offset : offset + data.size] = data
        self.largest = max(self.largest, int(data.size))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q6G64_F16S", "W8G32_F16S"])
def test_torch_blocks_give_the_host_planes(device: str, source: str, fmt: str) -> None:
    n, k = 45, 320
    words = _words(source, n, k)
    want = encode_pack_grouped(words, source, fmt, threads=1)
    out = [np.zeros_like(p) for p in want]
    got = encode_pack_torch(words, source, fmt, device=device, out=out, block_elements=8 * k)
    assert [p.tobytes() for p in got] == [p.tobytes() for p in want]
    # Through a sink: the out planes are not written, and no write exceeds one block's rows.
    ro = [np.zeros_like(p) for p in want]
    for p in ro:
        p.flags.writeable = False
    sink = _Recording([p.size for p in want])
    encode_pack_torch(words, source, fmt, device=device, out=ro, sink=sink, block_elements=8 * k)
    assert [p.tobytes() for p in sink.planes] == [p.tobytes() for p in want]
    assert sink.largest <= max(p.size // n for p in want) * 8 < max(p.size for p in want)


def test_torch_block_errors_name_the_tensor_row() -> None:
    words = _words("BF16", 40, 128)
    words[37, 70] = 0x7FC0  # NaN in the fifth block of 8 rows
    out = [np.zeros_like(p) for p in encode_pack_grouped(_words("BF16", 40, 128), "BF16",
                                                            "Q4G64_F16S")]  # fmt: skip
    with pytest.raises(EncodeError, match="row 37"):
        encode_pack_torch(words, "BF16", "Q4G64_F16S", device="cpu", out=out, tensor="t",
                          block_elements=8 * 128)  # fmt: skip


def test_convert_torch_path_streams_the_host_bytes_and_spot_checks_each_block(
    tmp_path: Path,
) -> None:
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    (src_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    data = _words("BF16", 300, 1024).astype("<u2").tobytes()
    header = {"w.weight": {"dtype": "BF16", "shape": [300, 1024], "data_offsets": [0, len(data)]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (src_dir / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        'ninfer_recipe: 1\nname: t\nversion: "1"\nsource:\n  model_type: [llama]\n'
        "evidence:\n  - id: e\n    citation: t\n    summary: t\nrules:\n"
        "  - match: w.weight\n    format: Q4G64_F16S\n"
        "    encoder_profile: MAXABS_F16_RECIP_RNE_V1\n    role: weight\n    evidence: [e]\n"
    )
    src, plan = convert.plan_conversion(src_dir, recipe)
    (entry,) = plan.entries
    want = entry_module.derive_packed(entry, src, device="cpu").planes
    sink = _Recording([p.size for p in want])
    out = [np.zeros_like(p) for p in want]
    packed = entry_module._packed_torch(entry, src, "cpu", out, sink, seed=1)
    assert [p.tobytes() for p in sink.planes] == [p.tobytes() for p in want]
    # 300 rows of 1024 in one 16 M-value block: 4 spot-checked rows.
    assert packed.spot_rows == 4
