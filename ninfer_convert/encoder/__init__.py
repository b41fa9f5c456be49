"""The grouped encoders: the canonical MAXABS_F16_RECIP_RNE_V1 and MSE_F16_SEARCH_V1.

Canonical profile: ``oracle`` (bit-level, exact rational arithmetic; the reference), ``numpy``
(production host encoder) and ``torch`` (same algorithm on CPU or CUDA).  All three return
identical codes and binary16 scale words for every input; a non-finite source value or a scale
that overflows binary16 raises :class:`~ninfer_convert.errors.EncodeError` naming the row, group
and column.  ``profile=MSE_F16_SEARCH_V1`` selects the error-searching profile
(docs/encoder-profiles.md): backend ``oracle`` runs its exact reference
(:mod:`.mse_reference`), ``numpy`` its host encoder (:mod:`.mse_search`), ``torch`` its float64
torch encoder (:func:`.torch_backend.encode_mse_torch`, CPU or CUDA); all three give the same
bytes.  ``profile=MSE_F16_SEARCH_IW_V1`` is the same search with an importance-weighted error
and needs ``importance`` (one binary32 weight per column; backends ``oracle`` and ``numpy``
only, the torch encoder has no weights); other profiles refuse an importance vector.
``profile=GPTQ_F16_SEARCH_IW_V1`` is block-compensated encoding (:mod:`.gptq`) and needs both
``importance`` and ``factor`` ([K, B] binary32 words); backend ``numpy`` runs
:func:`.gptq.encode_compensated_numpy`, ``oracle`` its exact reference (:mod:`.gptq_reference`);
other profiles refuse a factor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError, UsageError
from ..formats import (
    GPTQ_F16_SEARCH_IW_V1,
    MAXABS_F16_RECIP_RNE_V1,
    MSE_F16_SEARCH_IW_V1,
    MSE_F16_SEARCH_V1,
    NumericFormat,
    lookup_profile,
)
from ..logical import GroupedCodes
from .common import SourceDtype, check_words, grouped_format, nonfinite_error, overflow_error
from .numpy_backend import encode_numpy
from .oracle import OracleFailure, encode_oracle

__all__ = ["BACKENDS", "SourceDtype", "encode_grouped", "encode_grouped_words"]

BACKENDS = ("oracle", "numpy", "torch")


def encode_grouped_words(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: str | NumericFormat,
    *,
    backend: str = "numpy",
    device: Any = None,
    tensor: str | None = None,
    threads: int = 2,
    profile: str = MAXABS_F16_RECIP_RNE_V1,
    importance: npt.NDArray[np.generic] | None = None,
    factor: npt.NDArray[np.generic] | None = None,
) -> GroupedCodes:
    """Encode an [N, K] array of source *words* (BF16/F16 as uint16, F32 as uint32/float32);
    ``importance`` is the [K] binary32 weight vector of MSE_F16_SEARCH_IW_V1 and
    GPTQ_F16_SEARCH_IW_V1, ``factor`` the [K, B] binary32 factor of the latter."""
    entry = grouped_format(fmt)
    check_words(words, source_dtype)
    prof = lookup_profile(profile)
    if prof.importance != (importance is not None):
        raise UsageError(
            f"encoder profile {prof.name} "
            + ("needs an importance vector" if prof.importance else "takes no importance vector"),
            hint=f"{MSE_F16_SEARCH_IW_V1} and {GPTQ_F16_SEARCH_IW_V1} weight their error by "
            "per-column importance",
        )
    if prof.factor != (factor is not None):
        raise UsageError(
            f"encoder profile {prof.name} "
            + ("needs a compensation factor" if prof.factor else "takes no compensation factor"),
            hint=f"only {GPTQ_F16_SEARCH_IW_V1} compensates errors across columns",
        )
    if prof.factor:
        assert factor is not None and importance is not None
        return _encode_compensated(words, source_dtype, entry, backend, tensor, importance, factor)
    if prof.name in (MSE_F16_SEARCH_V1, MSE_F16_SEARCH_IW_V1):
        return _encode_mse(words, source_dtype, entry, backend, device, tensor, threads, importance)
    if backend == "numpy":
        return encode_numpy(words, source_dtype, entry, tensor=tensor, threads=threads)
    if backend == "torch":
        from .torch_backend import encode_torch

        return encode_torch(words, source_dtype, entry, device=device, tensor=tensor)
    if backend == "oracle":
        return _encode_with_oracle(words, source_dtype, entry, tensor)
    raise UsageError(
        f"unknown encoder backend {backend!r}", hint="use one of " + ", ".join(BACKENDS)
    )


def _encode_mse(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    backend: str,
    device: Any,
    tensor: str | None,
    threads: int,
    importance: npt.NDArray[np.generic] | None,
) -> GroupedCodes:
    from .mse_search import check_weights, encode_mse_numpy

    if backend == "numpy":
        return encode_mse_numpy(
            words, source_dtype, fmt, tensor=tensor, threads=threads, weights=importance
        )
    if backend == "torch" and importance is None:
        from .torch_backend import encode_mse_torch

        return encode_mse_torch(words, source_dtype, fmt, device=device, tensor=tensor)
    if backend == "oracle":
        weights = None if importance is None else check_weights(importance, words.shape[1], tensor)
        return _encode_with_oracle(
            words, source_dtype, fmt, tensor, reference=True, weights=weights
        )
    name = MSE_F16_SEARCH_V1 if importance is None else MSE_F16_SEARCH_IW_V1
    raise UsageError(
        f"encoder profile {name} has no {backend!r} backend"
        if backend == "torch"
        else f"unknown encoder backend {backend!r}",
        hint="use backend 'numpy' (or 'oracle' for its exact reference)"
        if backend == "torch"
        else "use one of " + ", ".join(BACKENDS),
    )


def _encode_compensated(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    backend: str,
    tensor: str | None,
    importance: npt.NDArray[np.generic],
    factor: npt.NDArray[np.generic],
) -> GroupedCodes:
    from .gptq import check_factor, encode_compensated_numpy

    if backend == "numpy":
        return encode_compensated_numpy(
            words, source_dtype, fmt, factor, tensor=tensor, weights=importance
        )
    if backend != "oracle":
        raise UsageError(
            f"encoder profile {GPTQ_F16_SEARCH_IW_V1} has no {backend!r} backend",
            hint="use backend 'numpy' (or 'oracle' for its exact reference)",
        )
    from ..words import bf16_to_f32_words, f16_to_f32_words
    from .gptq_reference import CompensationFailure, encode_compensated_reference
    from .mse_search import check_weights

    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    k = words.shape[1]
    f = check_factor(factor, k, tensor)
    wts = check_weights(importance, k, tensor)
    w = np.asarray(words)
    if source_dtype == "BF16":
        x = bf16_to_f32_words(w.astype(np.uint16))
    elif source_dtype == "F16":
        x = f16_to_f32_words(w.astype(np.uint16))
    else:
        x = np.ascontiguousarray(w).view(np.uint32)
    try:
        codes, scales = encode_compensated_reference(
            x, f, fmt.group_size, fmt.qmin, fmt.qmax, weights=wts
        )
    except CompensationFailure as exc:
        raise EncodeError(
            f"tensor {tensor or '<array>'}: row {exc.row}, column {exc.column}: {exc.reason} "
            "under error compensation",
            hint="check the source values and the compensation factor (ninfer calibrate); "
            "MSE_F16_SEARCH_IW_V1 encodes the tensor without compensation",
        ) from None
    return GroupedCodes(codes=codes, scales=scales)


def _encode_with_oracle(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    tensor: str | None,
    *,
    reference: bool = False,
    weights: npt.NDArray[np.uint32] | None = None,
) -> GroupedCodes:
    from ..words import bf16_to_f32_words, f16_to_f32_words

    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    w = np.asarray(words)
    if source_dtype == "BF16":
        f32_words = bf16_to_f32_words(w.astype(np.uint16))
    elif source_dtype == "F16":
        f32_words = f16_to_f32_words(w.astype(np.uint16))
    else:
        f32_words = np.ascontiguousarray(w).view(np.uint32)
    try:
        if reference:
            from .mse_reference import encode_mse_reference

            codes, scales = encode_mse_reference(
                f32_words, fmt.group_size, fmt.qmin, fmt.qmax, weights
            )
        else:
            codes, scales = encode_oracle(f32_words, fmt.group_size, fmt.qmin, fmt.qmax)
    except OracleFailure as exc:
        if exc.column >= 0:
            word = int(w[exc.row, exc.column])
            raise nonfinite_error(
                tensor, exc.row, exc.group, exc.column, word, source_dtype
            ) from None
        raise overflow_error(tensor, exc.row, exc.group, exc.raw_scale) from None
    return GroupedCodes(codes=codes, scales=scales)


def encode_grouped(
    values: Any,
    format: str | NumericFormat,
    *,
    backend: str = "numpy",
    device: Any = None,
) -> GroupedCodes:
    """Public API: encode a 2-D numpy float32/float16 array or a torch bf16/f16/f32 tensor.

    Returns :class:`~ninfer_convert.logical.GroupedCodes` with ``codes`` (int8 [N, K]) and
    ``scales`` (uint16 binary16 words [N, ceil(K/G)]).
    """
    if isinstance(values, np.ndarray):
        if values.dtype == np.float32:
            return encode_grouped_words(
                values.view(np.uint32), "F32", format, backend=backend, device=device
            )
        if values.dtype == np.float16:
            return encode_grouped_words(
                values.view(np.uint16), "F16", format, backend=backend, device=device
            )
        raise EncodeError(
            f"encode_grouped takes float32 or float16 numpy arrays, got {values.dtype}",
            hint="for BF16 words use encode_grouped_words(words, 'BF16', format)",
        )
    import torch

    if isinstance(values, torch.Tensor):
        kinds = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
        if values.dtype not in kinds:
            raise EncodeError(f"encode_grouped takes bf16/f16/f32 tensors, got {values.dtype}")
        kind = kinds[values.dtype]
        if backend == "torch":
            entry = grouped_format(format)
            if values.ndim != 2 or values.shape[0] <= 0 or values.shape[1] <= 0:
                check_words(np.empty(tuple(values.shape), dtype=np.uint16), kind)
            from .torch_backend import encode_torch

            return encode_torch(values, kind, entry, device=device)
        cpu = values.detach().contiguous().cpu()
        width = torch.int32 if kind == "F32" else torch.int16
        words = cpu.view(width).numpy().view(np.uint32 if kind == "F32" else np.uint16)
        return encode_grouped_words(words, kind, format, backend=backend, device=device)
    raise EncodeError(f"encode_grouped takes a numpy array or torch tensor, got {type(values)}")
