"""The C kernel's exact pruning (_msekernel.c, errors_pruned), which the converter runs for the
formats with qmax >= 64 (W8G32_F16S) without weights: candidates 0..7 are searched first, and
candidates 8..13 (the scales that clip the largest value by 9 to 20 %) only where the lower
bound of their errors (the largest value's own term, with the wider clamp bound) is not
strictly above the smallest complete error of the first eight.

The test hook ``pruned_errors`` runs that search on one group for any format, so the rule is
held on the 4-bit formats too, where the clipping candidates often win: every lane it skips
(+inf) must have a reference error strictly above the best complete error of lanes 0..7, and
every lane it searched must have exactly the reference error.  The corpus: the profile's
boundary corpus (ties between candidates, subnormal scales, overflowing candidates), Gaussian
groups, groups with one outlier, groups whose candidates all round to one subnormal word (all
errors equal) and groups whose only nonzero value is the maximum (each error is exactly that
value's term, so the bound equals the error: ties at the bound)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from mse_kernel_fixtures import kernel, kernel_paths

from ninfer_convert.encoder import host
from ninfer_convert.encoder.corpus import mse_boundary_corpus
from ninfer_convert.encoder.mse_reference import (
    candidate_scales_reference,
    encode_mse_reference,
    group_error_reference,
)
from ninfer_convert.encoder.oracle import BINARY16, BINARY32, decode_binary
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_V1

pytestmark = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


PATHS = kernel_paths()


def _groups(fmt: str) -> list[np.ndarray]:
    f = FORMATS[fmt]
    assert f.group_size is not None
    g = f.group_size
    out: list[np.ndarray] = []
    for _, words in mse_boundary_corpus(f):
        for row in words:
            for a in range(0, row.size, g):
                grp = row[a : a + g]
                if grp.size == g and int((grp & 0x7FFFFFFF).max()) != 0:
                    out.append(np.ascontiguousarray(grp))
    out = out[:: max(1, len(out) // 40)]  # about 40 of them: the reference is slow
    rng = np.random.default_rng(1616)
    for _ in range(12):
        out.append((rng.standard_normal(g) * 0.02).astype(np.float32).view(np.uint32))
        x = rng.uniform(-1.0, 1.0, g) * rng.uniform(0.15, 0.5)
        x[rng.integers(g)] = rng.choice([-1.0, 1.0])
        out.append(x.astype(np.float32).view(np.uint32))
    for amax in (1e-10, 3e-9, 1e-7, 1e-5, 3e-3, 0.7, -0.7, 5.0, -37.0):
        x = np.zeros(g)
        x[rng.integers(g)] = amax  # only the maximum: every error is its term
        out.append(x.astype(np.float32).view(np.uint32))
        y = rng.uniform(-1.0, 1.0, g) * abs(amax)
        y[rng.integers(g)] = amax
        out.append(y.astype(np.float32).view(np.uint32))
    return out


def _reference_errors(xs: list[int], qmin: int, qmax: int) -> list[Fraction | None]:
    out: list[Fraction | None] = []
    for s in candidate_scales_reference(xs, qmin, qmax):
        if s is None:
            out.append(None)
            continue
        sv = decode_binary(s, BINARY16)
        codes = [min(max(round(decode_binary(w, BINARY32) / sv), qmin), qmax) for w in xs]
        out.append(group_error_reference(xs, s, codes))
    return out


@pytest.mark.parametrize("path", PATHS[-1:])  # the decision is scalar; the paths are below
@pytest.mark.parametrize("fmt", GROUPED)
def test_only_candidates_strictly_worse_than_a_searched_one_are_skipped(
    fmt: str, path: str
) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None
    skipped = kept_late_winner = 0
    default = kernel.kernel_path()
    kernel.kernel_path(path)
    try:
        for grp in _groups(fmt):
            out = np.empty(16, np.float64)
            kernel.pruned_errors(grp, f.qmin, f.qmax, out)
            xs = [int(w) for w in grp]
            ref = _reference_errors(xs, f.qmin, f.qmax)
            first = [e for e in ref[:8] if e is not None]
            best_first = min(first)
            for j, e in enumerate(ref):
                if e is None:  # an infinite candidate: the kernel's lane is never chosen
                    continue
                if out[j] == np.inf:
                    assert j >= 8 and e > best_first, f"{fmt}: candidate {j} skipped"
                    skipped += 1
                else:
                    assert Fraction(float(out[j])) == e, f"{fmt}: candidate {j}"
            finite = [e for e in ref if e is not None]
            kept_late_winner += ref.index(min(finite)) >= 8
    finally:
        kernel.kernel_path(default)
    # Both sides of the bound are reached: W8 skips (its clipping candidates never won here),
    # the 4-bit formats keep candidates 8..13 where one of them wins.
    if fmt == "W8G32_F16S":
        assert skipped > 0
    if fmt == "Q4G64_F16S":
        assert kept_late_winner > 0


@pytest.mark.parametrize("path", PATHS)
def test_the_converter_prunes_w8_and_writes_the_reference_words(path: str) -> None:
    f = FORMATS["W8G32_F16S"]
    assert f.group_size is not None and f.qmin is not None and f.qmax is not None
    x = np.stack(_groups("W8G32_F16S"))
    want_codes, want_scales = encode_mse_reference(x, f.group_size, f.qmin, f.qmax)
    codes = np.empty(x.shape, np.int8)
    scales = np.empty((x.shape[0], 1), np.uint16)
    default = kernel.kernel_path()
    kernel.kernel_path(path)
    try:
        host.encode_rows(x, "F32", f, 0, codes, scales, "t", profile=MSE_F16_SEARCH_V1)
    finally:
        kernel.kernel_path(default)
    assert scales.tobytes() == want_scales.tobytes()
    assert codes.tobytes() == want_codes.tobytes()


def test_pruned_errors_checks_its_arguments() -> None:
    out = np.empty(16, np.float64)
    with pytest.raises(ValueError, match="must not be all zero"):
        kernel.pruned_errors(np.zeros(32, np.uint32), -127, 127, out)
    with pytest.raises(ValueError, match="values must be finite"):
        kernel.pruned_errors(np.full(32, 0x7F800000, np.uint32), -127, 127, out)
    with pytest.raises(ValueError, match="16 float64 outputs"):
        kernel.pruned_errors(np.ones(32, np.uint32), -127, 127, np.empty(8))
