"""encoder/mse_reference.py computes in integers only (dyadic pairs, integer division with
round-half-even, early exit once a candidate's running error reaches the best so far); these
tests hold it to a literal Fraction transcription of docs/encoder-profiles.md, kept here."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ninfer_convert.encoder.corpus import mse_boundary_corpus
from ninfer_convert.encoder.mse_reference import (
    CANDIDATE_RATIOS,
    _dyadic32,
    _round_ratio,
    _search,
    candidate_scales_reference,
    encode_group_mse_reference,
    group_error_reference,
)
from ninfer_convert.encoder.oracle import (
    BINARY16,
    BINARY32,
    OracleFailure,
    decode_binary,
    encode_group_oracle,
    round_to_binary,
)
from ninfer_convert.formats import FORMATS

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
BOUNDS = {name: (FORMATS[name].qmin, FORMATS[name].qmax) for name in GROUPED}


def _literal_scales(x_words: list[int], qmin: int, qmax: int) -> list[int | None]:
    canonical, _ = encode_group_oracle(x_words, qmin, qmax)
    amax = decode_binary(max(w & 0x7FFFFFFF for w in x_words), BINARY32)
    out: list[int | None] = [canonical]
    for d in [Fraction(-qmin)] + [Fraction(qmax * c, 32) for c in CANDIDATE_RATIOS]:
        word = round_to_binary(amax / d, BINARY16) or 0x0001
        out.append(None if (word >> 10) & 0x1F == 0x1F else word)
    return out


def _literal_encode(
    x_words: list[int], qmin: int, qmax: int, weights: list[int] | None = None
) -> tuple[int, list[int]]:
    """The document read line by line, in Fractions (the reference before it went integer)."""
    for i, w in enumerate(x_words):
        if (w >> 23) & 0xFF == 0xFF:
            raise OracleFailure(-1, -1, i, float("nan"))
    if max(w & 0x7FFFFFFF for w in x_words) == 0:
        return 0x0000, [0] * len(x_words)
    best: tuple[Fraction, int, list[int]] | None = None
    for scale in _literal_scales(x_words, qmin, qmax):
        if scale is None:
            continue
        s = decode_binary(scale, BINARY16)
        codes = [min(max(round(decode_binary(w, BINARY32) / s), qmin), qmax) for w in x_words]
        err = group_error_reference(x_words, scale, codes, weights)
        if best is None or err < best[0]:
            best = (err, scale, codes)
    assert best is not None
    return best[1], best[2]


def _finite_f32(word: int) -> int:
    return word if (word >> 23) & 0xFF != 0xFF else word & 0xFF7FFFFF


_GROUP = st.lists(st.integers(0, 2**32 - 1).map(_finite_f32), min_size=1, max_size=64)
_NARROW = st.lists(
    st.floats(-8, 8, width=32).map(lambda v: int(np.float32(v).view(np.uint32))),
    min_size=1,
    max_size=64,
)


@given(st.integers(1, 2**90), st.integers(1, 2**90), st.sampled_from([BINARY16, BINARY32]))
def test_integer_ratio_rounding_is_round_to_binary(n: int, d: int, fmt: object) -> None:
    f = BINARY16 if fmt is BINARY16 else BINARY32
    emin, emax = 1 - f.bias, f.exp_max - 1 - f.bias
    assert _round_ratio(n, d, f.frac_bits, emin, emax) == round_to_binary(Fraction(n, d), f)


# Importance weights: finite binary32 words with the sign bit clear (zeros, subnormals, large).
_WEIGHT = st.one_of(
    st.integers(0, 0x7F7FFFFF),
    st.floats(0, 4, width=32).map(lambda v: int(np.float32(v).view(np.uint32))),
)


@given(st.one_of(_GROUP, _NARROW), st.sampled_from(GROUPED), st.booleans(), st.data())
def test_integer_reference_is_the_literal_fraction_reference(
    x_words: list[int], fmt: str, weighted: bool, data: st.DataObject
) -> None:
    qmin, qmax = BOUNDS[fmt]
    n = len(x_words)
    ws = data.draw(st.lists(_WEIGHT, min_size=n, max_size=n)) if weighted else None
    try:
        want = _literal_encode(x_words, qmin, qmax, ws)
    except OracleFailure as exc:
        with pytest.raises(OracleFailure) as got:
            encode_group_mse_reference(x_words, qmin, qmax, ws)
        assert (got.value.column, got.value.raw_scale) == (exc.column, exc.raw_scale)
        return
    assert encode_group_mse_reference(x_words, qmin, qmax, ws) == want
    if any(w & 0x7FFFFFFF for w in x_words):  # candidates are defined for a non-zero group
        assert candidate_scales_reference(x_words, qmin, qmax) == _literal_scales(
            x_words, qmin, qmax
        )


def test_integer_reference_is_the_literal_one_on_the_boundary_corpus() -> None:
    for fmt in GROUPED:
        qmin, qmax = BOUNDS[fmt]
        g = FORMATS[fmt].group_size
        assert g is not None
        for case, words in mse_boundary_corpus(FORMATS[fmt]):
            for row in words.tolist():
                for lo in range(0, len(row), g):
                    group = row[lo : lo + g]
                    assert encode_group_mse_reference(group, qmin, qmax) == _literal_encode(
                        group, qmin, qmax
                    ), f"{fmt} {case}"


def test_a_candidate_that_only_ties_the_best_error_is_never_returned() -> None:
    # x = -7 * 2^0; scale 1.0 (0x3C00) gives error exactly 0, 0.875 (0x3B00) gives 0 too: a
    # later candidate that ties (at 0 or above) must lose, else the lower-index rule breaks.
    first = _search([-7], 0, 0x3C00, -8, 7, None, None)
    assert first is not None and first[0] == 0 and first[2] == [-7]
    assert _search([-7], 0, 0x3B00, -8, 7, None, (0, 0)) is None
    later = _search([-7], 0, 0x3B00, -8, 7, None, (1, -60))
    assert later is not None and later[0] == 0 and later[2] == [-8]
    # x = [1.0, 0.5] with scale 0.375 (0x3600): codes 3, 1, error 1/64 + 1/64 = 2^-5.
    got = _search([2, 1], -1, 0x3600, -8, 7, None, None)
    assert got is not None and Fraction(got[0]) * Fraction(2) ** got[1] == Fraction(1, 32)
    assert _search([2, 1], -1, 0x3600, -8, 7, None, (1, -5)) is None  # equal to the bound: loses
    assert _search([2, 1], -1, 0x3600, -8, 7, None, (1, -6)) is None  # above it
    assert _search([2, 1], -1, 0x3600, -8, 7, None, (3, -6)) is not None  # below it: kept


@given(st.one_of(_GROUP, _NARROW), st.sampled_from(GROUPED), st.booleans(), st.data())
def test_search_error_sums_are_the_emulated_binary64_sums(
    x_words: list[int], fmt: str, weighted: bool, data: st.DataObject
) -> None:
    # Not just the winner: every candidate's error (m, e) and codes, weighted or not, against
    # group_error_reference's generic RNE64 emulation and the Fraction codes.
    qmin, qmax = BOUNDS[fmt]
    if not any(w & 0x7FFFFFFF for w in x_words):
        return
    try:
        scales = _literal_scales(x_words, qmin, qmax)
    except OracleFailure:
        return
    n = len(x_words)
    ws = data.draw(st.lists(_WEIGHT, min_size=n, max_size=n)) if weighted else None
    dy = [_dyadic32(w) for w in x_words]
    e0 = min(e for _, e in dy)
    xs = [m << (e - e0) for m, e in dy]
    wd = None if ws is None else [_dyadic32(w) for w in ws]
    for s in scales:
        if s is None:
            continue
        got = _search(xs, e0, s, qmin, qmax, wd, None)
        assert got is not None
        sv = decode_binary(s, BINARY16)
        codes = [min(max(round(decode_binary(w, BINARY32) / sv), qmin), qmax) for w in x_words]
        assert got[2] == codes
        want = group_error_reference(x_words, s, codes, ws)
        assert Fraction(got[0]) * Fraction(2) ** got[1] == want, f"scale {s:#06x}"
