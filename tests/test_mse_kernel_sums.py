"""The MSE_F16_SEARCH_V1 C kernel returns verify's error statistics from the encoding pass (as
the canonical kernel does), so verify of a profile artifact no longer re-reads every block in
numpy: the sums equal the numpy statistics of the same codes (the maximum exactly)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ninfer_convert.encoder import host
from ninfer_convert.encoder.common import to_f32
from ninfer_convert.encoder.corpus import mse_boundary_corpus
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_V1
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.native import optional_module
from ninfer_convert.verify.compare import _accumulate, _dequantize_block

kernel = optional_module("_msekernel")
pytestmark = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _sums_and_numpy(
    words: np.ndarray, source: str, fmt: str
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    f = FORMATS[fmt]
    assert f.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // f.group_size)), dtype=np.uint16)
    got = host.encode_rows(
        words, source, f, 0, codes, scales, "t", with_sums=True, profile=MSE_F16_SEARCH_V1
    )
    assert got is not None, "the C kernel returned no sums"
    x_hat = _dequantize_block(f, GroupedCodes(codes, scales), 0, n)
    return got, _accumulate(to_f32(words, source).reshape(-1), x_hat)


def _assert_same(got: tuple[float, float, float], want: tuple[float, float, float]) -> None:
    assert got[0] == want[0]  # the largest |x - x_hat| is exact in both
    for g, w in zip(got[1:], want[1:], strict=True):  # binary64 sums in different orders
        assert g == pytest.approx(w, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("fmt", GROUPED)
def test_kernel_sums_equal_the_numpy_statistics_on_the_boundary_corpus(fmt: str) -> None:
    for _case, words in mse_boundary_corpus(FORMATS[fmt]):
        _assert_same(*_sums_and_numpy(words, "F32", fmt))


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(np.float32, (3, 150), elements=st.floats(-4, 4, width=32)),
    st.integers(-120, 12),
    st.sampled_from(GROUPED),
)
def test_kernel_sums_equal_the_numpy_statistics(x: np.ndarray, mag: int, fmt: str) -> None:
    words = (x * np.float32(2.0**mag)).astype(np.float32).view(np.uint32)
    _assert_same(*_sums_and_numpy(words, "F32", fmt))
    bf16 = (words >> np.uint32(16)).astype(np.uint16)
    _assert_same(*_sums_and_numpy(bf16, "BF16", fmt))


def test_kernel_codes_do_not_depend_on_the_sums() -> None:
    rng = np.random.default_rng(7)
    words = (rng.standard_normal((4, 256)).astype(np.float32) * 0.03).view(np.uint32)
    f = FORMATS["Q4G64_F16S"]
    out = []
    for with_sums in (False, True):
        codes = np.empty((4, 256), dtype=np.int8)
        scales = np.empty((4, 4), dtype=np.uint16)
        host.encode_rows(words, "F32", f, 0, codes, scales, "t", with_sums=with_sums,
                         profile=MSE_F16_SEARCH_V1)  # fmt: skip
        out.append((codes.tobytes(), scales.tobytes()))
    assert out[0] == out[1]


def test_kernel_rejects_a_stats_buffer_of_the_wrong_size() -> None:
    words = np.zeros((1, 64), dtype=np.uint32)
    codes = np.empty((1, 64), dtype=np.int8)
    scales = np.empty((1, 1), dtype=np.uint16)
    with pytest.raises(ValueError, match="stats must be three float64"):
        kernel.encode_rows(words, 1, 1, 64, 64, -8, 7, codes, scales, None, np.zeros(2))
