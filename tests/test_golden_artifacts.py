"""Golden bytes: one committed single-file artifact per format, rebuilt and compared byte for byte,
so the prelude, header, plane order, padding and alignment cannot drift silently."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import xxhash
from artifact_fixtures import logical_equal

from ninfer_convert.container import open_artifact
from ninfer_convert.formats import FORMATS

sys.path.insert(0, str(Path(__file__).parent / "golden"))

from make_golden import build, golden_logical, golden_path

# xxh3-128 of each committed golden file: a change here must be a deliberate format change.
GOLDEN_DIGESTS = {
    "BF16": "f93ecfcacf7f88b4424f6f460b29af2b",
    "FP32": "089ed3ca84a5ed37af311238cc6165bf",
    "I32": "edd94a774c3be663506d23c3613c40b4",
    "Q4G64_F16S": "2156ac7be895a6a9c1bc27e113d16ac0",
    "Q5G64_F16S": "3b0c33de75a03388b34760b7edaeb3dd",
    "Q6G64_F16S": "8c2dc4e42f65a7c237439078d2ab1fbc",
    "W8G32_F16S": "3b60fb9239ed4b937033b97ffb58ee3d",
    "NVFP4": "95e69cf50855337409f63143ed85e935",
    "FP8_E4M3FN_ROW_BF16S": "9b4da23e1d9f64b2dec8c29d7da0d9cd",
}


def test_every_format_has_a_golden_file() -> None:
    assert set(GOLDEN_DIGESTS) == set(FORMATS)
    for fmt in FORMATS:
        assert golden_path(fmt).is_file(), fmt


def _first_difference(a: bytes, b: bytes) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first difference at byte {i}: built 0x{x:02x}, golden 0x{y:02x}"
    return f"lengths differ: built {len(a)}, golden {len(b)}"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_golden_bytes(tmp_path: Path, fmt: str) -> None:
    golden = golden_path(fmt).read_bytes()
    assert xxhash.xxh3_128_hexdigest(golden) == GOLDEN_DIGESTS[fmt]
    built = build(fmt, tmp_path / fmt).read_bytes()
    assert built == golden, _first_difference(built, golden)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_golden_reads_back(fmt: str) -> None:
    with open_artifact(golden_path(fmt)) as art:
        (info,) = art.tensors.values()
        assert info.format == fmt
        assert logical_equal(art.read("w"), golden_logical(fmt))
        assert art.integrity_problems() == []
        assert art.padding_problems() == []


def test_container_doc_hexdump_matches_golden() -> None:
    """The worked example in docs/container.md is the committed golden file, byte for byte."""
    doc = (Path(__file__).parent.parent / "docs" / "container.md").read_text(encoding="utf-8")
    marker = "<!-- golden-hexdump: tests/golden/BF16.ninfer -->"
    assert marker in doc
    block = doc.split(marker, 1)[1].split("```", 2)[1]
    data = bytearray()
    for line in block.strip().splitlines():
        offset, rest = line.split(": ", 1)
        assert int(offset, 16) == len(data)
        data += bytes.fromhex(rest[:40].replace(" ", ""))
    assert bytes(data) == golden_path("BF16").read_bytes()
