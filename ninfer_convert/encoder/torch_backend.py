"""MAXABS_F16_RECIP_RNE_V1 in torch: one device-agnostic code path for CPU (CI) and CUDA.

Contract: bit-identical to :mod:`.oracle`.  Each Section 7 step is one IEEE-754 operation with
round-to-nearest-even and no flush-to-zero on both CPU and CUDA builds of torch:

* binary32 ``torch.div(tensor, tensor)``: CPU uses IEEE division; CUDA compiles ``a / b`` to
  ``div.rn.f32`` (torch is not built with fast-math).  Both operands are *device tensors* on
  purpose: ATen's CUDA true-divide rewrites a division by a CPU scalar as a multiplication by
  the scalar's reciprocal, which is exactly the substitution Section 7 forbids.
* binary32 ``mul``: ``mul.rn.f32``; there is no add to contract into an FMA.
* float32 -> float16 ``.to``: ``__float2half_rn`` on CUDA, F16C/``fp16_ieee_from_fp32_value`` on
  CPU; both round to nearest-even, produce subnormals and overflow to inf.
* float16 -> float32: exact widening.
* ``torch.round``: round half to even (``nearbyint`` under the default rounding mode).
Parity with the oracle on the Section 12 boundary corpus is checked by the tests and, on CUDA,
by the converter's parity gate before the first GPU-encoded tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..formats import NumericFormat
from ..logical import GroupedCodes
from .common import nonfinite_error, overflow_error

__all__ = ["encode_torch", "words_to_torch_f32"]

CHUNK_ELEMENTS_CPU = 1 << 18
CHUNK_ELEMENTS_CUDA = 1 << 26


def words_to_torch_f32(words: npt.NDArray[np.generic], source_dtype: str, device: Any) -> Any:
    """Upload source words and widen them exactly to float32 on ``device``."""
    import torch

    if source_dtype == "BF16":
        t = torch.from_numpy(np.ascontiguousarray(words).view(np.int16)).view(torch.bfloat16)
    elif source_dtype == "F16":
        t = torch.from_numpy(np.ascontiguousarray(words).view(np.float16))
    else:
        t = torch.from_numpy(np.ascontiguousarray(words).view(np.float32))
    return t.to(device=device, non_blocking=True).float()


def _encode_chunk(x: Any, fmt: NumericFormat) -> tuple[Any, Any, Any, Any]:
    """Encode float32 rows [n, K] on their device; returns (codes, scale bits, amax, raw)."""
    import torch

    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    g = fmt.group_size
    n, k = x.shape
    n_groups = -(-k // g)
    if k % g:
        x = torch.nn.functional.pad(x, (0, n_groups * g - k))  # zero fill: see numpy backend
    xg = x.view(n, n_groups, g)
    amax = xg.abs().amax(dim=2)
    qmax = torch.full_like(amax, float(fmt.qmax))
    raw_scale32 = torch.div(amax, qmax)
    scale16 = raw_scale32.to(torch.float16)
    bits = scale16.view(torch.int16)
    rescue = (bits == 0) & (amax > 0)
    bits = torch.where(rescue, torch.ones_like(bits), bits)
    scale32 = bits.view(torch.float16).to(torch.float32)
    positive = scale32 > 0
    inv32 = torch.where(
        positive, torch.div(torch.ones_like(scale32), scale32), torch.zeros_like(scale32)
    )
    q = torch.round(torch.mul(xg, inv32.unsqueeze(2)))
    q = torch.clamp(q, fmt.qmin, fmt.qmax).to(torch.int8)
    return q.view(n, n_groups * g)[:, :k], bits, amax, raw_scale32


def encode_torch(
    values: Any,
    source_dtype: str,
    fmt: NumericFormat,
    *,
    device: Any = None,
    tensor: str | None = None,
) -> GroupedCodes:
    """Encode a numpy word array (or a torch tensor) on ``device`` (default: CPU)."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    assert fmt.group_size is not None
    n, k = values.shape
    codes = np.empty((n, k), dtype=np.int8)
    scales = np.empty((n, -(-k // fmt.group_size)), dtype=np.uint16)
    budget = CHUNK_ELEMENTS_CUDA if dev.type == "cuda" else CHUNK_ELEMENTS_CPU
    rows = max(1, budget // k)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        if isinstance(values, torch.Tensor):
            x = values[r0:r1].to(dev).float()
        else:
            x = words_to_torch_f32(values[r0:r1], source_dtype, dev)
        q, bits, amax, raw = _encode_chunk(x, fmt)
        if not bool(torch.isfinite(amax).all()):
            bad = ~torch.isfinite(x)
            flat = int(torch.argmax(bad.reshape(-1).to(torch.uint8)))
            r, c = divmod(flat, k)
            word = _source_word(values, r0 + r, c, source_dtype)
            raise nonfinite_error(tensor, r0 + r, c // fmt.group_size, c, word, source_dtype)
        overflow = bits == 0x7C00
        if bool(overflow.any()):
            r, grp = (int(i) for i in torch.nonzero(overflow)[0])
            raise overflow_error(tensor, r0 + r, grp, float(raw[r, grp]))
        codes[r0:r1] = q.cpu().numpy()
        scales[r0:r1] = bits.cpu().numpy().view(np.uint16)
    return GroupedCodes(codes=codes, scales=scales)


def _source_word(values: Any, r: int, c: int, source_dtype: str) -> int:
    import torch

    if isinstance(values, torch.Tensor):
        v = values[r, c].reshape(1).cpu()
        width = {torch.bfloat16: torch.int16, torch.float16: torch.int16}.get(v.dtype, torch.int32)
        return int(v.view(width).item()) & (0xFFFF if width is torch.int16 else 0xFFFFFFFF)
    return int(np.asarray(values)[r, c])
