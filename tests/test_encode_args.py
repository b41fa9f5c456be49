"""The encoders' shared argument checks (ninfer_convert/_encode_args.h) hold for both C kernels.

_hostkernel.c and _msekernel.c take their first checks and the overflow-checked buffer sizes
from one header; tests/test_host_kernel_edges.py pins them for _hostkernel only.  Here the same
refusals are asked of both kernels: the same message for the same arguments, and sizes whose
product overflows refused (not wrapped into a small buffer that is then read out of bounds).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("_hostkernel", "_msekernel")
OVERFLOWS = "encode_rows: n, k and group give a buffer size that overflows"


def _call(kernel: str, source: int, n: int, k: int, group: int, qmin: int, qmax: int) -> str:
    """The ValueError message of ``encode_rows`` on small buffers, or "accepted"."""
    import importlib

    mod = importlib.import_module(f"ninfer_convert.{kernel}")
    words = np.zeros(64, np.uint16)
    codes, scales = np.empty(64, np.int8), np.empty(1, np.uint16)
    try:
        mod.encode_rows(words, source, n, k, group, qmin, qmax, codes, scales)
    except ValueError as exc:
        return str(exc)
    return "accepted"


def _native(kernel: str) -> bool:
    import importlib

    try:
        importlib.import_module(f"ninfer_convert.{kernel}")
    except ImportError:
        return False
    return True


needs_both = pytest.mark.skipif(
    not all(_native(k) for k in KERNELS), reason="the C kernels are not built"
)


@needs_both
@pytest.mark.parametrize(
    "args",
    [
        (3, 1, 64, 64, -8, 7),
        (-1, 1, 64, 64, -8, 7),
        (0, -1, 64, 64, -8, 7),
        (0, 1, 0, 64, -8, 7),
        (0, 1, 64, 0, -8, 7),
        (0, 1, 64, 64, -129, 7),
        (0, 1, 64, 64, 0, 7),
        (0, 1, 64, 64, -8, 0),
        (0, 1, 64, 64, -8, 128),
    ],
)
def test_both_kernels_refuse_bad_arguments_with_the_shared_message(
    args: tuple[int, int, int, int, int, int],
) -> None:
    host, mse = (_call(k, *args) for k in KERNELS)
    assert host == mse and host.startswith("encode_rows: need "), (host, mse)


SIZES = [(2**62, 64, 64), (2**40, 2**40, 64), (1, 2**62, 1), (2**61, 4, 2**31 - 1),
         (2**63 - 1, 2, 1)]  # fmt: skip


@needs_both
def test_sizes_that_overflow_are_refused_not_wrapped() -> None:
    # In one child: a size check that wraps around reads out of bounds and may kill the process.
    code = (
        "import sys; sys.path.insert(0, 'tests'); from test_encode_args import _call, SIZES; "
        "[print(kernel, _call(kernel, 0, n, k, g, -8, 7)) for kernel in sys.argv[1:] "
        "for n, k, g in SIZES]"
    )
    proc = subprocess.run([sys.executable, "-c", code, *KERNELS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = [f"{kernel} {OVERFLOWS}" for kernel in KERNELS for _ in SIZES]
    assert proc.stdout.splitlines() == expected
