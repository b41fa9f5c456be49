"""The C host kernel's edges (issue 11 item 9): unaligned input from a real odd-offset
safetensors file (bit parity with the oracle), argument checks (qmin/qmax, sizes that would
overflow), and the build refusing compilers that break IEEE binary32 arithmetic."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert import encode_grouped_words, open_artifact
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.encoder import host
from ninfer_convert.formats import FORMATS
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.source import open_source

ROOT = Path(__file__).resolve().parents[1]
KERNEL_C = ROOT / "ninfer_convert" / "_hostkernel.c"
native = pytest.mark.skipif(not host.native_available(), reason="C host kernel not built")


def _words(shape: tuple[int, int], source: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 6, size=(shape[0], 1)).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16) if source == "BF16" else x.view(np.uint32)


@native
@pytest.mark.parametrize(("source", "pad"), [("BF16", 1), ("F32", 1), ("F32", 2), ("F32", 3)])
def test_tensor_at_an_unaligned_file_offset_encodes_like_the_oracle(
    tmp_path: Path, source: str, pad: int
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    # Larger than SMALL_READ_BYTES, so the source read maps the file (a smaller tensor is
    # read into a fresh, aligned buffer) and the unaligned offset reaches the kernel.
    words = _words((6, 5760), source, seed=pad)
    # "a" sorts first, so "w" starts `pad` bytes into the 8-aligned data region.
    pad_bytes = np.arange(pad, dtype=np.uint8)
    write_safetensors(src / "model.safetensors", {"a": ("U8", pad_bytes), "w": (source, words)})
    (src / "config.json").write_text('{"model_type": "llama"}')
    with open_source(src) as s:
        read = s.read("w").words
        assert read.ctypes.data % read.dtype.itemsize != 0  # the kernel really sees it unaligned
        assert not read.flags.aligned
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        RECIPE_HEAD + "- skip: a\n  reason: padding\n"
        "- match: w\n  format: Q4G64_F16S\n  encoder_profile: MAXABS_F16_RECIP_RNE_V1\n"
        "  role: r\n  evidence: [e1]\n"
    )
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", jobs=1)
    ref = encode_grouped_words(words, source, "Q4G64_F16S", backend="oracle")
    with open_artifact(out) as art:
        got = art.read("w")
    assert isinstance(got, GroupedCodes)
    assert got.codes.tobytes() == ref.codes.tobytes()
    assert got.scales.tobytes() == ref.scales.tobytes()


@native
@pytest.mark.parametrize("with_sums", [False, True])
@pytest.mark.parametrize("source", ["BF16", "F32"])
def test_unaligned_buffer_gives_the_aligned_result_word_for_word(
    source: str, with_sums: bool
) -> None:
    words = _words((5, 200), source, seed=9)
    fmt = FORMATS["W8G32_F16S"]
    raw = words.tobytes()
    for shift in range(1, words.dtype.itemsize):
        buf = bytearray(shift) + bytearray(raw)
        odd = np.frombuffer(buf, dtype=words.dtype, offset=shift).reshape(words.shape)
        assert odd.ctypes.data % words.dtype.itemsize != 0
        outs = []
        for w in (words, odd):
            codes = np.empty(words.shape, np.int8)
            scales = np.empty((5, 7), np.uint16)
            sums = host.encode_rows(w, source, fmt, 0, codes, scales, "t", with_sums=with_sums)
            outs.append((codes.tobytes(), scales.tobytes(), sums))
        assert outs[0] == outs[1]
        assert bytes(buf[shift:]) == raw  # the input is never written


def _call(*args: object) -> str:
    from ninfer_convert import _hostkernel

    w = np.zeros(64, np.uint16)
    codes = np.empty(64, np.int8)
    scales = np.empty(1, np.uint16)
    source, n, k, group, qmin, qmax = args
    try:
        _hostkernel.encode_rows(w, source, n, k, group, qmin, qmax, codes, scales)
    except ValueError as exc:
        return str(exc)
    return "accepted"


@native
@pytest.mark.parametrize(
    ("qmin", "qmax"),
    [(-129, 7), (0, 7), (5, 7), (-8, 0), (-8, -1), (-8, 128), (-(2**31), 2**31 - 1)],
)
def test_kernel_refuses_code_bounds_outside_int8(qmin: int, qmax: int) -> None:
    assert _call(0, 1, 64, 64, qmin, qmax) == "encode_rows: need -128 <= qmin < 0 < qmax <= 127"
    assert _call(0, 1, 64, 64, -128, 127) == "accepted"


@native
@pytest.mark.parametrize(
    ("n", "k", "group"),
    [(2**62, 64, 64), (2**40, 2**40, 64), (1, 2**62, 1), (2**61, 4, 2**31 - 1), (2**63 - 1, 2, 1)],
)
def test_kernel_sizes_that_overflow_are_refused_not_wrapped(n: int, k: int, group: int) -> None:
    # Run in a child: a size check that wraps around reads out of bounds and kills the process.
    code = (
        "import sys; sys.path.insert(0, 'tests'); from test_host_kernel_edges import _call; "
        f"print(_call(0, {n}, {k}, {group}, -8, 7))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "encode_rows: n, k and group give a buffer size that overflows"


@native
def test_kernel_refuses_bad_shapes_and_sources() -> None:
    why = (
        "encode_rows: need group >= 1, n >= 0, k >= 1 and source 0 (BF16), 1 (binary32) "
        "or 2 (binary16)"
    )
    for args in ((3, 1, 64, 64), (-1, 1, 64, 64), (0, -1, 64, 64), (0, 1, 0, 64), (0, 1, 64, 0)):
        assert _call(*args, -8, 7) == why
    assert _call(0, 2, 64, 64, -8, 7).startswith("encode_rows: inconsistent buffer sizes")


@native
def test_kernel_refuses_misaligned_outputs() -> None:
    from ninfer_convert import _hostkernel

    w = np.zeros(64, np.uint16)
    codes = np.empty(64, np.int8)
    buf = bytearray(3)
    scales = np.frombuffer(buf, dtype=np.uint16, offset=1)
    with pytest.raises(ValueError, match="must be aligned"):
        _hostkernel.encode_rows(w, 0, 1, 64, 64, -8, 7, codes, scales)


COMPILER = shutil.which("gcc") or shutil.which("cc")


def _compile(*flags: str) -> subprocess.CompletedProcess[str]:
    assert COMPILER is not None
    include = sysconfig.get_paths()["include"]
    cmd = [COMPILER, "-fsyntax-only", "-std=c99", f"-I{include}", *flags, str(KERNEL_C)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["-ffast-math"], "build without -ffast-math"),
        (["-ffinite-math-only"], "build without -ffast-math"),
        (["-freciprocal-math"], "build without -ffast-math"),
        (["-funsafe-math-optimizations"], "build without -ffast-math"),
        (["-mfpmath=387"], "FLT_EVAL_METHOD == 0"),
    ],
)
def test_build_fails_under_flags_that_break_ieee_arithmetic(flags: list[str], needle: str) -> None:
    if sys.platform != "linux" or "x86_64" not in sysconfig.get_platform():
        pytest.skip("x86-64 Linux flags")
    bad = _compile(*flags)
    assert bad.returncode != 0 and needle in bad.stderr, bad.stderr
    good = _compile("-O3", "-ffp-contract=off", "-fno-fast-math")
    assert good.returncode == 0, good.stderr


@pytest.mark.slow
@pytest.mark.skipif(COMPILER is None, reason="no C compiler")
def test_refused_build_falls_back_to_numpy(tmp_path: Path) -> None:
    # The extension is optional: a refused compile leaves it out, the build still succeeds,
    # and native.optional_module then gives None (the numpy path, same bytes).
    if sys.platform != "linux" or "x86_64" not in sysconfig.get_platform():
        pytest.skip("x86-64 Linux flags")
    env = {**os.environ, "CFLAGS": "-mfpmath=387"}
    proc = subprocess.run(
        [sys.executable, "-c", "import setuptools; setuptools.setup()", "build_ext",
         "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "FLT_EVAL_METHOD == 0" in proc.stdout + proc.stderr
    built = {p.name.split(".")[0] for p in (tmp_path / "lib" / "ninfer_convert").iterdir()}
    assert built == {"_rowsplit", "_jsonfast"}  # integer-only modules build anyway
