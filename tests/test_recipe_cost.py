"""Padding cost warnings: physical bits per weight against the registry's nominal bits."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from doc_schema import doc_example, same_shape
from test_recipe_plan import make_source, plan_text

from ninfer_convert.cli import main
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.formats import FORMATS
from ninfer_convert.layouts import lookup_layout
from ninfer_convert.recipe import PADDING_TOLERANCE, padding_warning, padding_warnings

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-qwen3.5"
QWEN_RECIPE = ROOT / "recipes" / "qwen3.6-27b.yaml"
CLI_DOC = ROOT / "docs" / "cli.md"


def _layout_bytes(fmt: str, shape: tuple[int, ...]) -> int:
    return int(lookup_layout(FORMATS[fmt].layout).encoded_size(fmt, shape))


def test_a_4_bit_tensor_with_16_value_rows_costs_34_bits_and_warns(tmp_path: Path) -> None:
    src = make_source(tmp_path / "m", {"w": torch.ones(4, 16, dtype=torch.bfloat16)})
    plan = plan_text(
        "- match: w\n  format: Q4G64_F16S\n  encoder_profile: MAXABS_F16_RECIP_RNE_V1\n"
        "  role: r\n  evidence: [e1]\n",
        src,
    )
    (w,) = plan.to_dict()["warnings"]  # type: ignore[misc]
    assert w["tensor"] == "w" and w["format"] == "Q4G64_F16S" and w["shape"] == [4, 16]
    assert w["physical_bits_per_weight"] == 34.0
    assert w["nominal_bits_per_weight"] == FORMATS["Q4G64_F16S"].logical_bits_per_weight == 4.25
    assert w["excess"] == 34.0 / 4.25 - 1 == 7.0
    assert "34.000 bits per weight" in w["message"]
    assert "padded to a multiple of 128" in w["message"]
    assert "BF16 would store a BF16 source exactly in 16 bits" in w["message"]


def test_full_rows_do_not_warn() -> None:
    for fmt in ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16", "FP32", "I32"):
        shape = (3, 256)
        assert padding_warning("w", fmt, shape, _layout_bytes(fmt, shape)) is None, fmt


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_threshold_is_exactly_ten_percent_of_the_registry_nominal(fmt: str) -> None:
    # Synthetic byte counts around the threshold: numel chosen so that 1.1 x nominal x numel is
    # a whole number of bytes (nominal bits are multiples of 1/4).
    nominal = FORMATS[fmt].logical_bits_per_weight
    numel = 80 * 4
    limit_bits = Fraction(nominal) * numel * (1 + PADDING_TOLERANCE)
    assert limit_bits.denominator == 1 and limit_bits.numerator % 8 == 0
    at = limit_bits.numerator // 8
    assert padding_warning("w", fmt, (4, 80), at) is None
    w = padding_warning("w", fmt, (4, 80), at + 1)
    assert w is not None and w.nominal_bits_per_weight == nominal
    assert w.excess > 0.1 and math.isclose(w.physical_bits_per_weight, 8 * (at + 1) / numel)


def test_fp8_row_layout_at_and_above_the_threshold() -> None:
    # One BF16 scale per row: 8 + 16/K bits.  K = 20 is exactly 8.8 = 1.1 x 8, K = 19 above.
    fmt = "FP8_E4M3FN_ROW_BF16S"
    assert padding_warning("w", fmt, (4, 20), _layout_bytes(fmt, (4, 20))) is None
    w = padding_warning("w", fmt, (4, 19), _layout_bytes(fmt, (4, 19)))
    assert w is not None and w.physical_bits_per_weight == float(Fraction(8 * 19 + 16, 19))
    assert "BF16 scale" in w.message and "BF16 would" not in w.message


@pytest.mark.parametrize(("fmt", "shape"), [("NVFP4", (4, 16)), ("FP8_E4M3FN_ROW_BF16S", (4, 1))])
def test_copied_formats_above_16_bits_do_not_claim_bf16_is_exact(
    fmt: str, shape: tuple[int, int]
) -> None:
    # An already-quantized source (scale x code) is not exact in BF16's 8-bit significand.
    w = padding_warning("w", fmt, shape, _layout_bytes(fmt, shape))
    assert w is not None and w.physical_bits_per_weight > 16
    assert "BF16" not in w.message.split(":", 1)[1].replace("BF16 scale", "")


def test_empty_tensor_never_warns() -> None:
    assert padding_warning("w", "Q4G64_F16S", (0, 16), 0) is None


def test_dry_run_json_lists_the_warnings_in_the_documented_schema(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["convert", str(EXAMPLE), "--recipe", str(QWEN_RECIPE), "--dry-run", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    plan = json.loads(out)
    same_shape(doc_example(CLI_DOC, "### `convert --dry-run --json`"), plan)
    flagged = {w["tensor"] for w in plan["warnings"]}
    # The tiny example's 80-column rows pad to 128 columns: every grouped tensor is flagged.
    grouped = {e["output"] for e in plan["entries"] if e["encoder_profile"] is not None}
    assert flagged == grouped and grouped
    assert "warning: tensor " in err and "more tensors above their nominal" in err


def test_convert_reports_the_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["convert", str(EXAMPLE), "--recipe", str(QWEN_RECIPE), "--output",
                 str(tmp_path / "o"), "--json", "--device", "cpu"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    summary = json.loads(out)
    free = frozenset({"totals", "warnings[]"})
    same_shape(doc_example(CLI_DOC, "### `convert --json`"), summary, free=free)
    assert summary["warnings"] and summary["warnings"][0]["tensor"] == "lm_head.weight"
    assert "warning: tensor 'lm_head.weight'" in err


def test_convert_report_totals_and_warnings_are_the_plan_json_ones(tmp_path: Path) -> None:
    # The report takes only these two members of the plan: they must be the dry run's.
    report = convert_checkpoint(EXAMPLE, QWEN_RECIPE, tmp_path / "o", device="cpu")
    doc = report.to_dict()
    plan = report.plan.to_dict()
    assert doc["totals"] == plan["totals"] and doc["warnings"] == plan["warnings"]
    assert doc["warnings"] and doc["totals"]["tensors"] == len(report.plan.entries)


def test_warnings_of_repeated_shapes_name_each_tensor(tmp_path: Path) -> None:
    """The answer is worked out once per (format, shape, bytes); every warning still names
    its own tensor, in the entries' order, and equals the one-tensor answer."""
    tensors = {f"w{i}": torch.ones(4 + i % 2, 16, dtype=torch.bfloat16) for i in range(6)}
    src = make_source(tmp_path / "m", tensors)
    plan = plan_text(
        "- match: 're:w.*'\n  format: Q4G64_F16S\n  encoder_profile: MAXABS_F16_RECIP_RNE_V1\n"
        "  role: r\n  evidence: [e1]\n",
        src,
    )
    got = padding_warnings(plan.entries)
    want = [padding_warning(e.output, e.format, e.shape, e.encoded_bytes) for e in plan.entries]
    assert list(got) == want and len({w.tensor for w in got}) == 6
    assert [w.shape for w in got] == [e.shape for e in plan.entries]
