"""The one row-block encoder dispatch of the converter's host path (``derive/fused.py``):
:func:`encode_block` encodes a block of rows with the rule's encoder profile.

Contract: GPTQ_F16_SEARCH_IW_V1 (block-compensated, docs/encoder-profiles.md) goes to the
public :func:`.gptq.encode_compensated` (its C kernel ``_gptqkernel.c`` when built, else
numpy: the same bytes) with the tensor's whole factor and importance vector (rows never
interact, so a block of rows is encoded on its own and the bytes do not depend on the blocking
or on ``--jobs``); every other profile goes to :func:`.host.encode_rows`.  This module exists
apart from :mod:`.host` because :mod:`.gptq` uses :mod:`.host` for its scale search (no import
cycle).  Refusals name rows counted from the tensor's first row in both cases.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..formats import GPTQ_F16_SEARCH_IW_V1, MAXABS_F16_RECIP_RNE_V1, NumericFormat, lookup_profile
from .host import ErrorSums, encode_rows

__all__ = ["encode_block", "encode_rows_compensated"]


def encode_block(
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
    factor: npt.NDArray[np.uint32] | None = None,
) -> ErrorSums | None:
    """:func:`.host.encode_rows`'s signature plus ``factor`` ([K, B] binary32 words):
    GPTQ_F16_SEARCH_IW_V1 needs ``importance`` and ``factor`` and returns no sums (the
    caller computes them); other profiles refuse a factor."""
    name = lookup_profile(profile).name
    if name == GPTQ_F16_SEARCH_IW_V1:
        if importance is None or factor is None:
            raise ValueError(f"{name} needs the tensor's importance vector and factor")
        encode_rows_compensated(
            words, source_dtype, fmt, row0, codes_out, scales_out, tensor, importance, factor,
            kernel=kernel,
        )  # fmt: skip
        return None
    if factor is not None:
        raise ValueError(f"encoder profile {name} takes no compensation factor")
    return encode_rows(
        words, source_dtype, fmt, row0, codes_out, scales_out, tensor, kernel,
        with_sums=with_sums, profile=profile, importance=importance,
    )  # fmt: skip


def encode_rows_compensated(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt: NumericFormat,
    row0: int,
    codes_out: npt.NDArray[np.int8],
    scales_out: npt.NDArray[np.uint16],
    tensor: str | None,
    importance: npt.NDArray[np.uint32],
    factor: npt.NDArray[np.uint32],
    *,
    kernel: str = "native",
) -> None:
    """GPTQ_F16_SEARCH_IW_V1 on a block of rows starting at tensor row ``row0``: the public
    :func:`.gptq.encode_compensated` (its C kernel when built, ``kernel`` "numpy" for the
    numpy encoder: the same bytes), whose refusal names the row counted from the tensor's
    first row (``row0``).  ``importance`` and ``factor`` are the plan entry's attached words
    (the factor read for this tensor by ``FactorRef.words``, digest-checked against the words
    checked when it was attached), checked once per tensor when they were attached
    (``attach_importance``, ``attach_factors``), so they are not checked again for every row
    block."""
    from .gptq import encode_compensated

    got = encode_compensated(
        words, source_dtype, fmt, factor, tensor=tensor, weights=importance, kernel=kernel,
        row0=row0, checked=True,
    )  # fmt: skip
    codes_out[...] = got.codes
    scales_out[...] = got.scales
