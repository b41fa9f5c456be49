"""The C kernel's binary32 screen (_msekernel.c, errors_screened / screen_choice), which the
converter runs for the unweighted 4..6-bit formats: every candidate's error is first computed
in binary32 (F), and where every candidate that the bound of docs/encoder-profiles.md ("The
binary32 screen") cannot rule out has one scale, that candidate is chosen without the binary64
search.

The test hook ``screen_errors`` returns one group's F and the screen's choice (or -1) on the
selected path.  Held here, on every path: the documented bound |F - A| <= delta * A + eta
against the exact reference error A of every candidate (the binary64 sum of the profile),
on groups built to reach the bound's cases (values within a binary32 rounding of a
half-integer multiple of a candidate, exact ties between candidates, subnormal scales, tiny
and large maxima); every choice the screen makes is the reference's; the screen decides
almost every Gaussian group (else it would only cost); and encode_rows writes the same bytes
with the screen on and off."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from mse_kernel_fixtures import kernel, kernel_paths

from ninfer_convert.encoder.corpus import mse_boundary_corpus
from ninfer_convert.encoder.mse_reference import (
    candidate_scales_reference,
    group_error_reference,
)
from ninfer_convert.encoder.oracle import BINARY16, BINARY32, decode_binary
from ninfer_convert.formats import FORMATS

pytestmark = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")
SCREENED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
PATHS = kernel_paths()
ETA = Fraction(2) ** -100


def _near_half_integers(rng: np.random.Generator, g: int, qmin: int, qmax: int) -> np.ndarray:
    """A Gaussian group with several values moved to within a binary32 step of a half-integer
    multiple of one of its candidates (where the screen's code may be the other neighbour)."""
    x = (rng.standard_normal(g) * 0.02).astype(np.float32)
    words = [int(w) for w in x.view(np.uint32)]
    scales = [s for s in candidate_scales_reference(words, qmin, qmax) if s is not None]
    s = float(decode_binary(scales[int(rng.integers(len(scales)))], BINARY16))
    amax = float(np.abs(x).max())
    for i in rng.choice(g, size=g // 4, replace=False):
        h = int(rng.integers(0, max(1, int(amax / s)))) + 0.5
        v = np.float32(h * s * (1.0 + float(rng.choice([-1, 1])) * 2.0**-23 * rng.integers(3)))
        if abs(float(v)) < amax:
            x[i] = v * np.float32(rng.choice([-1, 1]))
    return x.view(np.uint32)


def _groups(fmt: str) -> list[np.ndarray]:
    f = FORMATS[fmt]
    assert f.group_size is not None and f.qmin is not None and f.qmax is not None
    g = f.group_size
    out: list[np.ndarray] = []
    for _, words in mse_boundary_corpus(f):
        for row in words:
            for a in range(0, row.size, g):
                grp = row[a : a + g]
                if grp.size >= 1 and int((grp & 0x7FFFFFFF).max()) != 0:
                    out.append(np.ascontiguousarray(grp))
    out = out[:: max(1, len(out) // 30)]  # about 30: the reference is slow
    rng = np.random.default_rng(1616)
    for _ in range(16):
        out.append(_near_half_integers(rng, g, f.qmin, f.qmax))
    for _ in range(8):
        out.append((rng.standard_normal(g) * 0.02).astype(np.float32).view(np.uint32))
    for amax in (1e-38, 1e-30, 1e-10, 3e-9, 1e-7, 1e-5, 3e-3, 5.0, 3e4, -4e5):
        y = rng.uniform(-1.0, 1.0, g) * abs(amax)
        y[rng.integers(g)] = amax
        out.append(y.astype(np.float32).view(np.uint32))
    return out


def _reference(xs: list[int], qmin: int, qmax: int) -> tuple[list[Fraction | None], int]:
    """Every candidate's exact binary64 error (None: skipped, infinite) and the chosen index."""
    errs: list[Fraction | None] = []
    for s in candidate_scales_reference(xs, qmin, qmax):
        if s is None:
            errs.append(None)
            continue
        sv = decode_binary(s, BINARY16)
        codes = [min(max(round(decode_binary(w, BINARY32) / sv), qmin), qmax) for w in xs]
        errs.append(group_error_reference(xs, s, codes))
    best = min(e for e in errs if e is not None)
    return errs, errs.index(best)


@pytest.mark.parametrize("fmt", SCREENED)
def test_screen_errors_keep_the_bound_and_its_choices_are_the_reference(fmt: str) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None
    bmax = max(f.qmax, -f.qmin)
    default = kernel.kernel_path()
    decided = dict.fromkeys(PATHS, 0)
    try:
        for grp in _groups(fmt):  # the reference once per group, every path against it
            xs = [int(w) for w in grp]
            errs, best = _reference(xs, f.qmin, f.qmax)
            delta = Fraction(16 * (bmax + 1) + 2 * (len(xs) + 3), 2**24)
            for path in PATHS:
                kernel.kernel_path(path)
                out = np.empty(16, np.float32)
                chosen = kernel.screen_errors(grp, f.qmin, f.qmax, out)
                for j, e in enumerate(errs):
                    if e is None:  # an infinite candidate: its lane searches candidate 0's
                        continue
                    assert abs(Fraction(float(out[j])) - e) <= delta * e + ETA, (path, j, xs)
                if chosen >= 0:
                    decided[path] += 1
                    assert chosen == best, (path, xs)
    finally:
        kernel.kernel_path(default)
    assert min(decided.values()) > 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", SCREENED)
def test_the_screen_decides_almost_every_gaussian_group(fmt: str, path: str) -> None:
    f = FORMATS[fmt]
    assert f.group_size is not None and f.qmin is not None and f.qmax is not None
    rng = np.random.default_rng(16)
    default = kernel.kernel_path()
    kernel.kernel_path(path)
    try:
        out = np.empty(16, np.float32)
        x = (rng.standard_normal((2000, f.group_size)) * 0.02).astype(np.float32)
        decided = sum(
            kernel.screen_errors(row.view(np.uint32), f.qmin, f.qmax, out) >= 0 for row in x
        )
    finally:
        kernel.kernel_path(default)
    assert decided >= 0.97 * len(x)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S"])
@pytest.mark.parametrize("source", ["BF16", "F16", "F32"])
def test_encode_rows_writes_the_same_bytes_with_and_without_the_screen(
    fmt: str, source: str, path: str
) -> None:
    f = FORMATS[fmt]
    assert f.group_size is not None and f.qmin is not None and f.qmax is not None
    g = f.group_size
    rng = np.random.default_rng(1616)
    x = (rng.standard_normal((64, 8 * g + 5)) * 0.02).astype(np.float32)
    x[0] = np.concatenate([_near_half_integers(rng, g, f.qmin, f.qmax).view(np.float32)] * 8
                          + [x[0, :5]])  # fmt: skip
    words: np.ndarray
    if source == "BF16":
        words, src = (x.view(np.uint32) >> 16).astype(np.uint16), 0
    elif source == "F16":
        words, src = x.astype(np.float16).view(np.uint16), 2
    else:
        words, src = x.view(np.uint32), 1
    n, k = words.shape
    ng = -(-k // g)
    default, screened = kernel.kernel_path(), kernel.screen()
    kernel.kernel_path(path)
    out = []
    try:
        for flag in (True, False):
            kernel.screen(flag)
            codes, scales = np.empty((n, k), np.int8), np.empty((n, ng), np.uint16)
            assert kernel.encode_rows(words, src, n, k, g, f.qmin, f.qmax, codes, scales) is None
            out.append((codes.tobytes(), scales.tobytes()))
    finally:
        kernel.kernel_path(default)
        kernel.screen(screened)
    assert out[0] == out[1]


def test_screen_errors_checks_its_arguments() -> None:
    out = np.empty(16, np.float32)
    with pytest.raises(ValueError, match="must not be all zero"):
        kernel.screen_errors(np.zeros(64, np.uint32), -8, 7, out)
    with pytest.raises(ValueError, match="values must be finite"):
        kernel.screen_errors(np.full(64, 0x7F800000, np.uint32), -8, 7, out)
    with pytest.raises(ValueError, match="16 float32 outputs"):
        kernel.screen_errors(np.ones(64, np.uint32), -8, 7, np.empty(8, np.float32))
    with pytest.raises(ValueError, match="1 to 1024"):
        kernel.screen_errors(np.ones(1025, np.uint32), -8, 7, out)
    with pytest.raises(ValueError, match="qmin"):
        kernel.screen_errors(np.ones(64, np.uint32), 0, 7, out)


def _f32_at_most(v: Fraction) -> np.float32:
    """The largest float32 <= v (v >= 0)."""
    f = np.float32(float(v))
    while Fraction(float(f)) > v:
        f = np.nextafter(f, np.float32(0))
    return f


@pytest.mark.parametrize("bmax", [8, 16, 32, 127])
@pytest.mark.parametrize("n", [1, 32, 64, 1024])
def test_the_rule_keeps_every_lane_within_the_documented_margin(bmax: int, n: int) -> None:
    # A lane is ruled out only where F_j > eta + (F_min + eta) (1 + delta)(1 + gamma) /
    # ((1 - delta)(1 - gamma)) (docs/encoder-profiles.md, "The binary32 screen"): at that bound
    # a lane of another scale must survive (no choice, -1); at three times the margin it must
    # not (the rule's own margin is about twice the bound's: room for its roundings).
    delta = Fraction(16 * (bmax + 1) + 2 * (n + 3), 2**24)
    gamma = Fraction(1, 2**40)
    ratio = (1 + delta) * (1 + gamma) / ((1 - delta) * (1 - gamma))
    a, b, c = 0x2000, 0x2001, 0x3C00  # three distinct scale words
    for fmin in (0.0, 1e-30, 3e-7, 1.0, 12345.0):
        f0 = Fraction(float(np.float32(fmin)))
        edge = ETA + (f0 + ETA) * ratio
        f = np.full(16, 1e30, np.float32)
        s = np.full(16, c, np.uint16)
        f[0], s[0] = np.float32(fmin), a
        f[1], s[1] = _f32_at_most(edge), b
        assert kernel.screen_rule(f, s, n, bmax) == -1, (fmin, float(edge))
        f[1] = np.float32(float(f0 + 3 * (edge - f0) + ETA))
        assert kernel.screen_rule(f, s, n, bmax) == 0, fmin
        # Survivors of one scale: the first of them is chosen, not the smallest F.
        f[1], s[1] = _f32_at_most(edge), a
        assert kernel.screen_rule(f, s, n, bmax) == 0
        f[0], f[1] = f[1], f[0]
        assert kernel.screen_rule(f, s, n, bmax) == 0
