"""The C MSE kernel (or None when it is not built) and the SIMD paths this CPU can run, shared
by tests/test_mse_kernel_*.py."""

from __future__ import annotations

from ninfer_convert.native import optional_module

kernel = optional_module("_msekernel")


def kernel_paths() -> list[str]:
    """The kernel paths (sse2, avx2, avx512) this CPU runs; the selected path is restored."""
    if kernel is None:
        return []
    default = kernel.kernel_path()
    out = []
    try:
        for name in ("sse2", "avx2", "avx512"):
            try:
                kernel.kernel_path(name)
                out.append(name)
            except ValueError:
                pass
    finally:
        kernel.kernel_path(default)
    return out
