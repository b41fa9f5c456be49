"""The C kernel's bookkeeping around the search (_msekernel.c), on every vector path this CPU
has, bit for bit against the exact reference:

* a lane that is no usable candidate (an infinite candidate, the two padding lanes) searches
  candidate 0's scale, so it has lane 0's error and loses the tie: it is never chosen, even in
  groups where some other finite scale in its place would win;
* a row's groups go through three phases a chunk of groups at a time (read and form the
  candidates, search, choose and store), so the first refusal must still be the first in
  row-major order, and chunk boundaries, partial groups and all-zero groups between searched
  ones must not change a word;
* the candidates of a group's maximum are formed once per block and copied for later groups
  with the same maximum (BF16 and binary16 sources): shared and overwritten memo slots must
  not change a word;
* the search works on |x| with the bound qmax (x >= 0) or -qmin (x < 0): negative values
  clamped at qmin beside positive ones clamped at qmax."""

from __future__ import annotations

import numpy as np
import pytest
from mse_kernel_fixtures import kernel, kernel_paths

from ninfer_convert.encoder import host
from ninfer_convert.encoder.mse_reference import candidate_scales_reference, encode_mse_reference
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_V1

pytestmark = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
F16_INF = 0x7C00
# Fractions f of the canonical scale s0 such that, in the groups below, a lane searching f * s0
# would beat every usable candidate (asserted; none was found for W8's 255 codes, whose groups
# are kept for the reference comparison).
FRACTIONS = {
    "Q4G64_F16S": (0.75, 0.72),
    "Q5G64_F16S": (0.9, 0.95),
    "Q6G64_F16S": (0.95, 0.97),
    "W8G32_F16S": (0.75, 0.9),
}


PATHS = kernel_paths()


def _native(words: np.ndarray, source: str, fmt: str, path: str) -> tuple[np.ndarray, np.ndarray]:
    f = FORMATS[fmt]
    assert f.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // f.group_size)), dtype=np.uint16)
    default = kernel.kernel_path()
    kernel.kernel_path(path)
    try:
        host.encode_rows(words, source, f, 0, codes, scales, "t", profile=MSE_F16_SEARCH_V1)
    finally:
        kernel.kernel_path(default)
    return codes, scales


def _reference(f32: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    f = FORMATS[fmt]
    assert f.group_size is not None and f.qmin is not None and f.qmax is not None
    return encode_mse_reference(f32.view(np.uint32), f.group_size, f.qmin, f.qmax)


def _assert_reference(f32: np.ndarray, fmt: str, path: str) -> np.ndarray:
    want_codes, want_scales = _reference(f32, fmt)
    codes, scales = _native(f32.view(np.uint32), "F32", fmt, path)
    assert scales.tobytes() == want_scales.tobytes(), f"{fmt} {path}: scale words"
    assert codes.tobytes() == want_codes.tobytes(), f"{fmt} {path}: codes"
    return scales


def _overflow_band_groups(fmt: str) -> np.ndarray:
    """Rows of one group each whose canonical scale s0 is finite but whose larger candidates
    overflow binary16, filled with multiples of f * s0 (FRACTIONS): a lane searching such a
    scale instead of s0 would win (checked below), so only the lane rule keeps the infinite
    candidate out."""
    f = FORMATS[fmt]
    assert f.group_size is not None and f.qmax is not None and f.qmin is not None
    g, qmax = f.group_size, f.qmax
    rows = []
    for top in (65504.0, 64000.0, 62000.0, 60500.0):
        amax = np.float32(top * qmax)  # exact: an 11-bit significand times qmax
        s0 = float(np.float16(amax / np.float32(qmax)))
        cands = candidate_scales_reference([int(amax.view(np.uint32))], f.qmin, qmax)
        assert cands[0] is not None and any(c is None for c in cands), top
        for frac in FRACTIONS[fmt]:
            step = np.float32(s0 * frac)
            for sign in (1.0, -1.0):
                rest = [sign * float(step) * ((i % qmax) + 1) for i in range(g - 1)]
                rows.append(np.asarray([float(amax), *rest], np.float32))
    return np.stack(rows)


def _sequential_error(x: np.ndarray, s: float, qmin: int, qmax: int) -> float:
    d = x.astype(np.float64) - np.clip(np.rint(x.astype(np.float64) / s), qmin, qmax) * s
    acc = 0.0
    for t in d * d:
        acc = acc + float(t)
    return acc


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", GROUPED)
def test_infinite_candidates_are_never_chosen_where_another_scale_would_win(
    fmt: str, path: str
) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None
    rows = _overflow_band_groups(fmt)
    # The corpus does what it says: for every row, a lane searching f * s0 (not a candidate)
    # would have a smaller error than every usable candidate.
    wins = 0
    for x in rows:
        cands = candidate_scales_reference([int(v) for v in x.view(np.uint32)], f.qmin, f.qmax)
        finite = [float(np.uint16(c).view(np.float16)) for c in cands if c is not None]
        best = min(_sequential_error(x, s, f.qmin, f.qmax) for s in finite)
        s0 = finite[0]
        wins += any(
            _sequential_error(x, float(np.float32(s0 * fr)), f.qmin, f.qmax) < best
            for fr in FRACTIONS[fmt]
        )
    assert wins == (0 if fmt == "W8G32_F16S" else len(rows))
    scales = _assert_reference(rows, fmt, path)
    assert F16_INF not in scales


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", GROUPED)
def test_chunk_boundaries_partial_and_zero_groups_change_no_word(fmt: str, path: str) -> None:
    f = FORMATS[fmt]
    assert f.group_size is not None and f.qmin is not None and f.qmax is not None
    g = f.group_size
    rng = np.random.default_rng(16)
    k = g * 17 + 5  # 18 groups: chunks of 8, 8 and 2, the last group partial
    x = (rng.standard_normal((3, k)) * 0.02).astype(np.float32)
    x[0, : 2 * g] = 0.0  # all-zero groups at the start of a chunk ...
    x[1, 7 * g : 9 * g] = -0.0  # ... and across a chunk boundary
    x[2, 8 * g : 9 * g] = 0.0
    # negative maxima clamped at qmin beside positive ones clamped at qmax
    x[1, 3 * g] = -0.9
    x[1, 3 * g + 1] = 0.85
    x[2, 10 * g + 4] = -1.5
    _assert_reference(x, fmt, path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("first", "later", "want"),
    [("overflow", "nan", "overflow"), ("nan", "overflow", "nonfinite")],
)
@pytest.mark.parametrize("groups", [(1, 3), (2, 12), (6, 9)])
def test_the_first_refusal_in_row_major_order_is_returned_across_a_chunk(
    path: str, first: str, later: str, want: str, groups: tuple[int, int]
) -> None:
    g, qmin, qmax = 64, -8, 7
    x = np.full((2, 16 * g), 0.5, np.float32)
    for kind, gi in ((first, groups[0]), (later, groups[1])):
        x[1, gi * g + 5] = np.float32(65520.0 * 8) if kind == "overflow" else np.nan
    x[0, 15 * g] = np.nan  # an earlier row's refusal comes first of all ...
    codes = np.empty(x.shape, np.int8)
    scales = np.empty((2, 16), np.uint16)
    default = kernel.kernel_path()
    kernel.kernel_path(path)
    try:
        got0 = kernel.encode_rows(x.view(np.uint32), 1, 2, 16 * g, g, qmin, qmax, codes, scales)
        x[0, 15 * g] = 0.5  # ... and without it, row 1's first one
        got1 = kernel.encode_rows(x.view(np.uint32), 1, 2, 16 * g, g, qmin, qmax, codes, scales)
    finally:
        kernel.kernel_path(default)
    assert got0 == ("nonfinite", 0, 15 * g)
    assert got1[0] == want and got1[1] == 1
    assert got1[2] == (groups[0] if want == "overflow" else groups[0] * g + 5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("fmt", "source"), [("Q4G64_F16S", "BF16"), ("W8G32_F16S", "F16")])
def test_maxima_seen_before_in_the_block_get_the_same_words(
    fmt: str, source: str, path: str
) -> None:
    # The kernel keeps the candidates of the maxima it has seen in a block (a direct-mapped
    # memo of 256 slots): 300 distinct maxima, each in two groups in random order, so slots
    # are shared and overwritten; BF16 or binary16 words, compared with the reference.
    f = FORMATS[fmt]
    assert f.group_size is not None
    g = f.group_size
    rng = np.random.default_rng(161)
    if source == "BF16":
        tops = (np.arange(300, dtype=np.uint32) + 0x3C80) << 16  # BF16 words 0x3C80..
    else:
        tops = (
            np.asarray(np.arange(300, dtype=np.uint16) + 0x2C00, np.uint16)
            .view(np.float16)
            .astype(np.float32)
            .view(np.uint32)
        )
    order = rng.permutation(np.concatenate([tops, tops]))
    top = order.view(np.float32)
    x = (rng.uniform(-1.0, 1.0, (len(order), g)) * top[:, None] * 0.99).astype(np.float32)
    x[:, 0] = np.where(rng.random(len(order)) < 0.5, top, -top)
    if source == "BF16":
        x = ((x.view(np.uint32) >> 16) << 16).view(np.float32)  # exact BF16 values
        words = (x.view(np.uint32) >> 16).astype(np.uint16)
    else:
        words = x.astype(np.float16).view(np.uint16)
        x = words.view(np.float16).astype(np.float32)
    rows = x.reshape(6, -1)  # 100 (200) groups per row
    want_codes, want_scales = _reference(rows, fmt)
    codes, scales = _native(words.reshape(6, -1), source, fmt, path)
    assert scales.tobytes() == want_scales.tobytes() and codes.tobytes() == want_codes.tobytes()
