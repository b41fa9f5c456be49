"""Pinned bytes of whole conversions: the committed examples with their shipped recipes, and one
small checkpoint per copy path, so a refactoring that changes any output byte is caught.

Every file of each output directory is pinned by its xxh3-128.  The artifact header and the
model card record the source directory's absolute path, so the test maps exactly that path to a
fixed one (``/pinned/<name>``) and the digests do not depend on where the checkout lives.  A
digest change here must be a deliberate format or card change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import xxhash
from st_helpers import write_safetensors

from ninfer_convert.container import open_artifact
from ninfer_convert.convert import convert_checkpoint

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE_DIGESTS = {
    ("tiny-qwen3.5", "qwen3.6-27b"): {
        "README.md": "c18c9baa99792d96d259630200f36fe9",
        "config.json": "e8498610f5ced996c76f94964d22a0dc",
        "generation_config.json": "5bdc5cc4591e54fb81b11fba4e99e13f",
        "model.ninfer": "0d190c1253a1229b4460ce63888928e3",
    },
    ("tiny-qwen3.5-nvfp4", "qwen3.6-27b-nvfp4"): {
        "README.md": "d41714055fdc68a46e7479d19e6d0542",
        "config.json": "954ed5a59bee4e90db828306a071c093",
        "generation_config.json": "5bdc5cc4591e54fb81b11fba4e99e13f",
        "model.ninfer": "765e4752e265153199bfa9a8936573ce",
    },
}

COPY_DIGESTS: dict[str, dict[str, str]] = {
    "compressed-tensors-nvfp4": {
        "README.md": "35d19071923c110930804c3fe28bd3dd",
        "config.json": "c8f51b41915517812e68e3cc3ed147ca",
        "model.ninfer": "afe907af84c9150ad56ced2914ce6e29",
    },
    "modelopt-nvfp4": {
        "README.md": "e71ed003dcdf5bb1e44cb258602f8307",
        "config.json": "c8f51b41915517812e68e3cc3ed147ca",
        "model.ninfer": "a605135eefe3c24016dca9d91a283964",
    },
    "compressed-tensors-fp8-channel": {
        "README.md": "da568108ff7d43f9be09be1dd97a07c9",
        "config.json": "c8f51b41915517812e68e3cc3ed147ca",
        "model.ninfer": "8ed37bbe1b87abd1a01b1bd865c3c599",
    },
}


def _convert_pinned(
    monkeypatch: pytest.MonkeyPatch, source: Path, recipe: Path, out: Path, name: str
) -> dict[str, str]:
    """Convert with ``source`` recorded as ``/pinned/<name>``; the digest of every output file."""
    real = os.path.abspath
    where = real(source)

    def pinned(path: str | os.PathLike[str]) -> str:
        full = real(path)
        return f"/pinned/{name}" if full == where else full

    monkeypatch.setattr(os.path, "abspath", pinned)
    convert_checkpoint(source, recipe, out, device="cpu")
    monkeypatch.undo()
    return {p.name: xxhash.xxh3_128_hexdigest(p.read_bytes()) for p in sorted(out.iterdir())}


@pytest.mark.parametrize(("example", "recipe"), list(EXAMPLE_DIGESTS))
def test_example_conversion_bytes_are_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example: str, recipe: str
) -> None:
    digests = _convert_pinned(
        monkeypatch,
        ROOT / "examples" / example,
        ROOT / "recipes" / f"{recipe}.yaml",
        tmp_path / "out",
        example,
    )
    assert digests == EXAMPLE_DIGESTS[(example, recipe)]


_HEAD = """\
ninfer_recipe: 1
name: pinned-copy
version: "1"
source:
  model_type: llama
rules:
"""


def _copy_source(root: Path, path: str) -> str:
    """A small checkpoint for ``path``: three output matrices with K = 48 and N = 5, 130 and 1
    (a row count past one 128-row scale tile), plus a companion tensor; returns the rules."""
    rng = np.random.default_rng(20261201)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    k = 48
    for i, n in enumerate((5, 130, 1)):
        x = f"model.layers.{i}.proj"
        if path == "compressed-tensors-fp8-channel":
            codes = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
            codes[(codes & 0x7F) == 0x7F] = 0x3C
            exps = rng.integers(100, 140, size=(n, 1), dtype=np.uint32)
            words = (exps << np.uint32(23)) | (rng.integers(0, 128, (n, 1), np.uint32) << 16)
            scale: tuple[str, np.ndarray]
            if i == 0:
                scale = ("F32", words)
            elif i == 1:
                scale = ("BF16", (words >> np.uint32(16)).astype(np.uint16))
            else:
                scale = ("F16", np.full((n, 1), 0x3C00, dtype=np.uint16))
            tensors[x + ".weight"] = ("F8_E4M3", codes)
            tensors[x + ".weight_scale"] = scale
            continue
        packed = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
        scales = rng.integers(0, 0x7F, size=(n, k // 16), dtype=np.uint8)
        if path == "compressed-tensors-nvfp4":
            tensors[x + ".weight_packed"] = ("U8", packed)
            tensors[x + ".weight_scale"] = ("F8_E4M3", scales)
            tensors[x + ".weight_global_scale"] = ("F32", np.array([0x43E00000 + i], np.uint32))
            tensors[x + ".input_global_scale"] = ("F32", np.array([0x3F800000], np.uint32))
        else:
            tensors[x + ".weight"] = ("U8", packed)
            tensors[x + ".weight_scale"] = ("F8_E4M3", scales)
            tensors[x + ".weight_scale_2"] = ("F32", np.array(0x3E000000 - (i << 23), np.uint32))
            tensors[x + ".input_scale"] = ("F32", np.array(0x3F800000, np.uint32))
    root.mkdir()
    write_safetensors(root / "model.safetensors", tensors)
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    fmt = "FP8_E4M3FN_ROW_BF16S" if path.endswith("fp8-channel") else "NVFP4"
    return _HEAD + (
        f"- match: 're:model\\.layers\\.\\d+\\.proj\\.weight'\n  copy: {path}\n"
        f"  format: {fmt}\n  role: linear\n"
        "- match: '*'\n  format: FP32\n  role: other\n  optional: true\n"
    )


@pytest.mark.parametrize("path", list(COPY_DIGESTS))
def test_copy_path_conversion_bytes_are_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    recipe = _copy_source(tmp_path / "src", path)
    (tmp_path / "recipe.yaml").write_text(recipe)
    digests = _convert_pinned(
        monkeypatch, tmp_path / "src", tmp_path / "recipe.yaml", tmp_path / "out", path
    )
    with open_artifact(tmp_path / "out") as art:
        copied = sorted((n, t.format) for n, t in art.tensors.items() if t.format != "FP32")
    fmt = "FP8_E4M3FN_ROW_BF16S" if path.endswith("fp8-channel") else "NVFP4"
    assert copied == [(f"model.layers.{i}.proj.weight", fmt) for i in range(3)]
    assert digests == COPY_DIGESTS[path]
