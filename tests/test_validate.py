"""Value-invariant validators and the NVFP4 / FP8-row reconstruction oracles (Sections 3-6)."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from ninfer_convert.dequant import dequantize_fp8_row, dequantize_logical, dequantize_nvfp4
from ninfer_convert.encoder.oracle import BINARY32, round_to_binary
from ninfer_convert.errors import ValueInvariantError
from ninfer_convert.formats import FORMATS
from ninfer_convert.logical import DirectWords, FP8RowWords, GroupedCodes, NVFP4Words
from ninfer_convert.validate import (
    fp8_row_problems,
    grouped_problems,
    logical_problems,
    nvfp4_problems,
    validate_logical,
)


def _grouped(fmt: str, k: int = 40) -> tuple[np.ndarray, np.ndarray]:
    g = FORMATS[fmt].group_size
    assert g is not None
    codes = np.ones((2, k), dtype=np.int8)
    scales = np.full((2, -(-k // g)), 0x3C00, dtype=np.uint16)
    return codes, scales


@pytest.mark.parametrize(
    ("fmt", "lo", "hi"),
    [("Q4G64_F16S", -8, 7), ("Q5G64_F16S", -16, 15), ("Q6G64_F16S", -32, 31),
     ("W8G32_F16S", -127, 127)],
)  # fmt: skip
def test_grouped_code_interval_endpoints(fmt: str, lo: int, hi: int) -> None:
    codes, scales = _grouped(fmt)
    codes[0, 0], codes[0, 1] = lo, hi
    assert grouped_problems(FORMATS[fmt], codes, scales, "t") == []
    codes[1, 5] = lo - 1
    [problem] = grouped_problems(FORMATS[fmt], codes, scales, "t")
    assert "row 1, column 5 (group 0)" in str(problem) and "'t'" in str(problem)


def test_w8_minus_128_is_invalid() -> None:
    codes, scales = _grouped("W8G32_F16S")
    codes[1, 33 - 1] = -128
    [problem] = grouped_problems(FORMATS["W8G32_F16S"], codes, scales, "w")
    assert "0x80" in str(problem) and "[-127, 127]" in str(problem)


@pytest.mark.parametrize("word", [0x8000, 0x8001, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x7C01])
def test_invalid_grouped_scales(word: int) -> None:
    codes, scales = _grouped("Q4G64_F16S")
    scales[1, 0] = word
    [problem] = grouped_problems(FORMATS["Q4G64_F16S"], codes, scales)
    assert f"0x{word:04x}" in str(problem) and "row 1, group 0" in str(problem)


def test_zero_scale_requires_zero_codes() -> None:
    codes, scales = _grouped("Q4G64_F16S", k=70)
    codes[:, :] = 0
    scales[0, 1] = 0x0000
    assert grouped_problems(FORMATS["Q4G64_F16S"], codes, scales) == []
    codes[0, 69] = 1
    [problem] = grouped_problems(FORMATS["Q4G64_F16S"], codes, scales)
    assert "+0 scale over non-zero codes" in str(problem) and "row 0, group 1" in str(problem)
    scales[0, 1] = 0x0001  # the converse is not required: positive scale, zero codes is fine
    codes[0, 69] = 0
    assert grouped_problems(FORMATS["Q4G64_F16S"], codes, scales) == []


def test_nvfp4_scale_sign_nan_and_divisor_rules() -> None:
    codes = np.arange(32, dtype=np.uint8).reshape(1, 32) % 16
    scales = np.array([[0x00, 0x7E]], dtype=np.uint8)  # +0 and 448 are valid
    assert nvfp4_problems(codes, scales, 0x3F800000) == []
    for bad in (0x80, 0xB8, 0x7F, 0xFF):
        s = scales.copy()
        s[0, 1] = bad
        assert len(nvfp4_problems(codes, s, 0x3F800000)) == 1, hex(bad)
    for d in (0x00000000, 0x80000000, 0xBF800000, 0x7F800000, 0x7FC00000):
        [p] = nvfp4_problems(codes, scales, d)
        assert "d_w" in str(p)
    assert nvfp4_problems(codes, scales, 0x00000001) == []  # subnormal but positive and finite


def test_fp8_row_rules() -> None:
    codes = np.array([[0x00, 0x80, 0x7E], [0x01, 0xFE, 0x08]], dtype=np.uint8)
    scales = np.array([0x3F80, 0x0001], dtype=np.uint16)
    assert fp8_row_problems(codes, scales) == []
    bad = codes.copy()
    bad[1, 2] = 0x7F
    assert "NaN" in str(fp8_row_problems(bad, scales)[0])
    for word in (0x8000, 0xBF80, 0x7F80, 0x7FC0):
        s = scales.copy()
        s[0] = word
        assert len(fp8_row_problems(codes, s)) >= 1
    zero_row = scales.copy()
    zero_row[0] = 0x0000
    [p] = fp8_row_problems(codes, zero_row)
    assert "row 0, column 2" in str(p)
    ok = codes.copy()
    ok[0, 2] = 0x80  # signed zeros only: valid under a +0 row scale
    assert fp8_row_problems(ok, zero_row) == []


def test_nvfp4_reconstruction_is_rounded_once_from_the_exact_product() -> None:
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 16, size=(3, 32)).astype(np.uint8)
    scales = rng.integers(0, 0x7F, size=(3, 2)).astype(np.uint8)
    divisor = int(np.array([3.0], np.float32).view(np.uint32)[0])  # 1/3 is inexact: one rounding
    out = dequantize_nvfp4(codes, scales, divisor)
    e2m1 = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    e4m3 = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    for r in range(3):
        for c in range(32):
            exact = Fraction(float(e2m1[r, c])) * Fraction(float(e4m3[r, c // 16])) / 3
            want = round_to_binary(exact, BINARY32, negative_zero=bool(codes[r, c] & 8))
            assert int(out[r, c : c + 1].view(np.uint32)[0]) == want


def test_fp8_row_reconstruction_is_code_times_row_multiplier() -> None:
    codes = np.arange(256, dtype=np.uint32).astype(np.uint8).reshape(2, 128)
    scales = np.array([0x3E80, 0x0001], dtype=np.uint16)  # 0.25 and the smallest BF16 subnormal
    out = dequantize_fp8_row(codes, scales)
    c = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    s = scales.view(ml_dtypes.bfloat16).astype(np.float64)
    for r in range(2):
        for k in range(128):
            if np.isnan(c[r, k]):
                continue
            exact = Fraction(float(c[r, k])) * Fraction(float(s[r]))
            want = round_to_binary(exact, BINARY32, negative_zero=bool(codes[r, k] & 0x80))
            assert int(out[r, k : k + 1].view(np.uint32)[0]) == want, (r, k)


def test_logical_dispatch_rejects_mismatched_representation() -> None:
    words = DirectWords(np.zeros(3, np.uint16))
    assert logical_problems("BF16", words) == []
    with pytest.raises(ValueInvariantError):
        validate_logical("Q4G64_F16S", words, "x")
    grouped = GroupedCodes(np.zeros((1, 4), np.int8), np.zeros((1, 1), np.uint16))
    assert logical_problems("Q4G64_F16S", grouped) == []
    nv = NVFP4Words(np.zeros((1, 16), np.uint8), np.zeros((1, 1), np.uint8), 0x3F800000)
    assert dequantize_logical("NVFP4", nv).shape == (1, 16)
    fp8 = FP8RowWords(np.zeros((1, 2), np.uint8), np.zeros(1, np.uint16))
    assert logical_problems("FP8_E4M3FN_ROW_BF16S", fp8) == []
