"""The C kernel's candidate search multiplies by RN64(1 / s) instead of dividing by s
(_msekernel.c explains why no error sum changes), on three vector paths (8-lane AVX-512 where
the CPU has x86-64-v4, 4-lane AVX2, 4-lane baseline SSE2, each with its own way of rounding and
clamping a code); every test here runs on each path this CPU has.  The
cases that argument is about: values exactly on a half-integer multiple of a scale (the code
may land on either neighbour, the error must not change), one binary32 step either side of
it, and the clamp boundaries, for normal and subnormal binary16 scales; each error sum must
be the exact reference's."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mse_kernel_fixtures import kernel, kernel_paths

from ninfer_convert.encoder import host
from ninfer_convert.encoder.corpus import mse_boundary_corpus
from ninfer_convert.encoder.mse_reference import group_error_reference
from ninfer_convert.encoder.oracle import BINARY16, BINARY32, decode_binary
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_V1

pytestmark = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


PATHS = kernel_paths()


def _on_path(name: str) -> str:
    """Select the path ``name``; returns the path to restore."""
    default = str(kernel.kernel_path())
    kernel.kernel_path(name)
    return default


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
@given(
    _SCALES,
    st.lists(_SCALES, max_size=6),
    st.sampled_from(GROUPED),
    st.randoms(),
    st.sampled_from(PATHS or ["sse2"]),
)
def test_error_sums_at_code_ties_and_clamp_edges_are_the_reference_ones(
    s: int, others: list[int], fmt: str, rnd: object, path: str
) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None and f.group_size is not None
    pool = _ties_and_neighbours(s, f.qmin, f.qmax)
    xs = [pool[rnd.randrange(len(pool))] for _ in range(f.group_size)]  # type: ignore[attr-defined]
    scales = [s, *others]
    out = np.empty(len(scales), np.float64)
    default = _on_path(path)
    try:
        kernel.group_errors(
            np.asarray(xs, np.uint32), np.asarray(scales, np.uint16), f.qmin, f.qmax, out
        )
    finally:
        kernel.kernel_path(default)
    for j, sc in enumerate(scales):
        want = group_error_reference(xs, sc, _nearest(xs, sc, f.qmin, f.qmax))
        assert Fraction(float(out[j])) == want, f"scale {sc:#06x}"


def _native(words: np.ndarray, fmt: str) -> tuple[bytes, bytes]:
    f = FORMATS[fmt]
    assert f.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // f.group_size)), dtype=np.uint16)
    host.encode_rows(words, "F32", f, 0, codes, scales, "t", profile=MSE_F16_SEARCH_V1)
    return codes.tobytes(), scales.tobytes()


@pytest.mark.parametrize("fmt", GROUPED)
def test_every_vector_path_writes_the_same_bytes(fmt: str) -> None:
    rng = np.random.default_rng(11)
    cases = [w for _, w in mse_boundary_corpus(FORMATS[fmt])]
    cases.append((rng.standard_normal((16, 700)).astype(np.float32) * 0.02).view(np.uint32))
    results = []
    for name in PATHS:
        default = _on_path(name)
        try:
            results.append([_native(w, fmt) for w in cases])
        finally:
            kernel.kernel_path(default)
    assert len(results) == len(PATHS) and all(r == results[0] for r in results)


def test_kernel_path_refuses_unknown_names_and_keeps_the_current_path() -> None:
    before = kernel.kernel_path()
    with pytest.raises(ValueError, match="kernel_path: avx512, avx2 or sse2"):
        kernel.kernel_path("avx1024")
    assert kernel.kernel_path() == before


def test_the_default_path_is_the_widest_this_cpu_runs() -> None:
    assert kernel.kernel_path() == PATHS[-1]
