"""MAXABS_F16_RECIP_RNE_V1 (spec Section 7): oracle semantics and three-backend parity."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from parity import assert_same_encoding

from ninfer_convert import dequantize_grouped, encode_grouped, encode_grouped_words
from ninfer_convert.encoder.corpus import RECIP_VS_DIV_CASES, boundary_corpus, failing_corpus
from ninfer_convert.encoder.host import encode_rows as host_encode_rows
from ninfer_convert.encoder.host import native_available
from ninfer_convert.encoder.oracle import (
    BINARY16,
    BINARY32,
    decode_binary,
    encode_group_oracle,
    round_to_binary,
)
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import FORMATS

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def f32w(values: list[float]) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()


# --- the oracle's own rounding primitives, against the host's IEEE casts ---------------------


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_oracle_round_to_binary32_matches_ieee_cast(x: float) -> None:
    with np.errstate(over="ignore"):
        ref = int(np.array([x], dtype=np.float64).astype(np.float32).view(np.uint32)[0])
    assert round_to_binary(Fraction(x), BINARY32, negative_zero=np.signbit(x)) == ref


@given(st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_oracle_round_to_binary16_matches_ieee_cast(x: float) -> None:
    with np.errstate(over="ignore"):
        ref = int(np.array([x], dtype=np.float64).astype(np.float16).view(np.uint16)[0])
    assert round_to_binary(Fraction(x), BINARY16, negative_zero=np.signbit(x)) == ref


def test_oracle_decodes_every_finite_binary16_word_exactly() -> None:
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = words.view(np.float16).astype(np.float64)
    for w in range(0, 1 << 16, 7):
        if (w >> 10) & 0x1F != 0x1F:
            assert decode_binary(w, BINARY16) == Fraction(float(values[w])), hex(w)


# --- Section 7 semantics ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", GROUPED)
def test_spec_integral_rounding_examples(fmt: str) -> None:
    qmax = FORMATS[fmt].qmax
    assert qmax is not None
    # amax = qmax makes the scale exactly 1.0, so each code is round-half-even(x).
    scale, codes = encode_group_oracle(f32w([qmax, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5]), -128, qmax)
    assert scale == 0x3C00  # binary16 1.0
    assert codes[1:] == [0, 0, 2, -2, 2, -2]


@pytest.mark.parametrize("fmt", GROUPED)
def test_positive_and_negative_ties_go_to_even(fmt: str) -> None:
    f = FORMATS[fmt]
    assert f.qmax is not None and f.qmin is not None
    xs = [float(f.qmax)] + [k + 0.5 for k in range(f.qmax)] + [-(k + 0.5) for k in range(f.qmax)]
    _, codes = encode_group_oracle(f32w(xs), f.qmin, f.qmax)
    for x, c in zip(xs[1:], codes[1:], strict=True):
        assert c == round(Fraction(x)), (x, c)  # Fraction rounding is exact half-even
        assert c % 2 == 0


@pytest.mark.parametrize(("qmax", "s_word", "x_word"), RECIP_VS_DIV_CASES)
def test_reciprocal_multiply_not_division_picks_the_code(
    qmax: int, s_word: int, x_word: int
) -> None:
    fmt = next(name for name in GROUPED if FORMATS[name].qmax == qmax)
    s32 = np.array([s_word], np.uint16).view(np.float16).astype(np.float32)[0]
    x = np.array([x_word], np.uint32).view(np.float32)[0]
    values = np.array([[s32 * np.float32(qmax), x]], dtype=np.float32)
    for backend in ("oracle", "numpy", "torch"):
        enc = encode_grouped(values, fmt, backend=backend)
        assert int(enc.scales[0, 0]) == s_word
        inv = np.float32(1.0) / s32
        recip_code = int(np.rint(x * inv))
        division_code = int(np.rint(x / s32))
        assert recip_code != division_code  # the case really discriminates
        assert int(enc.codes[0, 1]) == recip_code, backend


@pytest.mark.parametrize("fmt", GROUPED)
def test_minimum_subnormal_rescue(fmt: str) -> None:
    tiny = float.fromhex("0x1p-149")
    for backend in ("oracle", "numpy", "torch"):
        enc = encode_grouped(np.array([[tiny, -tiny, 0.0]], dtype=np.float32), fmt, backend=backend)
        assert int(enc.scales[0, 0]) == 0x0001  # 2^-24, never +0 for a nonzero group
        assert enc.codes[0, :3].tolist() == [0, 0, 0]


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("backend", ["oracle", "numpy", "torch"])
def test_non_finite_and_overflowing_groups_are_refused_with_row_and_group(
    fmt: str, backend: str
) -> None:
    for name, words, row, group in failing_corpus(FORMATS[fmt]):
        with pytest.raises(EncodeError) as info:
            encode_grouped_words(words, "F32", fmt, backend=backend, tensor="w")
        msg = str(info.value)
        assert f"row {row}" in msg and f"group {group}" in msg and "'w'" in msg, (name, msg)
        expected = "scale_overflow" if name == "scale-overflow" else "non_finite_value"
        assert info.value.kind == expected and info.value.rule == "spec Section 7", name


@pytest.mark.parametrize("fmt", GROUPED)
def test_all_zero_group_gives_plus_zero_scale_and_zero_codes(fmt: str) -> None:
    values = np.array([[0.0, -0.0, 0.0]], dtype=np.float32)
    for backend in ("oracle", "numpy", "torch"):
        enc = encode_grouped(values, fmt, backend=backend)
        assert enc.scales.tolist() == [[0x0000]]
        assert enc.codes.tolist() == [[0, 0, 0]]


@pytest.mark.parametrize("fmt", GROUPED)
def test_partial_last_group_uses_only_its_logical_values(fmt: str) -> None:
    g = FORMATS[fmt].group_size
    assert g is not None
    rng = np.random.default_rng(3)
    full = rng.standard_normal((4, 2 * g + 9)).astype(np.float32)
    whole = encode_grouped(full, fmt)
    tail = encode_grouped(np.ascontiguousarray(full[:, 2 * g :]), fmt)
    assert whole.scales.shape == (4, 3)
    assert np.array_equal(whole.scales[:, 2:], tail.scales)
    assert np.array_equal(whole.codes[:, 2 * g :], tail.codes)
    for backend in ("oracle", "torch"):
        assert_same_encoding(whole, encode_grouped(full, fmt, backend=backend), g, backend)


@pytest.mark.parametrize("fmt", GROUPED)
def test_subnormal_scales_force_the_clamp_on_every_backend(fmt: str) -> None:
    # A scale that rounds down to 2^-24 makes x * inv leave [qmin, qmax]: only the clamp
    # brings it back.  W8's -2^-17 gives exactly -128 without the clamp (the issue's case).
    entry = FORMATS[fmt]
    assert entry.qmin is not None and entry.qmax is not None
    cases = dict(boundary_corpus(entry))
    words = cases["subnormal-scale-clamp"]
    rows = 3 if fmt == "W8G32_F16S" else 2  # -2^-17 clamps only for W8's qmin of -127
    want_first = [entry.qmin, entry.qmax, -127][:rows]
    backends = ["oracle", "numpy", "torch"] + (["native"] if native_available() else [])
    for backend in backends:
        if backend == "native":
            g = entry.group_size
            assert g is not None
            codes = np.empty(words.shape, np.int8)
            scales = np.empty((words.shape[0], -(-words.shape[1] // g)), np.uint16)
            host_encode_rows(words, "F32", entry, 0, codes, scales, None, "native")
        else:
            enc = encode_grouped_words(words, "F32", fmt, backend=backend)
            codes, scales = enc.codes, enc.scales
        assert scales[:rows, 0].tolist() == [0x0001] * rows, backend  # 2^-24
        assert codes[:rows, 0].astype(int).tolist() == want_first, backend


def test_w8_never_emits_minus_128_and_qmax_is_the_denominator() -> None:
    # amax comes from the negative side: scale = 128/127, and -128 * (127/128) -> -127.
    enc = encode_grouped(np.array([[-128.0, 1.0]], dtype=np.float32), "W8G32_F16S")
    assert int(enc.codes.min()) == -127
    q4 = encode_grouped(np.array([[-8.0, 1.0]], dtype=np.float32), "Q4G64_F16S")
    s = float(np.array([q4.scales[0, 0]], np.uint16).view(np.float16)[0])
    assert s == float(np.float16(np.float32(8.0) / np.float32(7.0)))  # 8 / qmax, not 8 / 8
    assert q4.codes[0, 0] == -7


# --- parity: oracle vs numpy vs torch --------------------------------------------------------


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("device", DEVICES)
def test_backends_match_oracle_on_boundary_corpus(fmt: str, device: str) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    for name, words in boundary_corpus(entry):
        ref = encode_grouped_words(words, "F32", fmt, backend="oracle")
        for backend in ("numpy", "torch"):
            got = encode_grouped_words(words, "F32", fmt, backend=backend, device=device)
            assert_same_encoding(ref, got, entry.group_size, f"{fmt} {name} {backend}/{device}")


def _matrices(source: str) -> st.SearchStrategy[np.ndarray]:
    if source == "F32":
        elements = st.floats(width=32, allow_nan=False, allow_infinity=False,
                             min_value=-1e6, max_value=1e6)  # fmt: skip
        dtype = np.float32
    else:
        elements = st.floats(width=16, allow_nan=False, allow_infinity=False)
        dtype = np.float16
    shapes = st.tuples(st.integers(1, 3), st.integers(1, 150))
    scale_exp = st.sampled_from([-140, -126, -100, -30, -10, 0, 10])
    return st.tuples(hnp.arrays(dtype, shapes, elements=elements), scale_exp).map(
        lambda t: _scaled(t[0], t[1]) if dtype == np.float32 else t[0]
    )


def _scaled(a: np.ndarray, e: int) -> np.ndarray:
    with np.errstate(under="ignore", over="ignore"):
        return (a * np.float32(2.0**e)).astype(np.float32)


@pytest.mark.parametrize("fmt", GROUPED)
@given(data=st.data())
def test_backends_match_oracle_on_generated_matrices(fmt: str, data: st.DataObject) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    values = data.draw(_matrices(data.draw(st.sampled_from(["F32", "F16"]))))
    try:
        ref = encode_grouped(values, fmt, backend="oracle")
    except EncodeError:
        for backend in ("numpy", "torch"):
            with pytest.raises(EncodeError):
                encode_grouped(values, fmt, backend=backend)
        return
    for backend in ("numpy", "torch"):
        assert_same_encoding(ref, encode_grouped(values, fmt, backend=backend),
                             entry.group_size, backend)  # fmt: skip


@pytest.mark.parametrize("fmt", GROUPED)
def test_bf16_words_numpy_torch_and_torch_tensor_agree(fmt: str) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    rng = np.random.default_rng(5)
    words = rng.integers(0, 1 << 16, size=(37, 300), dtype=np.uint32).astype(np.uint16)
    words[(words & 0x7F80) == 0x7F80] &= 0xBFFF  # drop inf/NaN words
    words[(words & 0x7F80) > 0x4700] &= 0x83FF  # keep amax/qmax inside binary16 range
    ref = encode_grouped_words(words[:5], "BF16", fmt, backend="oracle")
    np_enc = encode_grouped_words(words, "BF16", fmt, backend="numpy")
    assert_same_encoding(ref, encode_grouped_words(words[:5], "BF16", fmt), entry.group_size)
    tensor = torch.from_numpy(words.view(np.int16)).view(torch.bfloat16)
    for device in DEVICES:
        got = encode_grouped(tensor, fmt, backend="torch", device=device)
        assert_same_encoding(np_enc, got, entry.group_size, f"torch/{device}")
    assert_same_encoding(np_enc, encode_grouped(tensor, fmt, backend="numpy"), entry.group_size)


def test_numpy_chunking_and_threads_do_not_change_results() -> None:
    from ninfer_convert.encoder.numpy_backend import encode_numpy

    rng = np.random.default_rng(9)
    x = rng.standard_normal((301, 777)).astype(np.float32).view(np.uint32)
    fmt = FORMATS["Q5G64_F16S"]
    a = encode_numpy(x, "F32", fmt, threads=1, chunk_elements=1 << 20)
    b = encode_numpy(x, "F32", fmt, threads=2, chunk_elements=1000)
    assert_same_encoding(a, b, 64)


@pytest.mark.parametrize(
    "bad", [np.zeros((0, 4), np.float32), np.zeros((4,), np.float32), np.zeros((2, 0), np.float32)]
)
def test_only_positive_rank_two_matrices_are_encoded(bad: np.ndarray) -> None:
    with pytest.raises(EncodeError, match="rank-two"):
        encode_grouped(bad, "Q4G64_F16S")


@pytest.mark.parametrize("fmt", ["BF16", "NVFP4", "FP8_E4M3FN_ROW_BF16S"])
def test_canonical_encoder_refuses_non_grouped_formats(fmt: str) -> None:
    with pytest.raises(EncodeError):
        encode_grouped(np.ones((1, 16), np.float32), fmt)


# --- reconstruction oracle ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", GROUPED)
def test_dequantize_is_the_exact_scale_times_code_product(fmt: str) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None and entry.qmin is not None and entry.qmax is not None
    rng = np.random.default_rng(11)
    n, k = 3, entry.group_size * 2 + 3
    codes = rng.integers(entry.qmin, entry.qmax + 1, size=(n, k)).astype(np.int8)
    scales = rng.integers(0, 0x7C00, size=(n, 3)).astype(np.uint16)
    scales[0, 0] = 0x0001  # smallest subnormal scale
    out = dequantize_grouped(codes, scales, fmt)
    for r in range(n):
        for c in range(k):
            exact = decode_binary(int(scales[r, c // entry.group_size]), BINARY16) * int(
                codes[r, c]
            )
            want = round_to_binary(exact, BINARY32)  # a zero code gives +0 (positive scale)
            got = int(out[r : r + 1, c].view(np.uint32)[0])
            assert got == want, (r, c, hex(got), hex(want))
    assert out.dtype == np.float32 and out.shape == (n, k)


def test_round_trip_through_encoder_and_decoder_stays_within_half_a_step() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    enc = encode_grouped(x, "Q6G64_F16S")
    y = dequantize_grouped(enc.codes, enc.scales, "Q6G64_F16S")
    step = np.repeat(enc.scales.view(np.float16).astype(np.float32), 64, axis=1)
    assert np.all(np.abs(x - y) <= step * 0.5 + 1e-6)


@given(
    st.integers(min_value=-(1 << 50), max_value=1 << 50),
    st.integers(min_value=-200, max_value=60),
)
def test_oracle_dyadic_rounding_equals_its_rational_rounding(m: int, e: int) -> None:
    """The oracle's integer fast path for x * inv32 is the same RNE as round_to_binary."""
    from ninfer_convert.encoder.oracle import _round_dyadic32, _shift_rne

    exact = Fraction(m) * Fraction(2) ** e
    want = round_to_binary(exact, BINARY32)
    if (want >> 23) & 0xFF == 0xFF:
        return  # beyond binary32: the encoder never forms such products
    n, ne = _round_dyadic32(m, e)
    assert Fraction(n) * Fraction(2) ** ne == decode_binary(want, BINARY32)
    for s in (1, 2, 7, 30):
        assert _shift_rne(m, s) == round(Fraction(m, 1 << s))
