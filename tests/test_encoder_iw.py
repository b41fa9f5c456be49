"""MSE_F16_SEARCH_IW_V1 (docs/encoder-profiles.md): the importance-weighted error of the exact
reference against plain IEEE binary64, numpy parity bit for bit on the boundary corpus with
weight edge cases (zeros, subnormal and huge binary32 weights, ties), the weight refusals."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ninfer_convert import encode_grouped_words
from ninfer_convert.encoder import host
from ninfer_convert.encoder.corpus import failing_corpus, mse_boundary_corpus
from ninfer_convert.encoder.mse_reference import (
    candidate_scales_reference,
    encode_group_mse_reference,
    group_error_reference,
)
from ninfer_convert.encoder.mse_search import encode_mse_numpy
from ninfer_convert.errors import EncodeError, UsageError
from ninfer_convert.formats import (
    ENCODER_PROFILES,
    FORMATS,
    MSE_F16_SEARCH_IW_V1,
    MSE_F16_SEARCH_V1,
)
from ninfer_convert.logical import GroupedCodes

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
IW = MSE_F16_SEARCH_IW_V1


def f32w(values: list[float]) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.uint32).tolist()


def both(
    words: np.ndarray, source: str, fmt: str, w: np.ndarray
) -> tuple[GroupedCodes, GroupedCodes]:
    ref = encode_grouped_words(words, source, fmt, backend="oracle", profile=IW, importance=w)
    got = encode_grouped_words(
        words, source, fmt, backend="numpy", profile=IW, importance=w, threads=1
    )
    return ref, got


def assert_identical(ref: GroupedCodes, got: GroupedCodes, what: str) -> None:
    assert got.scales.tobytes() == ref.scales.tobytes(), f"{what}: scale words differ"
    assert got.codes.tobytes() == ref.codes.tobytes(), f"{what}: codes differ"


def weight_cases(k: int) -> list[tuple[str, np.ndarray]]:
    """Named [k] binary32 weight vectors: the edge cases of the document."""
    rng = np.random.default_rng(k)
    sub = np.array([1, 2, 0x7FFFFF, 0x400000], np.uint32)  # binary32 subnormals
    cases = [
        ("ones", np.ones(k, np.float32).view(np.uint32)),
        ("zeros", np.zeros(k, np.uint32)),
        ("lognormal", rng.lognormal(0.0, 3.0, k).astype(np.float32).view(np.uint32)),
        ("subnormal", np.resize(sub, k)),
        ("huge", np.full(k, np.float32(3.4e38)).view(np.uint32)),
        ("max-finite", np.full(k, 0x7F7FFFFF, np.uint32)),
    ]
    mixed = rng.lognormal(0.0, 2.0, k).astype(np.float32)
    mixed[::3] = 0.0
    mixed[1::5] = np.float32(3.0e38)
    m = mixed.view(np.uint32).copy()
    m[2::7] = 1  # the smallest subnormal beside zeros and huge weights
    cases.append(("mixed", m))
    return cases


# --- the reference's weighted error is plain IEEE binary64 -----------------------------------


def _ieee_error(x: list[int], s16: int, codes: list[int], w: list[int]) -> Fraction:
    """The document's loop in Python floats (IEEE binary64, round to nearest even, no FMA)."""
    s = float(np.array([s16], np.uint16).view(np.float16)[0])
    xs = np.asarray(x, np.uint32).view(np.float32).astype(np.float64).tolist()
    ws = np.asarray(w, np.uint32).view(np.float32).astype(np.float64).tolist()
    acc = 0.0
    for xi, qi, wi in zip(xs, codes, ws, strict=True):
        d = xi - s * qi
        t = d * d
        acc = acc + wi * t
    return Fraction(acc)


@given(
    hnp.arrays(np.float32, 17, elements=st.floats(-1e4, 1e4, width=32)),
    hnp.arrays(np.uint32, 17, elements=st.integers(0, 0x7F7FFFFF)),
)
def test_reference_weighted_error_is_the_ieee_binary64_loop(x32: np.ndarray, w: np.ndarray) -> None:
    x = [int(v) for v in x32.view(np.uint32)]
    ws = [int(v) for v in w]
    for s16 in candidate_scales_reference(x, -8, 7) if any(v & 0x7FFFFFFF for v in x) else []:
        if s16 is None:
            continue
        s = Fraction(float(np.array([s16], np.uint16).view(np.float16)[0]))
        codes = [min(max(round(Fraction(float(v)) / s), -8), 7) for v in x32.tolist()]
        assert group_error_reference(x, s16, codes, ws) == _ieee_error(x, s16, codes, ws)


def test_unit_weights_are_the_unweighted_profile() -> None:
    rng = np.random.default_rng(1)
    words = rng.standard_normal((6, 150)).astype(np.float32).view(np.uint32)
    ones = np.ones(150, np.float32)
    for fmt in GROUPED:
        a = encode_grouped_words(words, "F32", fmt, profile=IW, importance=ones, threads=1)
        b = encode_grouped_words(words, "F32", fmt, profile=MSE_F16_SEARCH_V1, threads=1)
        assert_identical(b, a, fmt)


def test_all_zero_weights_give_candidate_zero_the_canonical_scale() -> None:
    # every candidate error is +0, so candidate 0 (the canonical scale) wins the tie and the
    # codes are its nearest codes; unweighted, -8 .. 7 would take scale 1.0 with zero error.
    vals = [float(v) for v in range(-8, 8)]
    x = f32w(vals)
    scale, codes = encode_group_mse_reference(x, -8, 7, [0] * 16)
    cands = candidate_scales_reference(x, -8, 7)
    assert scale == cands[0] == 0x3C92  # round_f16(8 / 7)
    assert encode_group_mse_reference(x, -8, 7)[0] == 0x3C00
    s = _f16(scale)
    assert codes == [min(max(round(Fraction(v) / s), -8), 7) for v in vals]
    words = np.asarray([x, x[::-1]], np.uint32)
    ref, got = both(words, "F32", "Q4G64_F16S", np.zeros(16, np.uint32))
    assert_identical(ref, got, "zeros")
    assert ref.scales.tolist() == [[0x3C92], [0x3C92]]


def test_weights_move_the_choice_to_the_important_columns() -> None:
    # [-8, 7, 0.6, -3.4]: unweighted the canonical 8/7 wins; weighting the first two values
    # picks 1.0 (which reconstructs them exactly), weighting the last two a third scale.
    x = f32w([-8.0, 7.0, 0.6, -3.4])
    plain = encode_group_mse_reference(x, -8, 7)
    heavy = encode_group_mse_reference(x, -8, 7, f32w([0.0, 0.0, 1.0, 1.0]))
    assert plain[0] == 0x3C92
    assert encode_group_mse_reference(x, -8, 7, f32w([1.0, 1.0, 0.0, 0.0]))[0] == 0x3C00
    assert heavy[0] not in (0x3C92, 0x3C00)
    s_h = heavy[0]
    e_h = group_error_reference(x, s_h, heavy[1], f32w([0.0, 0.0, 1.0, 1.0]))
    e_p = group_error_reference(x, plain[0], plain[1], f32w([0.0, 0.0, 1.0, 1.0]))
    assert e_h < e_p


def test_weighted_tie_goes_to_the_lower_index() -> None:
    # [-7, 5]: with all weight on -7, both candidate 0 (1.0) and candidate 1 (0.875) give error
    # 0 (codes -7 and -8); the lower index must win.
    x = f32w([-7.0, 5.0])
    cands = candidate_scales_reference(x, -8, 7)
    assert cands[0] == 0x3C00 and cands[1] == 0x3B00
    w = f32w([1.0, 0.0])
    errs = [
        group_error_reference(x, s, [min(max(round(-7 / _f16(s)), -8), 7), 0], w)
        for s in (0x3C00, 0x3B00)
    ]
    assert errs == [0, 0]
    assert encode_group_mse_reference(x, -8, 7, w)[0] == 0x3C00


def _f16(word: int) -> Fraction:
    return Fraction(float(np.array([word], np.uint16).view(np.float16)[0]))


# --- numpy parity, bit for bit ----------------------------------------------------------------


@pytest.mark.parametrize("fmt", GROUPED)
def test_numpy_matches_reference_on_the_boundary_corpus_with_weight_edge_cases(fmt: str) -> None:
    # Each corpus case with one weight edge case in turn, so every edge case meets several
    # corpus cases (the reference costs milliseconds per group: every pair takes a minute; it
    # passed when this was written).
    corpus = mse_boundary_corpus(FORMATS[fmt])
    assert len(corpus) >= 2 * len(weight_cases(1))
    for i, (case, words) in enumerate(corpus):
        cases = weight_cases(words.shape[1])
        for wname, w in (cases[i % len(cases)],):
            ref, got = both(words, "F32", fmt, w)
            assert_identical(ref, got, f"{fmt} {case} weights={wname}")


@pytest.mark.parametrize("fmt", GROUPED)
def test_refusals_of_source_values_are_the_canonical_ones(fmt: str) -> None:
    for case, words, row, group in failing_corpus(FORMATS[fmt]):
        w = np.ones(words.shape[1], np.float32)
        msgs = []
        for backend in ("numpy", "oracle"):
            with pytest.raises(EncodeError) as exc:
                encode_grouped_words(words, "F32", fmt, backend=backend, profile=IW, importance=w)
            msgs.append(str(exc.value))
        with pytest.raises(EncodeError) as canon:
            encode_grouped_words(words, "F32", fmt, backend="oracle")
        assert msgs[0] == msgs[1] == str(canon.value), case
        assert f"row {row}" in msgs[0] and f"group {group}" in msgs[0]


@st.composite
def _weighted(draw: st.DrawFn) -> tuple[np.ndarray, str, np.ndarray]:
    source = draw(st.sampled_from(["F32", "BF16"]))
    n = draw(st.integers(1, 3))
    k = draw(st.integers(1, 140))
    if source == "F32":
        x = draw(hnp.arrays(np.float32, (n, k), elements=st.floats(-4, 4, width=32)))
        x = x * np.float32(2.0) ** np.float32(draw(st.integers(-140, 14)))
        words = np.ascontiguousarray(x.astype(np.float32)).view(np.uint32)
    else:
        words = draw(hnp.arrays(np.uint16, (n, k)))
        exp = ((words >> np.uint16(7)) & np.uint16(0xFF)) % np.uint16(141)
        words = ((words & np.uint16(0x807F)) | (exp << np.uint16(7))).astype(np.uint16)
    w = draw(hnp.arrays(np.uint32, k, elements=st.integers(0, 0x7F7FFFFF)))
    zero_share = draw(st.integers(0, 3))  # 0: none, else every zero_share-th weight +0
    if zero_share:
        w[::zero_share] = 0
    return words, source, w


@settings(max_examples=40)
@given(_weighted(), st.sampled_from(GROUPED))
def test_numpy_matches_reference_on_generated_weighted_matrices(
    m: tuple[np.ndarray, str, np.ndarray], fmt: str
) -> None:
    words, source, w = m
    ref, got = both(words, source, fmt, w)
    assert_identical(ref, got, f"{fmt} {source}")


def test_threads_and_chunks_do_not_change_the_weighted_words() -> None:
    rng = np.random.default_rng(3)
    words = rng.standard_normal((37, 300)).astype(np.float32).view(np.uint32)
    w = rng.lognormal(0, 2, 300).astype(np.float32)
    fmt = FORMATS["Q4G64_F16S"]
    a = encode_mse_numpy(words, "F32", fmt, threads=1, weights=w)
    b = encode_mse_numpy(words, "F32", fmt, threads=2, chunk_elements=700, weights=w)
    assert_identical(a, b, "threads/chunks")
    plain = encode_mse_numpy(words, "F32", fmt, threads=1)
    assert plain.scales.tobytes() != a.scales.tobytes()  # the weights really changed something


def test_host_block_encoder_takes_the_importance_vector() -> None:
    rng = np.random.default_rng(4)
    words = rng.standard_normal((5, 130)).astype(np.float32).view(np.uint32)
    w = rng.lognormal(0, 2, 130).astype(np.float32).view(np.uint32)
    fmt = FORMATS["Q4G64_F16S"]
    codes = np.empty((5, 130), np.int8)
    scales = np.empty((5, 3), np.uint16)
    host.encode_rows(words, "F32", fmt, 0, codes, scales, "t", profile=IW, importance=w)
    ref = encode_grouped_words(words, "F32", fmt, backend="oracle", profile=IW, importance=w)
    assert_identical(ref, GroupedCodes(codes, scales), "host.encode_rows")
    with pytest.raises(ValueError, match="importance"):
        host.encode_rows(words, "F32", fmt, 0, codes, scales, "t", profile=IW)


# --- refusals of the weights -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "why"),
    [
        (0x80000000, "negative"),  # -0
        (0xBF800000, "negative"),  # -1
        (0x7F800000, "not finite"),  # +inf
        (0xFF800000, "negative"),  # -inf: the sign is reported first
        (0x7FC00000, "not finite"),  # NaN
    ],
)
@pytest.mark.parametrize("backend", ["numpy", "oracle"])
def test_bad_weights_are_refused_naming_tensor_and_column(
    word: int, why: str, backend: str
) -> None:
    words = np.ones((2, 70), np.float32).view(np.uint32)
    w = np.ones(70, np.float32).view(np.uint32).copy()
    w[66] = word
    with pytest.raises(EncodeError) as exc:
        encode_grouped_words(
            words, "F32", "Q4G64_F16S", backend=backend, profile=IW, importance=w, tensor="m.w"
        )
    msg = str(exc.value)
    assert "m.w" in msg and "column 66" in msg and why in msg and f"0x{word:08X}" in msg


def test_weight_vector_length_and_type_are_checked() -> None:
    words = np.ones((2, 70), np.float32).view(np.uint32)
    with pytest.raises(EncodeError, match="69 weights but the matrix has K = 70"):
        encode_grouped_words(words, "F32", "Q4G64_F16S", profile=IW, importance=np.ones(69, "f4"))
    with pytest.raises(EncodeError, match="binary32"):
        encode_grouped_words(words, "F32", "Q4G64_F16S", profile=IW, importance=np.ones(70))


def test_importance_only_with_the_weighted_profile() -> None:
    words = np.ones((2, 70), np.float32).view(np.uint32)
    with pytest.raises(UsageError, match="needs an importance vector"):
        encode_grouped_words(words, "F32", "Q4G64_F16S", profile=IW)
    for other in (MSE_F16_SEARCH_V1, "MAXABS_F16_RECIP_RNE_V1"):
        with pytest.raises(UsageError, match="takes no importance vector"):
            encode_grouped_words(
                words, "F32", "Q4G64_F16S", profile=other, importance=np.ones(70, "f4")
            )
    with pytest.raises(UsageError, match="no 'torch' backend"):
        encode_grouped_words(
            words, "F32", "Q4G64_F16S", profile=IW, importance=np.ones(70, "f4"), backend="torch"
        )


def test_profile_row_is_registered_for_the_four_grouped_formats_with_importance() -> None:
    p = ENCODER_PROFILES[IW]
    assert p.importance and sorted(p.formats) == GROUPED
    assert not ENCODER_PROFILES[MSE_F16_SEARCH_V1].importance
