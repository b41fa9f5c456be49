"""The host encoder used by the converter: the C kernel when it was built, else numpy.

Contract: :func:`encode_rows` encodes a block of rows into caller-provided code and scale
arrays, bit-identical to :mod:`.oracle` whichever implementation runs (the tests run both
against the oracle; CI requires the C kernel to be present via ``NINFER_REQUIRE_NATIVE=1``).
Refusals raise the same :class:`~ninfer_convert.errors.EncodeError` messages as the numpy
backend, with rows counted from ``row0``.  ``words`` may sit at any address (a BF16 tensor at an
odd offset of a memory-mapped file): the C kernel copies an input that is not aligned to its
word size before reading it, and checks its sizes and code bounds itself (``_hostkernel.c``).
The profile MSE_F16_SEARCH_V1 has its own C kernel (``_msekernel.c``, same rules), with the
numpy encoder of :mod:`.mse_search` as its fallback; the tests hold the two to the exact
reference and to each other.  GPTQ_F16_SEARCH_IW_V1 is not encoded here: its encoder
(:mod:`.gptq`) calls this module for its scale search, so the row-block dispatch that includes
it is :func:`.dispatch.encode_block`, the caller of :func:`encode_rows`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..formats import (
    GPTQ_F16_SEARCH_IW_V1,
    MAXABS_F16_RECIP_RNE_V1,
    MSE_F16_SEARCH_IW_V1,
    MSE_F16_SEARCH_V1,
    NumericFormat,
    lookup_profile,
)
from ..native import optional_module
from .common import nonfinite_error, overflow_error
from .mse_search import encode_rows_mse
from .numpy_backend import _encode_rows

_native: Any = optional_module("_hostkernel")  # None when the build skipped it
_native_mse: Any = optional_module("_msekernel")  # MSE_F16_SEARCH_V1; None when not built

__all__ = [
    "HOST_KERNELS",
    "ErrorSums",
    "encode_rows",
    "encode_rows_mse_native",
    "native_available",
    "native_mse_available",
]

ErrorSums = tuple[float, float, float]
"""(max |x - x_hat|, sum of squared errors, sum of squared values) of an encoded block."""

HOST_KERNELS = ("native", "numpy")


def native_available() -> bool:
    return _native is not None


def native_mse_available() -> bool:
    return _native_mse is not None


def encode_rows(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    row0: int,
    codes_out: npt.NDArray[np.int8],
    scales_out: npt.NDArray[np.uint16],
    tensor: str | None,
    kernel: str = "native",
    *,
    with_sums: bool = False,
    profile: str = MAXABS_F16_RECIP_RNE_V1,
    importance: npt.NDArray[np.uint32] | None = None,
) -> ErrorSums | None:
    """Encode ``words`` [n, K] (a block starting at tensor row ``row0``) into the outputs.

    With ``with_sums`` the C kernel also returns the block's :data:`ErrorSums` from the same
    pass (see ``_hostkernel.c``); ``None`` means the numpy path ran and the caller computes
    them itself.  ``profile`` MSE_F16_SEARCH_V1 runs its C kernel (``_msekernel.c``) when it
    was built and ``kernel`` is "native", else its numpy encoder; both write the same bytes
    (its C kernel returns the sums too).  MSE_F16_SEARCH_IW_V1 does the same with
    ``importance`` (the tensor's [K] binary32 weights, already checked by
    ``mse_search.check_weights``), which both kernels take.  GPTQ_F16_SEARCH_IW_V1 is
    refused: :func:`.dispatch.encode_block` encodes it."""
    name = lookup_profile(profile).name
    if name == GPTQ_F16_SEARCH_IW_V1:
        raise ValueError(f"{name} is encoded by encoder.dispatch.encode_block, not here")
    if name == MSE_F16_SEARCH_IW_V1 and importance is None:
        raise ValueError(f"{MSE_F16_SEARCH_IW_V1} needs the tensor's importance vector")
    if name in (MSE_F16_SEARCH_V1, MSE_F16_SEARCH_IW_V1):
        weights = importance if name == MSE_F16_SEARCH_IW_V1 else None
        if kernel == "numpy" or _native_mse is None:
            encode_rows_mse(words, source_dtype, fmt, row0, codes_out, scales_out, tensor, weights)
            return None
        mse_sums = np.zeros(3, dtype=np.float64) if with_sums else None
        encode_rows_mse_native(
            words, source_dtype, fmt, row0, codes_out, scales_out, tensor, weights, sums=mse_sums
        )
        if mse_sums is None:
            return None
        return float(mse_sums[0]), float(mse_sums[1]), float(mse_sums[2])
    if kernel == "numpy" or _native is None:
        _encode_rows(words, source_dtype, fmt, row0, codes_out, scales_out, tensor)
        return None
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    n, k = words.shape
    w: npt.NDArray[np.generic]
    if source_dtype == "BF16":
        src, w = 0, np.ascontiguousarray(words, dtype=np.uint16)
    elif source_dtype == "F16":  # widened exactly, row by row, inside the kernel
        src, w = 2, np.ascontiguousarray(words, dtype=np.uint16)
    else:
        src, w = 1, np.ascontiguousarray(words).view(np.uint32)
    sums = np.zeros(3, dtype=np.float64) if with_sums else None
    result: Any = _native.encode_rows(
        w, src, n, k, fmt.group_size, fmt.qmin, fmt.qmax, codes_out, scales_out, sums
    )
    if result is None:
        return None if sums is None else (float(sums[0]), float(sums[1]), float(sums[2]))
    if result[0] == "nonfinite":
        r, c = int(result[1]), int(result[2])
        word = int(np.asarray(words)[r, c])
        raise nonfinite_error(tensor, row0 + r, c // fmt.group_size, c, word, source_dtype)
    r, g, raw = int(result[1]), int(result[2]), float(result[3])
    raise overflow_error(tensor, row0 + r, g, raw)


_MSE_SOURCES = {"BF16": 0, "F32": 1, "F16": 2}


def encode_rows_mse_native(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    row0: int,
    codes_out: npt.NDArray[np.int8],
    scales_out: npt.NDArray[np.uint16],
    tensor: str | None,
    weights: npt.NDArray[np.uint32] | None = None,
    *,
    sums: npt.NDArray[np.float64] | None = None,
) -> None:
    """MSE_F16_SEARCH_V1 on a block of rows with the C kernel (``_msekernel.c``); same signature,
    bytes and refusals as :func:`.mse_search.encode_rows_mse`.  ``weights`` (K binary32 words,
    one per column) selects the kernel's importance-weighted error (docs in the C source); None
    is the profile's unweighted error.  ``sums`` (three float64), when given, receives the
    block's :data:`ErrorSums` from the same pass.

    On a refusal the block is handed to the numpy encoder, which raises the error: the numpy
    path reports the first refusal of its first failing piece (non-finite values before
    overflows within a piece), and re-running it is the one way to give the same message."""
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    n, k = words.shape
    w = np.ascontiguousarray(words)
    result: Any = _native_mse.encode_rows(
        w, _MSE_SOURCES[source_dtype], n, k, fmt.group_size, fmt.qmin, fmt.qmax,
        codes_out, scales_out, weights, sums,
    )  # fmt: skip
    if result is not None:
        encode_rows_mse(words, source_dtype, fmt, row0, codes_out, scales_out, tensor)
        raise RuntimeError(
            f"the C kernel refused {result!r} where numpy did not"
        )  # pragma: no cover
