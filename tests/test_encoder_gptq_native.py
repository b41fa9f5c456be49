"""The C kernel of block-compensated encoding (ninfer_convert/_gptqkernel.c) on its own: bit
for bit the numpy encoder on larger matrices and every block width, the reference on generated
matrices with signed zeros, subnormals, huge values and refusals (the same row, column and
reason), its argument checks (the shared _encode_args.h messages, then its buffers), the
dispatch of encoder/gptq.py (numpy without the module, an ImportError under
NINFER_REQUIRE_NATIVE=1), threads, and a build with IEEE arithmetic and no fused multiply-add.
tests/test_encoder_gptq.py holds both encoders to the reference on the shared corpus."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_encoder_gptq import _to_f32_words, dyadic_factor, identity_factor, random_factor

from ninfer_convert.encoder import gptq
from ninfer_convert.encoder.gptq import encode_compensated
from ninfer_convert.encoder.gptq_reference import (
    BLOCK_UNIT,
    CompensationFailure,
    encode_compensated_reference,
)
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import FORMATS
from ninfer_convert.native import optional_module

ROOT = Path(__file__).resolve().parent.parent
KERNEL_C = ROOT / "ninfer_convert" / "_gptqkernel.c"
kernel = optional_module("_gptqkernel")
mse_kernel = optional_module("_msekernel")
native = pytest.mark.skipif(kernel is None, reason="C compensation kernel not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
OVERFLOWS = "encode_rows: n, k and group give a buffer size that overflows"


def bf16_words(rng: np.random.Generator, n: int, k: int, scale: float) -> np.ndarray:
    x = (rng.standard_normal((n, k)) * scale).astype(np.float32)
    return (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)


def assert_kernels_agree(
    words: np.ndarray, source: str, fmt_name: str, factor: np.ndarray, **kw: object
) -> None:
    """Both encoders, bit for bit: every compensated value, the codes and the scale words."""
    n, k = words.shape
    fmt = FORMATS[fmt_name]
    traces = [np.zeros((n, k)), np.zeros((n, k))]
    a = encode_compensated(words, source, fmt, factor, trace=traces[0], kernel="native", **kw)  # type: ignore[arg-type]
    b = encode_compensated(words, source, fmt, factor, trace=traces[1], kernel="numpy", **kw)  # type: ignore[arg-type]
    assert traces[0].view(np.uint64).tobytes() == traces[1].view(np.uint64).tobytes()
    assert a.scales.tobytes() == b.scales.tobytes()
    assert a.codes.tobytes() == b.codes.tobytes()


# --- parity ------------------------------------------------------------------------------------


@native
@pytest.mark.parametrize("fmt_name", ["Q4G64_F16S", "W8G32_F16S"])
@pytest.mark.parametrize("block", [128, 256, 512, 768])  # 768 >= K: full compensation
def test_kernel_matches_numpy_on_larger_matrices(fmt_name: str, block: int) -> None:
    rng = np.random.default_rng(block)
    n, k = 37, 700  # K: partial last block and group; n: several row tiles and a partial one
    words = bf16_words(rng, n, k, 0.05)
    weights = rng.uniform(0, 4, k).astype(np.float32) if block == 256 else None
    assert_kernels_agree(words, "BF16", fmt_name, random_factor(rng, k, block=block),
                         weights=weights)  # fmt: skip


@native
def test_row_chunks_do_not_change_the_result() -> None:
    rng = np.random.default_rng(2)
    words = bf16_words(rng, 23, 300, 0.1)
    f = random_factor(rng, 300, block=256)
    fmt = FORMATS["Q5G64_F16S"]
    whole = encode_compensated(words, "BF16", fmt, f)
    for chunk in (1, 4, 7, 23):
        part = encode_compensated(words, "BF16", fmt, f, row_chunk=chunk)
        assert part.codes.tobytes() == whole.codes.tobytes()
        assert part.scales.tobytes() == whole.scales.tobytes()


# Source words: ordinary values, signed zeros, subnormals, values near the binary32 maximum
# (whose compensation overflows binary32 or the binary16 scale), and infinities/NaN.
_SPECIAL = [0x0000_0000, 0x8000_0000, 0x0000_0001, 0x8040_0000, 0x0080_0000, 0x7F7F_FFFF,
            0xFF00_0000, 0x7F80_0000, 0x7FC0_0000, 0x4780_0000, 0x4800_0000]  # fmt: skip


@native
@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(GROUPED),
    st.sampled_from(["BF16", "F16", "F32"]),
    st.integers(1, 3),
    st.integers(1, 200),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["random", "dyadic", "extreme"]),
    st.floats(0.0, 0.2),
)
def test_kernel_matches_reference_with_special_values_and_refusals(
    fmt_name: str, source: str, n: int, k: int, seed: int, kind: str, special: float
) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * rng.choice([1e-6, 0.05, 2.0, 3e4])).astype(np.float32)
    u = x.view(np.uint32)
    mask = rng.random((n, k)) < special
    u[mask] = rng.choice(np.array(_SPECIAL, dtype=np.uint32), size=int(mask.sum()))
    if source == "F32":
        words: np.ndarray = u
    elif source == "F16":
        with np.errstate(over="ignore", invalid="ignore"):
            words = x.astype(np.float16).view(np.uint16)
    else:
        words = (u >> np.uint32(16)).astype(np.uint16)
    if kind == "random":
        f = random_factor(rng, k)
    elif kind == "dyadic":
        f = dyadic_factor(rng, k)
    else:  # huge off-diagonal entries and tiny diagonals: binary64 overflow inside a group
        f = identity_factor(k)
        for i in range(k):
            c = i % BLOCK_UNIT
            width = min(BLOCK_UNIT, k - (i - c))
            f[i, c] = np.float32(rng.choice([2.0**-149, 2.0**-20, 1.0]))
            f[i, c + 1 : width] = rng.choice([0.0, 2.0**60, -(2.0**100), 0.5], size=width - c - 1)
    fmt = FORMATS[fmt_name]
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    weights = rng.uniform(0, 4, k).astype(np.float32) if seed % 3 == 0 else None
    x32 = words if source == "F32" else _to_f32_words(words, source)
    want_trace = np.zeros((n, k))
    try:
        codes, scales = encode_compensated_reference(
            x32, f.view(np.uint32), fmt.group_size, fmt.qmin, fmt.qmax, trace=want_trace,
            weights=None if weights is None else weights.view(np.uint32),
        )  # fmt: skip
    except CompensationFailure as exc:
        want = f"row {exc.row}, column {exc.column}: {exc.reason} under error compensation"
        for kern in ("native", "numpy"):
            with pytest.raises(EncodeError) as got:
                encode_compensated(words, source, fmt, f, weights=weights, kernel=kern,
                                   row_chunk=int(rng.integers(1, 4)))  # fmt: skip
            assert want in got.value.message, kern
        return
    got_trace = np.zeros((n, k))
    got = encode_compensated(words, source, fmt, f, weights=weights, trace=got_trace,
                             row_chunk=int(rng.integers(1, 4)))  # fmt: skip
    assert got_trace.view(np.uint64).tobytes() == want_trace.view(np.uint64).tobytes()
    assert got.scales.tobytes() == scales.tobytes()
    assert got.codes.tobytes() == codes.tobytes()


@native
def test_threads_encode_at_once_with_the_same_result() -> None:
    rng = np.random.default_rng(4)
    words = bf16_words(rng, 64, 512, 0.05)
    f = random_factor(rng, 512, block=256)
    fmt = FORMATS["Q4G64_F16S"]
    serial = [encode_compensated(words[r : r + 16], "BF16", fmt, f) for r in range(0, 64, 16)]
    results: dict[int, object] = {}

    def work(i: int) -> None:
        results[i] = encode_compensated(words[16 * i : 16 * i + 16], "BF16", fmt, f)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(serial):
        got = results[i]
        assert isinstance(got, type(want))
        assert got.codes.tobytes() == want.codes.tobytes()
        assert got.scales.tobytes() == want.scales.tobytes()


# --- dispatch ----------------------------------------------------------------------------------


@native
def test_the_kernel_runs_by_default_and_numpy_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> object:
            calls.append(name)
            return getattr(kernel, name)

    monkeypatch.setattr(gptq, "_native", Counting())
    rng = np.random.default_rng(9)
    words = bf16_words(rng, 3, 130, 0.05)
    f = random_factor(rng, 130)
    fmt = FORMATS["Q4G64_F16S"]
    encode_compensated(words, "BF16", fmt, f)
    assert calls.count("group_columns") == 3 and calls.count("group_values") == 3  # 3 groups
    calls.clear()
    encode_compensated(words, "BF16", fmt, f, kernel="numpy")
    gptq.encode_compensated_numpy(words, "BF16", fmt, f)
    assert calls == []


def test_numpy_is_used_when_the_kernel_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    words = bf16_words(rng, 5, 150, 0.05)
    f = random_factor(rng, 150)
    fmt = FORMATS["Q6G64_F16S"]
    want = encode_compensated(words, "BF16", fmt, f, kernel="numpy")
    monkeypatch.setattr(gptq, "_native", None)
    assert not gptq.native_available()
    got = encode_compensated(words, "BF16", fmt, f)
    assert got.codes.tobytes() == want.codes.tobytes()
    assert got.scales.tobytes() == want.scales.tobytes()


def test_unknown_kernel_and_bad_trace_are_refused() -> None:
    words = np.zeros((2, 64), np.uint16)
    f = identity_factor(64)
    fmt = FORMATS["Q4G64_F16S"]
    with pytest.raises(ValueError, match="unknown compensation kernel 'cuda'"):
        encode_compensated(words, "BF16", fmt, f, kernel="cuda")
    for trace in (np.zeros((2, 64), np.float32), np.zeros((2, 65)), np.zeros((64, 2)).T):
        with pytest.raises(ValueError, match="C-contiguous float64 array of shape"):
            encode_compensated(words, "BF16", fmt, f, trace=trace)


def test_require_native_fails_when_the_kernel_is_missing() -> None:
    code = (
        "import sys\n"
        "sys.modules['ninfer_convert._gptqkernel'] = None\n"  # an import of it now fails
        "try:\n"
        "    import ninfer_convert.encoder.gptq\n"
        "except ImportError as exc:\n"
        "    print('ImportError', exc)\n"
    )
    env = {**os.environ, "NINFER_REQUIRE_NATIVE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ImportError NINFER_REQUIRE_NATIVE=1 but the C module _gptqkernel" in proc.stdout


# --- arguments ---------------------------------------------------------------------------------


def _values_args(n: int = 2, k: int = 64, g0: int = 0, group: int = 64) -> list[object]:
    width = max(0, min(group, k - g0))
    return [np.zeros((2, 64)), n, k, g0, group, 7, np.full(2, -1, np.int64), np.zeros(2, np.int8),
            np.zeros((2, width), np.uint32)]  # fmt: skip


def _columns_args(
    n: int = 2, k: int = 64, group: int = 64, qmin: int = -8, qmax: int = 7, block: int = 128
) -> list[object]:
    return [np.zeros((2, 64)), n, k, identity_factor(64).view(np.uint32), block, 0, group, qmin,
            qmax, np.zeros(2, np.uint16), np.zeros((2, 64), np.int8), np.full(2, -1, np.int64),
            np.zeros(2, np.int8)]  # fmt: skip


def _message(fn: object, args: list[object]) -> str:
    assert callable(fn)
    try:
        fn(*args)
    except ValueError as exc:
        return str(exc)
    return "accepted"


def _mse_message(n: int, k: int, group: int, qmin: int, qmax: int) -> str:
    assert mse_kernel is not None
    codes, scales = np.empty(64, np.int8), np.empty(1, np.uint16)
    return _message(mse_kernel.encode_rows, [np.zeros(64, np.uint32), 1, n, k, group, qmin, qmax,
                                             codes, scales])  # fmt: skip


@native
@pytest.mark.skipif(mse_kernel is None, reason="C MSE kernel not built")
@pytest.mark.parametrize(
    ("n", "k", "group", "qmin", "qmax"),
    [(-1, 64, 64, -8, 7), (2, 0, 64, -8, 7), (2, 64, 0, -8, 7), (2, 64, 64, -129, 7),
     (2, 64, 64, 0, 7), (2, 64, 64, -8, 0), (2, 64, 64, -8, 128),
     (2**62, 64, 64, -8, 7), (2**40, 2**40, 64, -8, 7)],
)  # fmt: skip
def test_bad_arguments_get_the_shared_encode_args_messages(
    n: int, k: int, group: int, qmin: int, qmax: int
) -> None:
    want = _mse_message(n, k, group, qmin, qmax)
    assert want.startswith(("encode_rows: need ", OVERFLOWS)), want
    assert kernel is not None
    assert _message(kernel.group_columns, _columns_args(n, k, group, qmin, qmax)) == want
    if -128 <= qmin < 0:  # group_values takes no qmin, only the other arguments
        args = _values_args(n, k, 0, group)
        args[5] = qmax
        assert _message(kernel.group_values, args) == want


def _misaligned(count: int) -> np.ndarray:
    """``count`` float64 at an odd address."""
    return np.zeros(8 * count + 1, np.uint8)[1:].view(np.float64)


@native
def test_wrong_buffers_are_refused_before_anything_is_read() -> None:
    assert kernel is not None
    sizes = "group_columns: need w [n, k] float64"
    good = _columns_args()
    assert _message(kernel.group_columns, good) == "accepted"
    replaced = {
        0: [np.zeros((2, 64), np.float32), np.zeros((2, 63)), _misaligned(128)],  # w
        3: [identity_factor(64)[:, :64].copy(), np.zeros((64, 128), np.uint16)],  # factor
        9: [np.zeros(2, np.float32), np.zeros(3, np.uint16)],  # scales
        10: [np.zeros((2, 63), np.int8)],  # codes
        11: [np.full(2, -1, np.int32), np.full(3, -1, np.int64)],  # failed
        12: [np.zeros(3, np.int8)],  # reason
    }
    for where, bads in replaced.items():
        for bad in bads:
            args = list(good)
            args[where] = bad
            assert _message(kernel.group_columns, args).startswith(sizes), (where, bad.shape)
    assert _message(kernel.group_columns, [*good, np.zeros((2, 64), np.float32)]).startswith(sizes)
    args = list(good)
    args[4] = 96  # not a multiple of the group
    assert "block must be a positive multiple of group" in _message(kernel.group_columns, args)
    args = list(good)
    args[5] = 32  # g0 not a group start
    assert "g0 must be a group start below k" in _message(kernel.group_columns, args)
    assert "g0 must be a group start below k" in _message(kernel.group_values, _values_args(g0=64))
    vals = _values_args()
    vals[8] = np.zeros((2, 63), np.uint32)
    assert _message(kernel.group_values, vals).startswith("group_values: need w [n, k] float64")
    with pytest.raises(TypeError):  # a read-only w: group_columns writes it
        ro = np.zeros((2, 64))
        ro.flags.writeable = False
        kernel.group_columns(ro, *good[1:])


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
    assert proc.returncode != 0 and "_gptqkernel needs IEEE arithmetic" in proc.stderr


@native
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")
def test_built_kernel_contains_no_fused_multiply_add() -> None:
    assert kernel is not None and kernel.__file__ is not None
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", kernel.__file__],
                         capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    ops = {line.split()[1] for line in asm.splitlines() if line.startswith(" ") and "\t" in line
           and len(line.split()) > 1}  # fmt: skip
    assert ops & {"subpd", "vsubpd"} and ops & {"divsd", "vdivsd"}  # the real loops are there
    fused = sorted(op for op in ops if op.startswith(("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")))
    assert fused == []


@native
@pytest.mark.parametrize("seed", range(6))
def test_rows_refused_inside_a_full_tile_leave_their_tile_mates_exact(seed: int) -> None:
    """The kernel encodes four rows at a time; a row refused in the middle of a tile (a NaN
    from an extreme factor, a value beyond binary32) keeps e = +0 from there on.  Below the
    public API (which raises at the first refusal): every surviving row's codes, scales and
    compensated values, and every row's failing column and reason, equal numpy's."""
    rng = np.random.default_rng(seed)
    n, k, block = 11, 300, 256  # two full tiles and a partial one; a partial last block
    fmt = FORMATS[GROUPED[seed % 4]]
    f = random_factor(rng, k, block=block)
    # A chain of small diagonals with huge entries beside them: each link multiplies a nonzero
    # residual by 2^100, so rows of ordinary values overflow to infinity, then NaN, and are
    # refused at different columns; rows whose values are all +-0 keep d = 0 and survive.
    for i in range(k - 14, k - 3):
        f[i, i % block] = np.float32(2.0**-60)
        f[i, i % block + 1] = np.float32(-(2.0**40))
    x = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    x[1::2] = np.where(rng.random((n // 2, k)) < 0.5, np.float32(0.0), np.float32(-0.0))
    x[0, rng.choice(k)] = np.float32(3e38)  # refused at a group start
    words = x.view(np.uint32)
    fwords = gptq.check_factor(f, k, "t")
    results = []
    for run in (gptq._encode_chunk_native, gptq._encode_chunk):
        w = words.view(np.float32).astype(np.float64)
        codes = np.zeros((n, k), np.int8)
        scales = np.zeros((n, -(-k // fmt.group_size)), np.uint16)  # type: ignore[operator]
        failed, reason = np.full(n, -1, np.int64), np.zeros(n, np.int8)
        trace = np.zeros((n, k))
        native = run is gptq._encode_chunk_native
        second = fwords if native else fwords.view(np.float32).astype(np.float64)
        run(w, second, fmt, codes, scales, failed, reason, trace, None)  # type: ignore[operator]
        results.append((codes, scales, failed, reason, trace))
    (c0, s0, f0, r0, t0), (c1, s1, f1, r1, t1) = results
    assert f0.tolist() == f1.tolist() and r0.tolist() == r1.tolist()
    assert (f0 >= 0).sum() >= 4 and (f0 < 0).sum() >= 2, f0
    for r in range(n):
        end = k if f0[r] < 0 else int(f0[r])  # values before the refusal are defined too
        assert t0[r, :end].view(np.uint64).tobytes() == t1[r, :end].view(np.uint64).tobytes()
        if f0[r] < 0:
            assert c0[r].tobytes() == c1[r].tobytes() and s0[r].tobytes() == s1[r].tobytes()
