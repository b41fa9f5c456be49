"""MSE_F16_SEARCH_V1's fast backends bit for bit against the exact reference: the C kernel
(ninfer_convert/_msekernel.c, unweighted and with per-column weights) and the float64 torch
backend (CPU here; CUDA tests skip without a GPU).

The C tests are skipped when the kernel was not built (no C compiler); CI sets
NINFER_REQUIRE_NATIVE=1, where a missing kernel is an import error instead (tested below).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from mse_kernel_fixtures import kernel_paths
from parity import assert_same_encoding

from ninfer_convert import encode_grouped_words
from ninfer_convert.derive.fused import encode_pack_grouped
from ninfer_convert.encoder import host
from ninfer_convert.encoder.common import to_f32
from ninfer_convert.encoder.corpus import failing_corpus, mse_boundary_corpus
from ninfer_convert.encoder.mse_reference import (
    _add,
    _dyadic16,
    _dyadic32,
    _rne64,
    candidate_scales_reference,
    group_error_reference,
)
from ninfer_convert.encoder.oracle import BINARY16, BINARY32, decode_binary
from ninfer_convert.errors import EncodeError, UsageError
from ninfer_convert.formats import FORMATS, MSE_F16_SEARCH_V1, NumericFormat
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.native import optional_module

ROOT = Path(__file__).resolve().parents[1]
KERNEL_C = ROOT / "ninfer_convert" / "_msekernel.c"
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
MSE = MSE_F16_SEARCH_V1
kernel = optional_module("_msekernel")
native = pytest.mark.skipif(kernel is None, reason="C MSE kernel not built")


def _reference(words: np.ndarray, source: str, fmt: str) -> GroupedCodes:
    return encode_grouped_words(words, source, fmt, backend="oracle", profile=MSE)


@functools.cache
def _corpus(fmt: str) -> list[tuple[str, np.ndarray, GroupedCodes]]:
    """The profile's boundary corpus with its reference encoding, computed once per format
    (the exact reference takes seconds; the C, torch CPU and CUDA tests share it)."""
    return [(case, w, _reference(w, "F32", fmt)) for case, w in mse_boundary_corpus(FORMATS[fmt])]


def _native(
    words: np.ndarray, source: str, fmt: str, weights: np.ndarray | None = None
) -> GroupedCodes:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    n, k = words.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // entry.group_size)), dtype=np.uint16)
    host.encode_rows_mse_native(words, source, entry, 0, codes, scales, "t", weights)
    return GroupedCodes(codes=codes, scales=scales)


def _torch(words: np.ndarray, source: str, fmt: str, device: str = "cpu") -> GroupedCodes:
    return encode_grouped_words(words, source, fmt, backend="torch", device=device, profile=MSE)


def _group_size(fmt: str) -> int:
    g = FORMATS[fmt].group_size
    assert g is not None
    return g


_MAGS = st.integers(-140, 14)


@st.composite
def _matrices(draw: st.DrawFn) -> tuple[np.ndarray, str]:
    """BF16, binary16 or binary32 words, finite, 1-3 rows, 1-150 columns (partial groups),
    magnitudes from binary32 subnormals to 2^16."""
    source = draw(st.sampled_from(["F32", "BF16", "F16"]))
    n = draw(st.integers(1, 3))
    k = draw(st.integers(1, 150))
    if source == "F32":
        x = draw(hnp.arrays(np.float32, (n, k), elements=st.floats(-4, 4, width=32)))
        x = x * np.float32(2.0) ** np.float32(draw(_MAGS))
        return np.ascontiguousarray(x.astype(np.float32)).view(np.uint32), source
    words = draw(hnp.arrays(np.uint16, (n, k)))
    if source == "BF16":  # exponent field folded into [0, 140]: finite, below 2^14, subnormals
        exp = ((words >> np.uint16(7)) & np.uint16(0xFF)) % np.uint16(141)
        words = (words & np.uint16(0x807F)) | (exp << np.uint16(7))
    else:  # every finite binary16 value
        words[(words & np.uint16(0x7C00)) == np.uint16(0x7C00)] &= np.uint16(0x8FFF)
    return words.astype(np.uint16), source


# --- a weighted reference, private to this file (exact: dyadic integers, like mse_reference) ---


def _weighted_error(
    x_words: list[int], scale16: int, codes: list[int], w_words: list[int]
) -> Fraction:
    """acc = +0; for i in order: d = RN64(x - s q), t = RN64(d d), u = RN64(w t),
    acc = RN64(acc + u)."""
    sm, se = _dyadic16(scale16)
    acc = (0, 0)
    for xw, q, ww in zip(x_words, codes, w_words, strict=True):
        d = _rne64(*_add(_dyadic32(xw), (-sm * q, se)))
        t = _rne64(d[0] * d[0], 2 * d[1])
        wm, we = _dyadic32(ww)
        u = _rne64(wm * t[0], we + t[1])
        acc = _rne64(*_add(acc, u))
    return Fraction(acc[0]) * Fraction(2) ** acc[1]


def _nearest_codes(x_words: list[int], scale16: int, qmin: int, qmax: int) -> list[int]:
    s = decode_binary(scale16, BINARY16)
    return [min(max(round(decode_binary(w, BINARY32) / s), qmin), qmax) for w in x_words]


def _weighted_group(
    x_words: list[int], w_words: list[int], qmin: int, qmax: int
) -> tuple[int, list[int]]:
    if max(w & 0x7FFFFFFF for w in x_words) == 0:
        return 0, [0] * len(x_words)
    best: tuple[Fraction, int, list[int]] | None = None
    for scale in candidate_scales_reference(x_words, qmin, qmax):
        if scale is None:
            continue
        codes = _nearest_codes(x_words, scale, qmin, qmax)
        err = _weighted_error(x_words, scale, codes, w_words)
        if best is None or err < best[0]:
            best = (err, scale, codes)
    assert best is not None
    return best[1], best[2]


def _weighted_reference(x32: np.ndarray, w32: np.ndarray, fmt: NumericFormat) -> GroupedCodes:
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = x32.shape
    codes = np.zeros((n, k), np.int8)
    scales = np.zeros((n, -(-k // g)), np.uint16)
    for r in range(n):
        for gi, a in enumerate(range(0, k, g)):
            b = min(k, a + g)
            xs = [int(v) for v in x32[r, a:b]]
            ws = [int(v) for v in w32[a:b]]
            scales[r, gi], codes[r, a:b] = _weighted_group(xs, ws, fmt.qmin, fmt.qmax)
    return GroupedCodes(codes=codes, scales=scales)


def test_weighted_reference_with_unit_weights_is_the_profile() -> None:
    # The test's own reference must agree with the product's where the weights are all 1.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 70)).astype(np.float32).view(np.uint32)
    ones = np.ones(70, np.float32).view(np.uint32)
    for fmt in GROUPED:
        got = _weighted_reference(x, ones, FORMATS[fmt])
        assert_same_encoding(_reference(x, "F32", fmt), got, _group_size(fmt), fmt)


# --- the C kernel: unweighted -----------------------------------------------------------------


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_native_matches_reference_on_the_boundary_corpus(fmt: str) -> None:
    for case, words, want in _corpus(fmt):
        assert_same_encoding(want, _native(words, "F32", fmt),
                             _group_size(fmt), f"{fmt} {case}")  # fmt: skip


@native
@given(_matrices(), st.sampled_from(GROUPED))
def test_native_matches_reference_on_generated_matrices(
    m: tuple[np.ndarray, str], fmt: str
) -> None:
    words, source = m
    want = _reference(words, source, fmt)
    assert_same_encoding(want, _native(words, source, fmt), _group_size(fmt), source)


@native
@given(hnp.arrays(np.float32, 64, elements=st.floats(-1e4, 1e4, width=32)),
       st.lists(st.integers(1, 0x7BFF), min_size=1, max_size=20),
       st.sampled_from(GROUPED))  # fmt: skip
def test_native_group_errors_are_the_sequential_binary64_sums(
    x: np.ndarray, scale_words: list[int], fmt: str
) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None and kernel is not None
    xw = np.ascontiguousarray(x).view(np.uint32)
    scales = np.asarray(scale_words, np.uint16)
    out = np.empty(len(scale_words), np.float64)
    kernel.group_errors(xw, scales, f.qmin, f.qmax, out)
    xs = [int(v) for v in xw]
    for j, s in enumerate(scale_words):
        want = group_error_reference(xs, s, _nearest_codes(xs, s, f.qmin, f.qmax))
        assert Fraction(float(out[j])) == want, f"scale {s:#06x}"


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_native_refusals_are_the_numpy_ones(fmt: str) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    for case, words, _, _ in failing_corpus(entry):
        n, k = words.shape
        msgs = []
        for kern in ("native", "numpy"):
            codes = np.empty((n, k), np.int8)
            scales = np.empty((n, -(-k // entry.group_size)), np.uint16)
            with pytest.raises(EncodeError) as exc:
                host.encode_rows(words, "F32", entry, 5, codes, scales, "t", kern, profile=MSE)
            msgs.append(str(exc.value))
        assert msgs[0] == msgs[1], case


@native
def test_native_refusal_of_a_block_with_both_kinds_is_the_numpy_one() -> None:
    # Row 0 overflows binary16 (canonical scale), row 1 has a NaN: numpy reports the NaN first
    # within a piece; the C kernel would meet the overflow first, so the message must still be
    # the numpy one.
    words = np.ones((2, 64), np.float32)
    words[0, 3] = 65520.0 * 8
    words[1, 9] = np.nan
    entry = FORMATS["Q4G64_F16S"]
    msgs = []
    for kern in ("native", "numpy"):
        codes, scales = np.empty((2, 64), np.int8), np.empty((2, 1), np.uint16)
        with pytest.raises(EncodeError) as exc:
            host.encode_rows(words.view(np.uint32), "F32", entry, 0, codes, scales, "w", kern,
                             profile=MSE)  # fmt: skip
        msgs.append(str(exc.value))
    assert msgs[0] == msgs[1]
    assert "non-finite source value" in msgs[0] and "row 1, column 9" in msgs[0]


@native
def test_native_reads_unaligned_input() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 100)).astype(np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)
    raw = np.frombuffer(b"\0" + words.tobytes(), np.uint8)[1:]  # BF16 words at an odd address
    odd = np.ndarray((3, 100), np.uint16, buffer=raw.data)
    assert odd.ctypes.data % 2 == 1
    assert_same_encoding(_native(words, "BF16", "Q4G64_F16S"), _native(odd, "BF16", "Q4G64_F16S"),
                         64, "unaligned")  # fmt: skip


@native
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((3, 1, 64, 64, -8, 7), "source 0 (BF16), 1 (binary32) or 2 (binary16)"),
        ((0, 1, 64, 0, -8, 7), "group >= 1"),
        ((0, 1, 64, 64, 0, 7), "-128 <= qmin < 0 < qmax <= 127"),
        ((0, 1, 64, 64, -8, 128), "-128 <= qmin < 0 < qmax <= 127"),
        ((0, 2, 64, 64, -8, 7), "inconsistent buffer sizes"),
    ],
)
def test_native_checks_its_arguments(args: tuple[int, ...], needle: str) -> None:
    assert kernel is not None
    source, n, k, group, qmin, qmax = args
    w = np.zeros(64, np.uint16)
    codes, scales = np.empty(64, np.int8), np.empty(1, np.uint16)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        kernel.encode_rows(w, source, n, k, group, qmin, qmax, codes, scales)


def _binary16_boundaries() -> np.ndarray:
    """Every positive binary16 value, every midpoint between neighbours (the ties), and the
    binary64 values just below and above each midpoint, up to and beyond 65520."""
    v = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    up = np.append(v[1:], 65536.0)
    mid = (v + up) / 2  # exact: neighbours differ by one binary16 quantum
    out = np.concatenate([v, mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf), [1e300]])
    return np.ascontiguousarray(out)


@native
@pytest.mark.parametrize("lanes", [1, 4])
def test_native_binary16_rounding_of_candidates_is_round_to_nearest_even(lanes: int) -> None:
    assert kernel is not None
    v = _binary16_boundaries()
    got = np.empty(v.size, np.uint16)
    kernel.f64_to_f16_words(v, got, lanes)
    with np.errstate(over="ignore"):  # the values at and above 65520 round to +inf
        want = v.astype(np.float16).view(np.uint16)  # numpy rounds binary64 to binary16 once
    assert got.tobytes() == want.tobytes()


@native
def test_native_four_lane_widening_of_every_finite_binary16_word_is_exact() -> None:
    assert kernel is not None
    words = np.arange(0, 0x7C00, dtype=np.uint16)
    got = np.empty(words.size, np.float64)
    kernel.f16_to_f64_words(words, got)
    want = words.view(np.float16).astype(np.float64)  # exact widening
    assert got.view(np.uint64).tobytes() == want.view(np.uint64).tobytes()


def _exact_ties(fmt: str) -> tuple[np.ndarray, list[int]]:
    """Groups, one per scale word s (not powers of two), holding exact ties (m + 1/2) * s whose
    reciprocal is not a power of two, plus clipped values: a backend that multiplies by
    RN64(1/s) instead of dividing moves some of them off the tie, so its codes and errors
    differ.  Returns (binary32 words of [len(scales), G], scale words)."""
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None and f.group_size is not None
    rng = np.random.default_rng(1)
    scales = [int(w) for w in rng.integers(0x0400, 0x5000, 40, dtype=np.uint16)]
    # qmax * s, so that s is candidate 0; exact multiples of s, so that s wins the search; and
    # four ties that round half to even both ways (-3.5 -> -4, -2.5 -> -2, 1.5 -> 2, 2.5 -> 2).
    multiples = np.resize(np.arange(f.qmin + 1, f.qmax), f.group_size - 5)
    halves = np.concatenate([[f.qmax, -3.5, -2.5, 1.5, 2.5], multiples])
    rows = []
    for w in scales:
        s = float(np.array([w], np.uint16).view(np.float16)[0])
        row = np.resize(halves, f.group_size) * s  # exact: 11-bit s times a short odd / 2
        rows.append(row.astype(np.float32))
    return np.stack(rows).view(np.uint32), scales


@native
@pytest.mark.parametrize("fmt", GROUPED)
def test_native_codes_at_exact_ties_round_half_to_even(fmt: str) -> None:
    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None and kernel is not None
    x, scales = _exact_ties(fmt)
    want = _reference(x, "F32", fmt)
    default = kernel.kernel_path()
    try:  # every path: each has its own check for a tie in a vector of 8 or 4 codes
        for path in kernel_paths():
            kernel.kernel_path(path)
            got = _native(x, "F32", fmt)
            assert_same_encoding(want, got, _group_size(fmt), f"ties, {path} path")
            assert (got.scales[:, 0] == np.array(scales, np.uint16)).all()  # ties were coded
    finally:
        kernel.kernel_path(default)
    out = np.empty(1, np.float64)
    for row, s in zip(x, scales, strict=True):
        kernel.group_errors(row, np.array([s], np.uint16), f.qmin, f.qmax, out)
        xs = [int(v) for v in row]
        assert Fraction(float(out[0])) == group_error_reference(
            xs, s, _nearest_codes(xs, s, f.qmin, f.qmax)
        ), f"scale {s:#06x}"


# --- the C kernel: weighted -------------------------------------------------------------------


def _weights(rng: np.random.Generator, k: int) -> np.ndarray:
    """Binary32 weight words: typical activations statistics, plus zeros, subnormals, -0 and
    huge values, so that the weighted choice differs from the unweighted one."""
    w = (rng.standard_normal(k) ** 2).astype(np.float32)
    special = np.array([0.0, -0.0, 2.0**-149, 2.0**-126, 3e38, 1.0], np.float32)
    w[: min(k, 6)] = special[: min(k, 6)]
    return rng.permutation(w).view(np.uint32)


@native
@pytest.mark.parametrize("fmt", ["Q4G64_F16S", "W8G32_F16S"])  # both group sizes; all four below
def test_weighted_native_matches_the_weighted_reference_on_the_corpus(fmt: str) -> None:
    rng = np.random.default_rng(16)
    entry = FORMATS[fmt]
    changed = False
    for case, words in mse_boundary_corpus(entry):
        w = _weights(rng, words.shape[1])
        got = _native(words, "F32", fmt, weights=w)
        assert_same_encoding(_weighted_reference(words, w, entry), got, _group_size(fmt), case)
        changed |= got.scales.tobytes() != _native(words, "F32", fmt).scales.tobytes()
    assert changed  # the weights really changed some choice


@native
@settings(max_examples=40)
@given(_matrices(), st.sampled_from(GROUPED), st.integers(0, 2**32 - 1))
def test_weighted_native_matches_the_weighted_reference_on_generated_matrices(
    m: tuple[np.ndarray, str], fmt: str, seed: int
) -> None:
    words, source = m
    w = _weights(np.random.default_rng(seed), words.shape[1])
    x32 = to_f32(words, source).view(np.uint32)
    want = _weighted_reference(x32, w, FORMATS[fmt])
    assert_same_encoding(want, _native(words, source, fmt, weights=w), _group_size(fmt), source)


@native
@given(hnp.arrays(np.float32, 32, elements=st.floats(-1e4, 1e4, width=32)),
       hnp.arrays(np.float32, 32, elements=st.floats(0, 2.0**100, width=32)),
       st.lists(st.integers(1, 0x7BFF), min_size=1, max_size=20))  # fmt: skip
def test_weighted_group_errors_are_the_documented_sums(
    x: np.ndarray, w: np.ndarray, scale_words: list[int]
) -> None:
    assert kernel is not None
    xw, ww = np.ascontiguousarray(x).view(np.uint32), np.ascontiguousarray(w).view(np.uint32)
    out = np.empty(len(scale_words), np.float64)
    kernel.group_errors(xw, np.asarray(scale_words, np.uint16), -127, 127, out, ww)
    xs, ws = [int(v) for v in xw], [int(v) for v in ww]
    for j, s in enumerate(scale_words):
        want = _weighted_error(xs, s, _nearest_codes(xs, s, -127, 127), ws)
        assert Fraction(float(out[j])) == want


@native
def test_unit_weights_give_the_unweighted_words() -> None:
    rng = np.random.default_rng(2)
    words = rng.standard_normal((9, 200)).astype(np.float32).view(np.uint32)
    ones = np.ones(200, np.float32).view(np.uint32)
    for fmt in GROUPED:
        a, b = _native(words, "F32", fmt), _native(words, "F32", fmt, weights=ones)
        assert_same_encoding(a, b, _group_size(fmt), fmt)


@native
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, -(2.0**-149)])
def test_weights_must_be_finite_and_not_negative(bad: float) -> None:
    w = np.ones(64, np.float32)
    w[7] = bad
    with pytest.raises(ValueError, match="finite binary32 word >= 0"):
        _native(np.ones((1, 64), np.float32).view(np.uint32), "F32", "Q4G64_F16S",
                weights=w.view(np.uint32))  # fmt: skip
    with pytest.raises(ValueError, match="k binary32 words"):
        _native(np.ones((1, 64), np.float32).view(np.uint32), "F32", "Q4G64_F16S",
                weights=np.ones(63, np.float32).view(np.uint32))  # fmt: skip


# --- wiring: host dispatch, fused paths, threads ----------------------------------------------


@native
@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("source", ["BF16", "F16", "F32"])
def test_fused_native_and_numpy_paths_write_the_same_planes(fmt: str, source: str) -> None:
    rng = np.random.default_rng(len(fmt))
    x = rng.standard_normal((23, 190)).astype(np.float32)
    if source == "BF16":
        words = (x.view(np.uint32) >> 16).astype(np.uint16)
    elif source == "F16":
        words = x.astype(np.float16).view(np.uint16)
    else:
        words = x.view(np.uint32)
    planes = {
        kern: encode_pack_grouped(
            words, source, fmt, threads=2, chunk_elements=3 * 190, kernel=kern, profile=MSE
        )
        for kern in ("native", "numpy")
    }
    assert [p.tobytes() for p in planes["native"]] == [p.tobytes() for p in planes["numpy"]]


def test_host_uses_numpy_when_the_kernel_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(8)
    words = rng.standard_normal((4, 130)).astype(np.float32).view(np.uint32)
    entry = FORMATS["Q6G64_F16S"]
    monkeypatch.setattr(host, "_native_mse", None)
    assert not host.native_mse_available()
    codes, scales = np.empty((4, 130), np.int8), np.empty((4, 3), np.uint16)
    host.encode_rows(words, "F32", entry, 0, codes, scales, "t", "native", profile=MSE)
    assert_same_encoding(_reference(words, "F32", "Q6G64_F16S"), GroupedCodes(codes, scales), 64)


def test_require_native_fails_when_the_kernel_is_missing() -> None:
    code = (
        "import sys\n"
        "sys.modules['ninfer_convert._msekernel'] = None\n"  # an import of it now fails
        "try:\n"
        "    import ninfer_convert.encoder.host\n"
        "except ImportError as exc:\n"
        "    print('ImportError', exc)\n"
    )
    env = {**os.environ, "NINFER_REQUIRE_NATIVE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ImportError NINFER_REQUIRE_NATIVE=1 but the C module _msekernel" in proc.stdout


# --- the build: IEEE flags, no FMA --------------------------------------------------------------

COMPILER = shutil.which("gcc") or shutil.which("cc")


@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
@pytest.mark.parametrize(
    "flags",
    [["-ffast-math"], ["-freciprocal-math"],
     ["-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]],
)  # fmt: skip
def test_kernel_refuses_to_build_without_ieee_arithmetic(flags: list[str]) -> None:
    assert COMPILER is not None
    include = sysconfig.get_paths()["include"]
    cmd = [COMPILER, "-fsyntax-only", "-std=c99", f"-I{include}", *flags, str(KERNEL_C)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "_msekernel needs IEEE arithmetic" in proc.stderr


@native
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
def test_built_kernel_contains_no_fused_multiply_add() -> None:
    # Outside the binary32 screen (functions screen_*, whose results are bounded, not exact:
    # docs/encoder-profiles.md "The binary32 screen"), no FMA at all; inside it, binary32 ones
    # only (packed single, "ps"), where the C source asks for them.
    assert kernel is not None and kernel.__file__ is not None
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", kernel.__file__],
                         capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert "divpd" in asm  # the disassembly is real, and the vector loop is there
    fused: list[tuple[str, str]] = []
    func = ""
    for line in asm.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            func = head.group(1)
        elif line.startswith(" ") and "\t" in line and len(line.split()) > 1:
            op = line.split()[1]
            if op.startswith(("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")):
                fused.append((func, op))
    assert [(f, op) for f, op in fused if not (f.startswith("screen_") and op.endswith("ps"))] == []
    assert any(f.startswith("screen_avx512") for f, _ in fused) or not fused


# --- torch (float64), CPU and CUDA --------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("fmt", GROUPED)
def test_torch_cpu_matches_reference_on_the_boundary_corpus(fmt: str) -> None:
    for case, words, want in _corpus(fmt):
        assert_same_encoding(want, _torch(words, "F32", fmt),
                             _group_size(fmt), f"{fmt} {case}")  # fmt: skip


@settings(max_examples=40)
@given(_matrices(), st.sampled_from(GROUPED))
def test_torch_cpu_matches_reference_on_generated_matrices(
    m: tuple[np.ndarray, str], fmt: str
) -> None:
    words, source = m
    assert_same_encoding(_reference(words, source, fmt), _torch(words, source, fmt),
                         _group_size(fmt), source)  # fmt: skip


def test_torch_float64_to_binary16_is_one_rounding() -> None:
    # torch's own float64 -> float16 cast goes through binary32: 1 + 2^-11 + 2^-40 is above the
    # binary16 tie 1 + 2^-11 but rounds to it in binary32, so the cast rounds down to 1.0; the
    # single rounding goes up to 1 + 2^-10.
    from ninfer_convert.encoder.torch_backend import _f64_to_f16_words

    v = torch.tensor([1 + 2.0**-11 + 2.0**-40, 2.0**-25, 2.0**-25 + 2.0**-60, 65519.99, 65520.0],
                     dtype=torch.float64)  # fmt: skip
    assert _f64_to_f16_words(v).tolist() == [0x3C01, 0x0000, 0x0001, 0x7BFF, 0x7C00]
    assert int(v[:1].to(torch.float16).view(torch.int16)) == 0x3C00  # the double rounding


def test_torch_binary16_rounding_of_candidates_is_round_to_nearest_even() -> None:
    from ninfer_convert.encoder.torch_backend import _f64_to_f16_words

    v = _binary16_boundaries()
    got = _f64_to_f16_words(torch.from_numpy(v)).numpy().astype(np.uint16)
    with np.errstate(over="ignore"):
        want = v.astype(np.float16).view(np.uint16)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("fmt", GROUPED)
def test_torch_codes_at_exact_ties_round_half_to_even(fmt: str) -> None:
    from ninfer_convert.encoder.torch_backend import _mse_codes_errors

    f = FORMATS[fmt]
    assert f.qmin is not None and f.qmax is not None
    x, scales = _exact_ties(fmt)
    xg = torch.from_numpy(x.view(np.float32).astype(np.float64)).unsqueeze(1)  # [m, 1, G]
    sv = torch.from_numpy(np.array(scales, np.uint16).view(np.float16).astype(np.float64))
    q, acc = _mse_codes_errors(xg, sv.reshape(-1, 1, 1), f)
    for r, s in enumerate(scales):
        xs = [int(v) for v in x[r]]
        want = _nearest_codes(xs, s, f.qmin, f.qmax)
        assert q[r, 0].to(torch.int64).tolist() == want, f"scale {s:#06x}"
        assert Fraction(float(acc[r, 0])) == group_error_reference(xs, s, want)


def test_torch_matches_reference_across_chunks() -> None:
    from ninfer_convert.encoder.torch_backend import encode_mse_torch

    rng = np.random.default_rng(9)
    words = (rng.standard_normal((40, 1100)).astype(np.float32).view(np.uint32) >> 16).astype(
        np.uint16
    )
    entry = FORMATS["W8G32_F16S"]
    want = encode_grouped_words(words, "BF16", entry, profile=MSE, threads=1)  # numpy
    got = encode_mse_torch(words, "BF16", entry, chunk_elements=3000)
    assert_same_encoding(want, got, 32, "chunks")


@pytest.mark.parametrize("fmt", GROUPED)
def test_torch_refusals_are_the_numpy_ones(fmt: str) -> None:
    for case, words, _, _ in failing_corpus(FORMATS[fmt]):
        msgs = []
        for backend in ("torch", "numpy"):
            with pytest.raises(EncodeError) as exc:
                encode_grouped_words(words, "F32", fmt, backend=backend, profile=MSE, tensor="t")
            msgs.append(str(exc.value))
        assert msgs[0] == msgs[1], case


def test_unknown_backend_of_the_profile_is_a_usage_error() -> None:
    words = np.ones((1, 64), np.float32).view(np.uint32)
    with pytest.raises(UsageError, match="unknown encoder backend 'gpu'"):
        encode_grouped_words(words, "F32", "Q4G64_F16S", backend="gpu", profile=MSE)


@cuda
@pytest.mark.parametrize("fmt", GROUPED)
def test_torch_cuda_matches_reference_on_the_boundary_corpus(fmt: str) -> None:
    for case, words, want in _corpus(fmt):
        assert_same_encoding(want, _torch(words, "F32", fmt, "cuda"),
                             _group_size(fmt), f"{fmt} {case}")  # fmt: skip


@cuda
@settings(max_examples=40)
@given(_matrices(), st.sampled_from(GROUPED))
def test_torch_cuda_matches_reference_on_generated_matrices(
    m: tuple[np.ndarray, str], fmt: str
) -> None:
    words, source = m
    assert_same_encoding(_reference(words, source, fmt), _torch(words, source, fmt, "cuda"),
                         _group_size(fmt), source)  # fmt: skip


@cuda
def test_torch_cuda_matches_numpy_on_a_large_matrix() -> None:
    rng = np.random.default_rng(10)
    x = rng.standard_normal((512, 4096)).astype(np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)
    for fmt in GROUPED:
        want = encode_grouped_words(words, "BF16", fmt, profile=MSE)
        assert_same_encoding(want, _torch(words, "BF16", fmt, "cuda"), _group_size(fmt), fmt)


# --- convert and verify run the C kernel --------------------------------------------------------


@native
def test_convert_and_verify_encode_the_profile_with_the_c_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recipe_fixtures import RECIPE_HEAD
    from st_helpers import write_safetensors

    from ninfer_convert.convert import convert_checkpoint
    from ninfer_convert.verify import verify_artifact

    calls: list[int] = []

    class Counting:
        def encode_rows(self, *args: object) -> object:
            calls.append(1)
            return kernel.encode_rows(*args)  # type: ignore[union-attr]

    monkeypatch.setattr(host, "_native_mse", Counting())
    src = tmp_path / "src"
    src.mkdir()
    words = (np.random.default_rng(5).standard_normal((24, 200)).astype(np.float32).view(
        np.uint32) >> 16).astype(np.uint16)  # fmt: skip
    write_safetensors(src / "model.safetensors", {"w": ("BF16", words)})
    (src / "config.json").write_text('{"model_type": "llama"}')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        RECIPE_HEAD + f"- match: w\n  format: Q4G64_F16S\n  encoder_profile: {MSE}\n"
        "  role: r\n  evidence: [e1]\n"
    )
    convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", jobs=2)
    converted = len(calls)
    assert converted > 0
    report = verify_artifact(tmp_path / "out", source=src)
    assert report.exit_code == 0 and len(calls) > converted
