"""The C kernel's candidate search multiplies by RN64(1 / s) instead of dividing by s
(_msekernel.c explains why no error sum changes).  The cases that argument is about: values
exactly on a half-integer multiple of a scale (the code may land on either neighbour, the
error must not change), one binary32 step either side of it, and the clamp boundaries, for
normal and subnormal binary16 scales; each error sum must be the exact reference's."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_convert.encoder.mse_reference import group_error_reference
from ninfer_convert.encoder.oracle import BINARY16, BINARY32, decode_binary
from ninfer_convert.formats import FORMATS
from ninfer_convert.native import optional_module

kernel = optional_module("_msekernel")
pytestmark = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _nearest(xs: list[int], s: int, qmin: int, qmax: int) -> list[int]:
    sv = decode_binary(s, BINARY16)
    return [min(max(round(decode_binary(w, BINARY32) / sv), qmin), qmax) for w in xs]


def _ties_and_neighbours(s: int, qmin: int, qmax: int) -> list[int]:
    """binary32 words of h * s for every half-integer h from qmin - 1.5 to qmax + 1.5 (exact:
    an 11-bit significand times a 9-bit odd integer), and the words one step either side."""
    sv = np.float32(float(decode_binary(s, BINARY16)))
    out = []
    for j in range(qmin - 2, qmax + 2):
        x = np.float32(j + 0.5) * sv
        assert Fraction(float(x)) == Fraction(2 * j + 1, 2) * decode_binary(s, BINARY16)
        for v in (x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))):
            out.append(int(np.float32(v).view(np.uint32)))
    return out


_SCALES = st.one_of(st.integers(1, 0x3FF), st.integers(0x400, 0x7BFF))  # subnormal, normal


@settings(max_examples=60, deadline=None)
@given(_SCALES, st.lists(_SCALES, max_size=6), st.sampled_from(GROUPED), st.randoms())
def test_error_sums_at_code_ties_and_clamp_edges_are_the_reference_ones(
    s: int, others: list[int], fmt: str, rnd: object
) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None and f.group_size is not None
    pool = _ties_and_neighbours(s, f.qmin, f.qmax)
    xs = [pool[rnd.randrange(len(pool))] for _ in range(f.group_size)]  # type: ignore[attr-defined]
    scales = [s, *others]
    out = np.empty(len(scales), np.float64)
    kernel.group_errors(
        np.asarray(xs, np.uint32), np.asarray(scales, np.uint16), f.qmin, f.qmax, out
    )
    for j, sc in enumerate(scales):
        want = group_error_reference(xs, sc, _nearest(xs, sc, f.qmin, f.qmax))
        assert Fraction(float(out[j])) == want, f"scale {sc:#06x}"
