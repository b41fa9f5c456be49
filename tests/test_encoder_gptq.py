"""Block-compensated encoding (docs/encoder-profiles.md, "Error compensation across columns"):
the numpy encoder and the C kernel (``_gptqkernel.c``, when built) are each bit-identical to the
plain-Python reference, every compensated value included, an identity factor gives
MSE_F16_SEARCH_V1's words exactly, the factor and refusal rules, and that compensation lowers
the activation-weighted error it is for.  tests/test_encoder_gptq_native.py has the kernel's
own tests (its arguments, its build, larger matrices)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_convert import encode_grouped_words
from ninfer_convert.encoder.corpus import mse_boundary_corpus
from ninfer_convert.encoder.gptq import (
    check_factor,
    encode_compensated,
    encode_compensated_numpy,
    native_available,
)
from ninfer_convert.encoder.gptq_reference import (
    BLOCK_UNIT,
    CompensationFailure,
    encode_compensated_reference,
    round_f32_word,
)
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_IW_V1, MSE_F16_SEARCH_V1

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


BLOCK = BLOCK_UNIT

KERNELS = ["numpy", "native"] if native_available() else ["numpy"]
"""Every encoder this build has: each is held to the reference on its own."""


def identity_factor(k: int, block: int = BLOCK) -> np.ndarray:
    f = np.zeros((k, block), dtype=np.float32)
    f[np.arange(k), np.arange(k) % block] = 1.0
    return f


def factor_from_gram(h: np.ndarray, damp: float = 0.01, block: int = BLOCK) -> np.ndarray:
    """Upper Cholesky factor of the inverse of each damped diagonal block, as [K, B] binary32
    (how a calibration would make one; the encoder only needs *a* valid factor)."""
    k = h.shape[0]
    f = np.zeros((k, block), dtype=np.float32)
    lam = damp * float(np.mean(np.diag(h)))
    for b0 in range(0, k, block):
        b1 = min(k, b0 + block)
        hb = h[b0:b1, b0:b1] + lam * np.eye(b1 - b0)
        f[b0:b1, : b1 - b0] = np.linalg.cholesky(np.linalg.inv(hb)).T
    return f


def random_factor(
    rng: np.random.Generator, k: int, samples: int = 300, block: int = BLOCK
) -> np.ndarray:
    x = rng.standard_normal((samples, k)) * rng.uniform(0.05, 3.0, k)
    x[:, 1:] += 0.7 * x[:, :-1]  # correlated neighbours: compensation has something to do
    return factor_from_gram(x.T @ x / samples, block=block)


def dyadic_factor(rng: np.random.Generator, k: int) -> np.ndarray:
    """Entries that are small powers of two (and 0): every update is exact, so compensated
    values land exactly on code midpoints (ties) far more often than with random factors."""
    block = int(rng.choice([BLOCK, 2 * BLOCK]))
    f = np.zeros((k, block), dtype=np.float32)
    for i in range(k):
        c = i % block
        width = min(block, k - (i - c))
        f[i, c] = float(rng.choice([0.5, 1.0, 2.0]))
        upper = rng.choice([0.0, 0.25, -0.25, 0.5, -0.5, 1.0], size=width - c - 1)
        f[i, c + 1 : width] = upper
    return f


def assert_same(
    words: np.ndarray,
    source: str,
    fmt_name: str,
    factor: np.ndarray,
    weights: np.ndarray | None = None,
) -> None:
    fmt = FORMATS[fmt_name]
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    n, k = words.shape
    x32 = words if source == "F32" else _to_f32_words(words, source)
    want_trace = np.zeros((n, k))
    codes, scales = encode_compensated_reference(
        x32, factor.view(np.uint32), fmt.group_size, fmt.qmin, fmt.qmax, trace=want_trace,
        weights=None if weights is None else weights.view(np.uint32),
    )  # fmt: skip
    for kernel in KERNELS:
        got_trace = np.zeros((n, k))
        got = encode_compensated(
            words, source, fmt, factor, row_chunk=3, trace=got_trace, weights=weights,
            kernel=kernel,
        )  # fmt: skip
        # every compensated value, bit for bit: a one-ulp slip almost never shows in the codes
        assert got_trace.view(np.uint64).tobytes() == want_trace.view(np.uint64).tobytes(), (
            f"{fmt_name} {kernel}: compensated values differ"
        )
        assert got.scales.tobytes() == scales.tobytes(), f"{fmt_name} {kernel}: scale words differ"
        assert got.codes.tobytes() == codes.tobytes(), f"{fmt_name} {kernel}: codes differ"


def _to_f32_words(words: np.ndarray, source: str) -> np.ndarray:
    if source == "BF16":
        return words.astype(np.uint32) << np.uint32(16)
    return words.view(np.float16).astype(np.float32).view(np.uint32)


# --- binary32 rounding of the reference -----------------------------------------------------


def f64_bits(v: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", v))[0])


def numpy_f32_word(v: float) -> int:
    with np.errstate(over="ignore"):
        return int(np.array([v], np.float64).astype(np.float32).view(np.uint32)[0])


@pytest.mark.parametrize(
    "v",
    [0.0, -0.0, 1.0, -1.5, 2.0**-149, 2.0**-150, 2.0**-150 * 1.0000001, 3 * 2.0**-151,
     2.0**-126, 2.0**-126 - 2.0**-150, float.fromhex("0x1.fffffefffffffp127"),
     float.fromhex("0x1.ffffffp127"), 1e300, -1e300, 1 + 2.0**-24, 1 + 3 * 2.0**-24, 2.0**-1074],
)  # fmt: skip
def test_round_f32_word_matches_ieee_at_the_edges(v: float) -> None:
    assert round_f32_word(v) == numpy_f32_word(v)


@settings(max_examples=300)
@given(st.integers(0, (0x7FF << 52) - 1), st.booleans())
def test_round_f32_word_matches_ieee_on_binary64_words(bits: int, neg: bool) -> None:
    v = struct.unpack("<d", struct.pack("<Q", bits | (neg << 63)))[0]
    assert round_f32_word(v) == numpy_f32_word(v)


# --- parity ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt_name", GROUPED)
def test_identity_factor_gives_mse_search_words_on_its_boundary_corpus(
    fmt_name: str, kernel: str
) -> None:
    fmt = FORMATS[fmt_name]
    for what, words in mse_boundary_corpus(fmt):
        if not np.isfinite(words.view(np.float32)).all():
            continue  # refused by both; the refusal tests below cover it
        want = encode_grouped_words(words, "F32", fmt_name, profile=MSE_F16_SEARCH_V1)
        try:
            f = identity_factor(words.shape[1])
            got = encode_compensated(words, "F32", fmt, f, kernel=kernel)
        except EncodeError:
            with pytest.raises(EncodeError):
                encode_grouped_words(words, "F32", fmt_name, profile=MSE_F16_SEARCH_V1)
            continue
        assert got.scales.tobytes() == want.scales.tobytes(), what
        assert got.codes.tobytes() == want.codes.tobytes(), what


@pytest.mark.parametrize("fmt_name", GROUPED)
@pytest.mark.parametrize(
    ("k", "block"),
    [(1, 128), (31, 128), (64, 128), (65, 128), (128, 128), (129, 128), (200, 128), (256, 128),
     (300, 256), (300, 384), (130, 512)],  # B >= K: one block, full compensation
)  # fmt: skip
def test_encoders_match_reference_with_calibration_like_factors(
    fmt_name: str, k: int, block: int
) -> None:
    rng = np.random.default_rng(k)
    words = (rng.standard_normal((5, k)) * 0.05).astype(np.float32)
    words[1] *= np.float32(1e-6)  # subnormal scales
    words[2, : min(k, 64)] = 0.0  # an all-zero group before compensation
    assert_same(words.view(np.uint32), "F32", fmt_name, random_factor(rng, k, block=block))


@pytest.mark.parametrize("fmt_name", GROUPED)
def test_encoders_match_reference_on_exact_ties(fmt_name: str) -> None:
    rng = np.random.default_rng(7)
    fmt = FORMATS[fmt_name]
    assert fmt.qmax is not None
    k = 200
    # small dyadic values: with dyadic factors every compensated value is exact and many
    # quotients w / s are exact half-integers (rint's tie rule decides them)
    words = (rng.integers(-4 * fmt.qmax, 4 * fmt.qmax + 1, (6, k)) / 8).astype(np.float32)
    f = dyadic_factor(rng, k)
    assert_same(words.view(np.uint32), "F32", fmt_name, f)
    ref = encode_compensated_numpy(words.view(np.uint32), "F32", fmt, f)
    assert (ref.codes == fmt.qmin).any() or fmt_name == "W8G32_F16S"


def test_signed_zeros_of_the_compensated_values_are_the_references() -> None:
    """A code of 0 is the integer 0, so s * q is +0 and d = RN64(w - s * q) keeps the sign of
    a w = -0 (numpy's rint(-0 / s) is -0, which flipped it): later -0 values then change sign
    exactly as in the reference.  Codes never show it, the trace does."""
    k = 64
    f = identity_factor(k)
    f[1, 2] = 0.25  # column 1's error (a signed zero) updates column 2 (-0)
    x = np.full((2, k), -0.0, dtype=np.float32)
    x[0, 0] = 0.75  # a nonzero scale: column 1's code is chosen from -0 / s
    assert_same(x.view(np.uint32), "F32", "Q4G64_F16S", f)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(GROUPED),
    st.sampled_from(["BF16", "F16", "F32"]),
    st.integers(1, 3),
    st.integers(1, 260),
    st.integers(0, 2**32 - 1),
)
def test_encoders_match_reference_on_generated_matrices(
    fmt_name: str, source: str, n: int, k: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * rng.choice([1e-3, 0.05, 2.0])).astype(np.float32)
    if source == "F32":
        words = x.view(np.uint32)
    elif source == "F16":
        words = x.astype(np.float16).view(np.uint16)
    else:
        words = (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    f = random_factor(rng, k) if seed % 2 else dyadic_factor(rng, k)
    weights = None
    if seed % 3 == 0:  # importance-weighted scale search; some weights exactly +0
        weights = (rng.uniform(0, 4, k) * (rng.random(k) > 0.1)).astype(np.float32)
    assert_same(words, source, fmt_name, f, weights)


@pytest.mark.parametrize("fmt_name", GROUPED)
def test_weighted_scale_search_matches_reference_and_iw_profile(fmt_name: str) -> None:
    rng = np.random.default_rng(5)
    k = 200
    words = (rng.standard_normal((4, k)) * 0.05).astype(np.float32)
    weights = rng.uniform(0, 4, k).astype(np.float32)
    assert_same(words.view(np.uint32), "F32", fmt_name, random_factor(rng, k), weights)
    # with no compensation the weighted search is MSE_F16_SEARCH_IW_V1 itself
    want = encode_grouped_words(
        words.view(np.uint32), "F32", fmt_name, profile=MSE_F16_SEARCH_IW_V1, importance=weights
    )
    for kernel in KERNELS:
        got = encode_compensated(
            words.view(np.uint32), "F32", FORMATS[fmt_name], identity_factor(k), weights=weights,
            kernel=kernel,
        )  # fmt: skip
        assert got.scales.tobytes() == want.scales.tobytes(), kernel
        assert got.codes.tobytes() == want.codes.tobytes(), kernel


# --- factor rules and refusals ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "word", "why"),
    [
        ((5, 5), 0x7FC00000, "is not finite"),
        ((5, 7), 0x7F800000, "is not finite"),
        ((5, 4), 0x3F800000, "must be +0"),
        ((5, 5), 0x00000000, "must be > +0"),
        ((5, 5), 0x80000000, "must be > +0"),
        ((5, 5), 0xBF800000, "must be > +0"),
        ((130, 75), 0x3F800000, "must be +0"),  # right of the partial last block's width
    ],
)
def test_check_factor_refuses_with_the_entry(where: tuple[int, int], word: int, why: str) -> None:
    k = 200  # blocks [0, 128) and [128, 200): the last has width 72
    f = identity_factor(k).view(np.uint32).copy()
    f[where] = word
    with pytest.raises(EncodeError) as exc:
        check_factor(f, k, "model.w")
    msg = exc.value.message
    assert f"[{where[0]}, {where[1]}]" in msg and why in msg and "model.w" in msg


def test_check_factor_refuses_a_wrong_shape() -> None:
    for shape in [(64, 64), (64, 0), (63, 128), (64,)]:
        with pytest.raises(EncodeError, match="K = 64 and B a positive multiple of 128"):
            check_factor(np.ones(shape, np.float32), 64, "t")


def test_nonfinite_source_is_refused_where_the_reference_refuses() -> None:
    fmt = FORMATS["Q4G64_F16S"]
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 150)) * 0.1).astype(np.float32)
    x[2, 70] = np.inf
    x[3, 3] = np.nan  # a later row: the first failing row is reported
    f = random_factor(rng, 150)
    with pytest.raises(CompensationFailure) as ref:
        encode_compensated_reference(x.view(np.uint32), f.view(np.uint32), 64, -8, 7)
    assert (ref.value.row, ref.value.column) == (2, 64)
    for kernel in KERNELS:
        with pytest.raises(EncodeError) as exc:
            encode_compensated(x.view(np.uint32), "F32", fmt, f, tensor="m.w", kernel=kernel)
        assert "m.w: row 2, column 64: the scale search refuses the group" in exc.value.message


def test_compensation_that_overflows_is_refused_at_the_column() -> None:
    """Inside a group the values are not rounded to binary32 again, so only binary64 overflow
    (to infinity, then NaN) stops the encoder: at the column where it happens."""
    fmt = FORMATS["Q4G64_F16S"]
    k = 64
    f = np.zeros((k, BLOCK), dtype=np.float32)
    for i in range(k):
        f[i, i] = np.float32(2.0**-149)  # e = d * 2^149
        f[i, i + 1 : k] = np.float32(2.0**127)  # each column multiplies the error by ~2^276
    x = np.full((2, k), 0.3, dtype=np.float32)
    x[0] = 0.0  # row 0 stays exactly zero: d = 0 every time
    with pytest.raises(CompensationFailure) as ref:
        encode_compensated_reference(x.view(np.uint32), f.view(np.uint32), 64, -8, 7)
    assert ref.value.row == 1 and 1 < ref.value.column < k
    assert ref.value.reason == "the compensated value is not finite"
    want = f"row 1, column {ref.value.column}: the compensated value is not finite"
    for kernel in KERNELS:
        with pytest.raises(EncodeError, match=want):
            encode_compensated(x.view(np.uint32), "F32", fmt, f, kernel=kernel)


# --- what it is for ---------------------------------------------------------------------------


def test_compensation_lowers_the_activation_weighted_error() -> None:
    """Against MSE_F16_SEARCH_V1 on the same weights: the block-diagonal proxy error
    sum_n (q_n - w_n)^T H_bb (q_n - w_n) of correlated activations drops markedly."""
    rng = np.random.default_rng(11)
    k, n = 256, 64
    x = rng.standard_normal((2000, k))
    x[:, 1:] += 0.9 * x[:, :-1]
    h = x.T @ x / 2000
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    fmt = FORMATS["Q4G64_F16S"]

    def dequant(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
        s = np.repeat(scales.view(np.float16).astype(np.float64), 64, axis=1)
        return codes * s

    def proxy(q: np.ndarray) -> float:
        d = q - w.astype(np.float64)
        total = 0.0
        for b0 in range(0, k, BLOCK):
            db = d[:, b0 : b0 + BLOCK]
            total += float(np.einsum("nk,kj,nj->", db, h[b0 : b0 + BLOCK, b0 : b0 + BLOCK], db))
        return total

    mse = encode_grouped_words(w.view(np.uint32), "F32", "Q4G64_F16S", profile=MSE_F16_SEARCH_V1)
    comp = encode_compensated_numpy(w.view(np.uint32), "F32", fmt, factor_from_gram(h))
    assert proxy(dequant(comp.codes, comp.scales)) < 0.7 * proxy(dequant(mse.codes, mse.scales))


def test_reference_memory_follows_a_factor_row_not_the_factor() -> None:
    """verify's oracle sample runs the reference on whole rows with the stored factor: its
    memory must not grow with K x B (a [4096, 4096] factor held as Python floats is ~0.5 GB)."""
    import tracemalloc

    k = block = 384
    fmt = FORMATS["Q4G64_F16S"]
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    f = identity_factor(k, block)
    x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32).view(np.uint32)
    tracemalloc.start()
    try:
        codes, _ = encode_compensated_reference(
            x, f.view(np.uint32), fmt.group_size, fmt.qmin, fmt.qmax
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert codes.shape == (1, k)
    assert peak < 256 << 10, peak  # the factor: 576 KiB of words, ~5 MiB as Python floats


def test_check_factor_memory_follows_a_chunk_of_rows() -> None:
    """convert and verify check a factor once per row block and thread: its temporaries must
    stay a bounded chunk, not several copies of the [K, B] factor."""
    import tracemalloc

    k = 2048
    f = identity_factor(k, k).view(np.uint32)  # 16 MiB of words
    tracemalloc.start()
    try:
        check_factor(f, k, "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_check_factor_reports_the_first_rule_broken_in_rule_order() -> None:
    """Rule order first (not finite, then +0 outside the triangle, then the diagonal), then
    row-major: the same entry whatever chunks the check walks."""
    k = 2048
    f = identity_factor(k, k).view(np.uint32).copy()
    f[0, 5] = 0x3F800000  # an upper-triangle entry: allowed
    f[3, 1] = 0x3F800000  # left of the diagonal
    f[2047, 2047] = 0  # a diagonal entry that is +0
    f[2040, 2045] = 0x7F800000  # not finite, in a late chunk
    with pytest.raises(EncodeError, match=r"\[2040, 2045\].*is not finite"):
        check_factor(f, k, "t")
    f[2040, 2045] = 0
    with pytest.raises(EncodeError, match=r"\[3, 1\].*must be \+0"):
        check_factor(f, k, "t")
    f[3, 1] = 0
    with pytest.raises(EncodeError, match=r"\[2047, 2047\].*must be > \+0"):
        check_factor(f, k, "t")
