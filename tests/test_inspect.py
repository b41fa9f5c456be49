"""inspect (library): header-only summary, exact per-format bits per weight, tensor details."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from verify_fixtures import write_all_formats_source

from ninfer_convert.container import open_artifact
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import ArtifactError, UsageError
from ninfer_convert.formats import FORMATS
from ninfer_convert.inspect import (
    INSPECT_SCHEMA_VERSION,
    inspect_artifact,
    logical_bits,
    summarize,
    tensor_details,
)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("inspect")
    src, recipe = write_all_formats_source(work / "src")
    out = work / "art"
    convert_checkpoint(src, recipe, out, device="cpu", alignment=64)
    return out


def test_summary_reads_only_the_header(artifact: Path) -> None:
    with open_artifact(artifact) as art:
        with (
            mock.patch.object(type(art), "read", side_effect=AssertionError("payload read")),
            mock.patch.object(type(art), "plane_buffer", side_effect=AssertionError("payload")),
        ):
            report = summarize(art)
        files = art.files
    assert report.tensor_count == 16 and len(report.tensors) == 16
    assert {f.format for f in report.formats} == set(FORMATS)
    assert report.total_bytes == sum(p.stat().st_size for p in files)
    assert report.total_bytes == report.plane_bytes + report.header_bytes + report.gap_bytes + 48
    assert report.producer["name"] == "ninfer-convert"
    assert report.recipe["name"] == "every-format-test"
    assert report.source["tensor_count"] == 21 and report.source["model_type"] == "test"


def test_bits_per_weight_are_exact(artifact: Path) -> None:
    report = inspect_artifact(artifact)
    by = {f.format: f for f in report.formats}
    # Q6 [40, 96]: 6 bits per code + 2 groups of 16-bit scales per 96-weight row.
    assert by["Q6G64_F16S"].logical_bits_per_weight == pytest.approx(6 + 2 * 16 / 96)
    # Stored: rows padded to 128 codes -> 64 + 32 bytes of code planes + 2 scale slots (4 bytes).
    assert by["Q6G64_F16S"].physical_bits_per_weight == pytest.approx(8 * (64 + 32 + 4) / 96)
    assert by["BF16"].logical_bits_per_weight == by["BF16"].physical_bits_per_weight == 16
    # NVFP4 [4, 32]: 4 bits + one E4M3 byte per 16 + the 32-bit divisor.
    nv = (4 * 32 * 4 + 4 * 2 * 8 + 32) / (4 * 32)
    assert by["NVFP4"].logical_bits_per_weight == pytest.approx(nv)
    assert logical_bits(FORMATS["FP8_E4M3FN_ROW_BF16S"], (3, 20)) == 3 * 20 * 8 + 3 * 16
    rows = {t.name: t for t in report.tensors}
    assert rows["attn.x.weight"].transforms == ("concat(axis=0)",)
    assert rows["mlp.down_t.weight"].transforms == ("transpose",)
    assert rows["norm.weight"].derivation == "bf16-to-f32"
    assert rows["nv.weight"].derivation == "copy-quantized(scheme=compressed-tensors-nvfp4)"
    assert rows["attn.x.weight"].sources == ("attn.qx.weight", "attn.kx.weight")


def test_filter_is_a_case_sensitive_glob(artifact: Path) -> None:
    report = inspect_artifact(artifact, filter="pair.*")
    assert [t.name for t in report.tensors] == ["pair.a.weight", "pair.b.weight"]
    assert report.tensor_count == 16  # totals still cover the whole artifact
    assert inspect_artifact(artifact, filter="PAIR.*").tensors == ()


def test_tensor_details_values_histogram_and_zero_scales(artifact: Path) -> None:
    with open_artifact(artifact) as art:
        d = tensor_details(art, "w8.weight")
        logical = art.read("w8.weight")
        values = art.dequantize("w8.weight")
    v = d.values
    assert v.count == 6 * 33 and v.finite == v.count and v.nan == v.inf == 0
    assert v.min == float(values.min()) and v.max == float(values.max())
    assert v.mean == pytest.approx(float(values.astype(np.float64).mean()))
    assert v.code_histogram is not None and sum(v.code_histogram.values()) == 6 * 33
    assert max(v.code_histogram) == 127 and min(v.code_histogram) >= -127
    codes = logical.codes  # type: ignore[union-attr]
    assert v.code_histogram[0] == int(np.count_nonzero(codes == 0))
    assert v.zero_scale_groups == 0 and v.scale_groups == 6 * 2
    assert [p.name for p in d.planes] == ["codes", "scales"]
    assert d.planes[0].extents == (6, 128) and d.padding_bytes > 0
    assert d.provenance["encoder_profile"] == "MAXABS_F16_RECIP_RNE_V1"

    with open_artifact(artifact) as art:
        div = tensor_details(art, "div.weight").values  # rows of zeros past column 3
        direct = tensor_details(art, "ids").values
        fp8 = tensor_details(art, "f8.weight").values
    assert div.zero_scale_groups == 0  # every row has one non-zero group of 64
    assert direct.code_histogram is None and direct.zero_scale_groups is None
    assert direct.min == -(2.0**31) and direct.max == 2.0**31 - 1
    assert fp8.scale_groups == 3 and fp8.code_histogram is not None


def test_errors(artifact: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"did you mean 'pair\.a\.weight'"):
        inspect_artifact(artifact, tensor="pair.a.weigth")
    with pytest.raises(UsageError, match="no such file"):
        inspect_artifact(tmp_path / "missing")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(UsageError, match=r"not a \.ninfer artifact"):
        inspect_artifact(tmp_path / "x.txt")
    bad = tmp_path / "bad.ninfer"
    bad.write_bytes(b"\x89NINFER\n" + bytes(10))
    with pytest.raises(ArtifactError):
        inspect_artifact(bad)


def test_json_round_numbers(artifact: Path) -> None:
    data = inspect_artifact(artifact, tensor="nv.weight").to_json()
    assert data["schema_version"] == INSPECT_SCHEMA_VERSION
    assert data["tensor"]["name"] == "nv.weight"
    assert data["tensor"]["values"]["code_histogram"]  # E2M1 words as string keys
    assert all(isinstance(k, str) for k in data["tensor"]["values"]["code_histogram"])


def test_tensor_statistics_in_blocks_equal_the_whole_tensor(
    artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--tensor`` decodes the stored planes a block at a time; with blocks that do not
    divide the tensors the statistics are those of the whole decoded tensor (every format)."""
    from ninfer_convert.formats import lookup_format
    from ninfer_convert.inspect import details as inspect_module

    monkeypatch.setattr(inspect_module, "_BLOCK", 50)  # several blocks per tensor, a short tail
    with open_artifact(artifact) as art:
        for name, info in art.tensors.items():
            whole = inspect_module.value_stats(lookup_format(info.format), art.read(name))
            assert tensor_details(art, name).values == whole, name


@pytest.mark.parametrize("fmt", ["NVFP4", "FP8_E4M3FN_ROW_BF16S"])
def test_tensor_statistics_of_scaled_copies_hold_a_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """``--tensor`` of an NVFP4 or FP8-row tensor decodes a row block at a time from the
    mapped planes (it read the whole tensor's codes into memory, and NVFP4 unpacked them to a
    byte each: twice the stored plane), with the statistics of the whole tensor."""
    import tracemalloc

    from artifact_fixtures import META, make_logical, provenance

    from ninfer_convert.container import ArtifactWriter
    from ninfer_convert.formats import lookup_format
    from ninfer_convert.inspect import details as inspect_module

    shape = (512, 1024)
    with ArtifactWriter(tmp_path / "m", metadata=META) as w:
        w.add("t", fmt, make_logical(fmt, shape, 3), role="r", provenance=provenance(fmt))
    monkeypatch.setattr(inspect_module, "_BLOCK", 5000)  # rows per block: 4, a short tail
    with open_artifact(tmp_path / "m") as art:
        whole = inspect_module.value_stats(lookup_format(fmt), art.read("t"))
        tracemalloc.start()
        try:
            got = tensor_details(art, "t").values
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert got == whole
    assert peak < 160 << 10, f"{peak} bytes traced for a 512 KiB-element tensor"
