"""Shared helpers for the layout and container tests: deterministic logical tensors per format,
minimal valid metadata/provenance, and a tool to rewrite a container's header consistently."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ninfer_convert.container import ArtifactWriter
from ninfer_convert.container.wire import PRELUDE, PRELUDE_SIZE, canonical_json, header_digest
from ninfer_convert.formats import FORMATS
from ninfer_convert.logical import (
    DirectWords,
    FP8RowWords,
    GroupedCodes,
    LogicalTensor,
    NVFP4Words,
)

ALL_FORMATS = list(FORMATS)
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
DIRECT = ["BF16", "FP32", "I32"]

META: dict[str, Any] = {
    "producer": {"name": "ninfer-convert", "version": "0.1.0"},
    "recipe": {
        "name": "test-recipe",
        "text": "rules:\n  - match: '*'\n",
        "digest": "0" * 32,
        "evidence": ["https://example.org/evidence"],
    },
    "source": {
        "kind": "safetensors",
        "path": "/models/tiny",
        "config": {"model_type": "tiny", "rms_norm_eps": 1e-06, "layers": [1, 2]},
        "files": [{"name": "model.safetensors", "size": 1234}],
        "tensors": {"w": {"dtype": "BF16", "shape": [3, 70], "digest": "f" * 32}},
    },
}


def provenance(fmt: str, name: str = "w", shape: Iterable[int] = (3, 70)) -> dict[str, Any]:
    """A valid provenance object for a tensor of ``fmt``."""
    grouped = fmt in GROUPED
    transforms: list[dict[str, Any]] = []
    if fmt in ("NVFP4", "FP8_E4M3FN_ROW_BF16S"):
        transforms = [{"op": "copy-quantized", "scheme": "compressed-tensors"}]
    return {
        "sources": [
            {"name": name, "dtype": "BF16", "shape": list(shape), "file": "model.safetensors"}
        ],
        "conversion": None,
        "transforms": transforms,
        "encoder_profile": "MAXABS_F16_RECIP_RNE_V1" if grouped else None,
        "rule": {"index": 0, "line": 2, "pattern": "*"},
        "constraints": [],
    }


def make_logical(fmt: str, shape: tuple[int, ...], seed: int = 0) -> LogicalTensor:
    """Random but deterministic logical words of ``fmt`` covering the whole legal word range."""
    rng = np.random.default_rng(seed)
    f = FORMATS[fmt]
    if fmt == "BF16":
        return DirectWords(rng.integers(0, 1 << 16, shape, dtype=np.uint16))
    if fmt == "FP32":
        return DirectWords(rng.integers(0, 1 << 32, shape, dtype=np.uint32))
    if fmt == "I32":
        return DirectWords(rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int32))
    n, k = shape
    if f.is_grouped:
        assert f.qmin is not None and f.qmax is not None and f.group_size is not None
        codes = rng.integers(f.qmin, f.qmax + 1, (n, k), dtype=np.int8)
        scales = rng.integers(0, 0x7C00, (n, -(-k // f.group_size)), dtype=np.uint16)
        return GroupedCodes(codes, scales)
    if fmt == "NVFP4":
        codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
        scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)
        return NVFP4Words(codes, scales, 0x3F800000)
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    scales = rng.integers(0, 0x7F80, (n,), dtype=np.uint16)
    return FP8RowWords(codes, scales)


def logical_equal(a: LogicalTensor, b: LogicalTensor) -> bool:
    """Bit-exact equality of two logical tensors (dtype, shape and every word)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, DirectWords):
        assert isinstance(b, DirectWords)
        return a.words.dtype == b.words.dtype and np.array_equal(a.words, b.words)
    if isinstance(a, NVFP4Words):
        assert isinstance(b, NVFP4Words)
        if a.divisor != b.divisor:
            return False
    ca, cb = a.codes, b.codes  # type: ignore[union-attr]
    sa, sb = a.scales, b.scales  # type: ignore[union-attr]
    return (
        ca.dtype == cb.dtype
        and sa.dtype == sb.dtype
        and np.array_equal(ca, cb)
        and np.array_equal(sa, sb)
    )


DEFAULT_SHAPES: dict[str, tuple[int, ...]] = {
    "BF16": (3, 5),
    "FP32": (7,),
    "I32": (),
    "Q4G64_F16S": (3, 70),
    "Q5G64_F16S": (2, 130),
    "Q6G64_F16S": (1, 64),
    "W8G32_F16S": (2, 33),
    "NVFP4": (3, 48),
    "FP8_E4M3FN_ROW_BF16S": (2, 5),
}


def write_small(
    out: Path,
    formats: Iterable[str] = ALL_FORMATS,
    *,
    alignment: int = 64,
    max_shard_size: int | None = None,
    side_files: dict[str, bytes] | None = None,
    tmp_src: Path | None = None,
) -> Path:
    """Write one small tensor of each format (named after the format) and commit."""
    with ArtifactWriter(
        out, metadata=META, alignment=alignment, max_shard_size=max_shard_size
    ) as w:
        for i, fmt in enumerate(formats):
            shape = DEFAULT_SHAPES[fmt]
            w.add(
                f"t.{fmt}",
                fmt,
                make_logical(fmt, shape, seed=i),
                role="weight",
                provenance=provenance(fmt, shape=shape),
            )
        for name, data in (side_files or {}).items():
            assert tmp_src is not None
            src = tmp_src / f"src-{name}"
            src.write_bytes(data)
            w.add_file(src, name)
    return out


def rewrite_header(path: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``edit`` to the header JSON of a container and rewrite prelude, header and digest
    consistently (so only the semantic checks can catch the change)."""
    data = path.read_bytes()
    _magic, major, minor, reserved, h_off, h_len, _ = PRELUDE.unpack(data[:PRELUDE_SIZE])
    header = json.loads(data[h_off : h_off + h_len])
    result = edit(header)
    if result is not None:
        header = result
    raw = header if isinstance(header, bytes) else canonical_json(header)
    write_raw_header(path, data[:h_off], raw, major=major, minor=minor, reserved=reserved)


def write_raw_header(
    path: Path,
    payload: bytes,
    raw: bytes,
    *,
    major: int = 1,
    minor: int = 0,
    reserved: int = 0,
    h_off: int | None = None,
    h_len: int | None = None,
) -> None:
    """Write ``payload`` (prelude bytes included, rewritten) followed by ``raw`` as header."""
    off = len(payload) if h_off is None else h_off
    length = len(raw) if h_len is None else h_len
    head = PRELUDE.pack(b"\x89NINFER\n", major, minor, reserved, off, length, bytes(16))
    prelude = head[:32] + header_digest(head, raw)
    path.write_bytes(prelude + payload[PRELUDE_SIZE:] + raw)


def header_of(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    h_off, h_len = struct.unpack_from("<QQ", data, 16)
    return json.loads(data[h_off : h_off + h_len])  # type: ignore[no-any-return]
