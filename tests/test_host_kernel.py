"""The C host kernel (ninfer_convert/_hostkernel.c) is bit-identical to the oracle.

Skipped when the kernel was not built (no C compiler); CI sets NINFER_REQUIRE_NATIVE=1 so that
there a missing kernel is an import error, not a skip.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from parity import assert_same_encoding

from ninfer_convert import encode_grouped_words
from ninfer_convert.encoder import host
from ninfer_convert.encoder.corpus import boundary_corpus, failing_corpus
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import FORMATS
from ninfer_convert.logical import GroupedCodes

pytestmark = pytest.mark.skipif(not host.native_available(), reason="C host kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _native(words: np.ndarray, source: str, fmt: str, tensor: str | None = None) -> GroupedCodes:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // entry.group_size)), dtype=np.uint16)
    host.encode_rows(words, source, entry, 0, codes, scales, tensor, "native")
    return GroupedCodes(codes=codes, scales=scales)


def test_binary16_conversion_matches_ieee_on_every_2048th_word_and_the_edges() -> None:
    from ninfer_convert import _hostkernel

    words = np.arange(0, 0x7F800000, 2048, dtype=np.uint32)
    edges = np.array(
        [0x33000000, 0x33000001, 0x337FFFFF, 0x33800000, 0x38800000, 0x387FE000, 0x387FF000,
         0x477FE000, 0x477FEFFF, 0x477FF000, 0x7F7FFFFF, 0x00000001, 0x00800000],
        dtype=np.uint32,
    )  # fmt: skip
    words = np.concatenate([words, words + 1, words + 1023, edges])
    got = np.empty(words.size, dtype=np.uint16)
    _hostkernel.f32_to_f16_words(words, got)
    with np.errstate(over="ignore"):
        want = words.view(np.float32).astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"first difference at 0x{int(words[bad[0]]):08x}"


@pytest.mark.parametrize("fmt", GROUPED)
def test_native_matches_oracle_on_the_boundary_corpus(fmt: str) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    for case, words in boundary_corpus(entry):
        ref = encode_grouped_words(words, "F32", fmt, backend="oracle")
        assert_same_encoding(ref, _native(words, "F32", fmt), entry.group_size, case)


@pytest.mark.parametrize("fmt", GROUPED)
def test_native_refuses_what_the_encoder_refuses_with_the_same_message(fmt: str) -> None:
    for name, words, row, group in failing_corpus(FORMATS[fmt]):
        with pytest.raises(EncodeError) as native:
            _native(words, "F32", fmt, tensor="w")
        with pytest.raises(EncodeError) as reference:
            encode_grouped_words(words, "F32", fmt, tensor="w")
        assert str(native.value) == str(reference.value), name
        assert f"row {row}" in str(native.value) and f"group {group}" in str(native.value)


@pytest.mark.parametrize("fmt", GROUPED)
@given(data=st.data())
def test_native_matches_oracle_on_generated_matrices(fmt: str, data: st.DataObject) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    source = data.draw(st.sampled_from(["BF16", "F16", "F32"]))
    shape = data.draw(st.tuples(st.integers(1, 3), st.integers(1, 150)))
    words = data.draw(
        hnp.arrays(np.uint16 if source != "F32" else np.uint32, shape,
                   elements=st.integers(0, 0xFFFF if source != "F32" else 0xFFFFFFFF))
    )  # fmt: skip
    try:
        ref = encode_grouped_words(words, source, fmt, backend="oracle")
    except EncodeError as exc:
        with pytest.raises(EncodeError) as native:
            _native(words, source, fmt)
        assert str(native.value) == str(exc)
        return
    assert_same_encoding(ref, _native(words, source, fmt), entry.group_size, source)


@pytest.mark.parametrize("fmt", GROUPED)
def test_native_matches_numpy_on_a_large_bf16_block(fmt: str) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    rng = np.random.default_rng(21)
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-30, 8, size=(64, 1)).astype(np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)
    ref = encode_grouped_words(words, "BF16", fmt, backend="numpy")
    assert_same_encoding(ref, _native(words, "BF16", fmt), entry.group_size)


def test_native_error_sums_agree_with_a_binary64_reference() -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((7, 150)).astype(np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)
    enc = encode_grouped_words(words, "BF16", "Q5G64_F16S")
    sums = host.block_error_sums(words, "BF16", FORMATS["Q5G64_F16S"], enc.codes, enc.scales)
    assert sums is not None
    x64 = (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    s64 = np.repeat(enc.scales.view(np.float16).astype(np.float64), 64, axis=1)[:, :150]
    e = x64 - s64 * enc.codes
    assert sums[0] == np.abs(e).max()  # every error is exact in binary32 here
    assert sums[1] == pytest.approx(float((e * e).sum()), rel=1e-5)
    assert sums[2] == pytest.approx(float((x64 * x64).sum()), rel=1e-5)
