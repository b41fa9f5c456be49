"""Exhaustive and property tests of the exact word codecs (spec Section 3, Section 12).

ml_dtypes is used only as an independent cross-check; comparisons are on raw words.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ninfer_convert.errors import EncodeError
from ninfer_convert.words import (
    E2M1_VALUES,
    E4M3FN_VALUES,
    bf16_to_f32_words,
    e2m1_to_f32,
    e4m3fn_is_nan,
    e4m3fn_to_f32,
    f16_to_f32_words,
    f32_to_bf16_rne,
    int_to_i32,
)

ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def _nan32(words: np.ndarray) -> np.ndarray:
    return ((words & 0x7F800000) == 0x7F800000) & ((words & 0x007FFFFF) != 0)


def test_all_65536_bf16_words_expand_exactly_and_keep_payloads() -> None:
    got = bf16_to_f32_words(ALL16)
    assert np.array_equal(got >> 16, ALL16.astype(np.uint32))  # payload, quiet bit, sign kept
    assert np.array_equal(got & 0xFFFF, np.zeros_like(got))
    ref = ALL16.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    finite = ~_nan32(got)
    assert np.array_equal(got[finite], ref[finite])
    assert got[0x8000] == 0x80000000  # -0.0 stays negative


def test_all_65536_binary16_words_expand_exactly() -> None:
    got = f16_to_f32_words(ALL16)
    ref = ALL16.view(np.float16).astype(np.float32).view(np.uint32)
    nan = _nan32(got)
    assert np.array_equal(got[~nan], ref[~nan])
    # NaN payload bits are carried (shifted into the binary32 fraction), quiet bit included.
    assert np.array_equal((got[nan] >> 13) & 0x3FF, ALL16[nan].astype(np.uint32) & 0x3FF)
    assert got[0x0001] == 0x33800000  # 2^-24, the smallest binary16 subnormal
    assert got[0x8000] == 0x80000000


def test_all_16_e2m1_words_decode_exactly() -> None:
    codes = np.arange(16, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(e2m1_to_f32(codes).view(np.uint32), ref.view(np.uint32))
    assert E2M1_VALUES.view(np.uint32)[8] == 0x80000000  # 0x8 is -0.0, distinct from 0x0
    assert [float(v) for v in E2M1_VALUES[:8]] == [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # fmt: skip


def test_all_256_e4m3fn_words_decode_exactly() -> None:
    words = np.arange(256, dtype=np.uint32).astype(np.uint8)
    ref = words.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = e4m3fn_to_f32(words)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(e4m3fn_is_nan(words), nan)
    assert np.flatnonzero(nan).tolist() == [0x7F, 0xFF]
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert float(E4M3FN_VALUES[0x7E]) == float.fromhex("0x1.cp8")  # 448, largest finite
    assert float(E4M3FN_VALUES[0x01]) == float.fromhex("0x1p-9")  # smallest subnormal
    assert E4M3FN_VALUES.view(np.uint32)[0x80] == 0x80000000


@given(st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_f32_to_bf16_matches_ml_dtypes_rne(word: int) -> None:
    w = np.array([word], dtype=np.uint32)
    if (word & 0x7F800000) == 0x7F800000:
        with pytest.raises(EncodeError):
            f32_to_bf16_rne(w)
        return
    ref = w.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert f32_to_bf16_rne(w)[0] == ref[0]


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        (0x3F808000, 0x3F80),  # exact tie, even kept part: stays
        (0x3F818000, 0x3F82),  # exact tie, odd kept part: rounds up to even
        (0x3F808001, 0x3F81),  # just above the tie
        (0x80000000, 0x8000),  # -0.0 keeps its sign
        (0x00000001, 0x0000),  # smallest subnormal rounds to +0
        (0x7F7FFFFF, 0x7F80),  # FLT_MAX rounds to +inf under RNE
        (0x807FFFFF, 0x8080),  # largest negative subnormal rounds up into the normal range
    ],
)
def test_f32_to_bf16_boundaries(word: int, expected: int) -> None:
    assert f32_to_bf16_rne(np.array([word], dtype=np.uint32))[0] == expected


def test_f32_to_bf16_keeps_nonfinite_only_on_request() -> None:
    words = np.array([0x7F800000, 0xFF800000, 0x7FC00001, 0x7F800001, 0xFFC12345], np.uint32)
    with pytest.raises(EncodeError, match="index \\[0\\]"):
        f32_to_bf16_rne(words)
    got = f32_to_bf16_rne(words, keep_nonfinite=True)
    assert got.tolist() == [0x7F80, 0xFF80, 0x7FC0, 0x7FC0, 0xFFC1]  # NaN never becomes inf


@pytest.mark.parametrize(
    "dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
)
def test_int_to_i32_keeps_extrema_and_never_wraps(dtype: type) -> None:
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    ok = np.array([lo, 0, hi], dtype=dtype)
    assert int_to_i32(ok).tolist() == [int(lo), 0, int(hi)]
    if info.max > 2**31 - 1:
        with pytest.raises(EncodeError, match="outside the I32 range"):
            int_to_i32(np.array([0, 2**31], dtype=dtype))
    if info.min < -(2**31):
        with pytest.raises(EncodeError, match="index \\[1\\]"):
            int_to_i32(np.array([0, -(2**31) - 1], dtype=dtype))


def test_int_to_i32_rejects_float_sources() -> None:
    with pytest.raises(EncodeError, match="integer sources only"):
        int_to_i32(np.array([1.0], dtype=np.float32))
    assert int_to_i32(np.array([True, False])).tolist() == [1, 0]
