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
from ninfer_convert.encoder.common import to_f32
from ninfer_convert.encoder.corpus import boundary_corpus, failing_corpus
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import FORMATS
from ninfer_convert.logical import GroupedCodes

pytestmark = pytest.mark.skipif(not host.native_available(), reason="C host kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _native(
    words: np.ndarray, source: str, fmt: str, tensor: str | None = None, with_sums: bool = False
) -> GroupedCodes:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // entry.group_size)), dtype=np.uint16)
    host.encode_rows(words, source, entry, 0, codes, scales, tensor, "native", with_sums=with_sums)
    return GroupedCodes(codes=codes, scales=scales)


# The kernel has two value loops (codes only, and codes plus error statistics for verify); the
# oracle tests run both.
SUMS = pytest.mark.parametrize("with_sums", [False, True], ids=["codes", "codes+sums"])


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


@SUMS
@pytest.mark.parametrize("fmt", GROUPED)
def test_native_matches_oracle_on_the_boundary_corpus(fmt: str, with_sums: bool) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    for case, words in boundary_corpus(entry):
        ref = encode_grouped_words(words, "F32", fmt, backend="oracle")
        got = _native(words, "F32", fmt, with_sums=with_sums)
        assert_same_encoding(ref, got, entry.group_size, case)


@SUMS
@pytest.mark.parametrize("fmt", GROUPED)
def test_native_refuses_what_the_encoder_refuses_with_the_same_message(
    fmt: str, with_sums: bool
) -> None:
    for name, words, row, group in failing_corpus(FORMATS[fmt]):
        with pytest.raises(EncodeError) as native:
            _native(words, "F32", fmt, tensor="w", with_sums=with_sums)
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
    with_sums = data.draw(st.booleans())
    words = data.draw(
        hnp.arrays(np.uint16 if source != "F32" else np.uint32, shape,
                   elements=st.integers(0, 0xFFFF if source != "F32" else 0xFFFFFFFF))
    )  # fmt: skip
    try:
        ref = encode_grouped_words(words, source, fmt, backend="oracle")
    except EncodeError as exc:
        with pytest.raises(EncodeError) as native:
            _native(words, source, fmt, with_sums=with_sums)
        assert str(native.value) == str(exc)
        return
    got = _native(words, source, fmt, with_sums=with_sums)
    assert_same_encoding(ref, got, entry.group_size, source)


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


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("source", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("shape", [(7, 150), (3, 4101), (5, 8)])
def test_native_error_sums_agree_with_a_binary64_reference(
    fmt: str, source: str, shape: tuple[int, int]
) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape).astype(np.float32)
    # Row scales down to 2^-120: binary32 squares of such values would underflow to zero.
    x *= np.float32(2.0) ** rng.integers(-120, 6, size=(shape[0], 1)).astype(np.float32)
    words: np.ndarray = {
        "BF16": lambda: (x.view(np.uint32) >> 16).astype(np.uint16),
        "F16": lambda: x.astype(np.float16).view(np.uint16),
        "F32": lambda: x.view(np.uint32),
    }[source]()
    enc = encode_grouped_words(words, source, fmt)
    codes = np.empty_like(enc.codes)
    scales = np.empty_like(enc.scales)
    sums = host.encode_rows(words, source, entry, 0, codes, scales, "t", with_sums=True)
    assert sums is not None
    # Asking for the statistics never changes a code or a scale.
    assert np.array_equal(codes, enc.codes) and np.array_equal(scales, enc.scales)
    x32 = to_f32(words, source)
    s32 = np.repeat(enc.scales.view(np.float16).astype(np.float32), entry.group_size, axis=1)
    e32 = x32 - s32[:, : shape[1]] * enc.codes.astype(np.float32)  # the kernel's two operations
    assert sums[0] == float(np.abs(e32).max())  # the maximum is exact, lanes or not
    e64, x64 = e32.astype(np.float64), x32.astype(np.float64)
    # Rows are scaled to their largest value before squaring, so tiny rows neither vanish nor
    # lose precision; binary32 lanes summed over at most 64 steps stay within 4e-6 relative.
    assert sums[1] == pytest.approx(float((e64 * e64).sum()), rel=5e-6, abs=0.0)
    assert sums[2] == pytest.approx(float((x64 * x64).sum()), rel=5e-6, abs=0.0)


@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "W8G32_F16S"])
@SUMS
def test_binary16_source_encodes_every_finite_word_as_its_binary32_value(
    fmt: str, with_sums: bool
) -> None:
    """The kernel widens binary16 rows itself (source 2, by F16C where the CPU has it): every
    finite binary16 word, in two orders and row lengths (so each group's maximum differs),
    encodes exactly as its binary32 value does on
    the kernel's binary32 path (itself held to the oracle above), codes and scales."""
    words = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
    finite = words[(words & 0x7C00) != 0x7C00]  # 63,488 words
    # Rows of 512 take the kernel's vector widening only; rows of 31 its scalar tail too.
    for order, k in ((finite, 512), (np.random.default_rng(1).permutation(finite), 31)):
        block = order.reshape(-1, k)
        wide = block.view(np.float16).astype(np.float32).view(np.uint32)
        got = _native(block, "F16", fmt, with_sums=with_sums)
        want = _native(wide, "F32", fmt, with_sums=with_sums)
        assert got.codes.tobytes() == want.codes.tobytes()
        assert got.scales.tobytes() == want.scales.tobytes()


def test_binary16_source_refuses_each_non_finite_word_at_its_column() -> None:
    for word in (0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFFFF):
        block = np.full((3, 200), 0x3C00, dtype=np.uint16)
        block[2, 131] = word
        with pytest.raises(EncodeError, match="row 2") as info:
            _native(block, "F16", "Q4G64_F16S", tensor="t")
        assert "131" in str(info.value)
