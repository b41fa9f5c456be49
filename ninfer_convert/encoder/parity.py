"""Run-time parity checks of fast encoder paths against the reference (spec Sections 7, 12).

Contract:

* :func:`cuda_parity_gate` runs the Section 12 boundary corpus of each requested format through
  the torch backend on the device and compares codes and scale words with the oracle; any
  difference raises :class:`~ninfer_convert.errors.EncodeError` naming the first differing
  row/group and bits.  There is no silent fallback to another path.
* :func:`spot_check_rows` re-encodes a deterministic random sample of rows of an already
  encoded tensor with another backend (numpy by default, oracle for the verifier) and compares.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import EncodeError
from ..formats import lookup_format
from ..logical import GroupedCodes
from .corpus import boundary_corpus

__all__ = ["cuda_parity_gate", "first_difference", "spot_check_rows"]


def first_difference(expected: GroupedCodes, got: GroupedCodes, group_size: int) -> str | None:
    """Describe the first differing scale word or code, or ``None`` when identical."""
    if expected.scales.shape != got.scales.shape or expected.codes.shape != got.codes.shape:
        return (
            f"shapes differ: codes {list(expected.codes.shape)} vs {list(got.codes.shape)}, "
            f"scales {list(expected.scales.shape)} vs {list(got.scales.shape)}"
        )
    bad = np.argwhere(expected.scales != got.scales)
    if bad.size:
        r, g = (int(i) for i in bad[0])
        e, f = int(expected.scales[r, g]), int(got.scales[r, g])
        return (
            f"scale word at row {r}, group {g}: expected 0x{e:04x}, found 0x{f:04x} "
            f"(xor 0x{e ^ f:04x}; {len(bad)} differing scale words)"
        )
    bad = np.argwhere(expected.codes != got.codes)
    if bad.size:
        r, c = (int(i) for i in bad[0])
        e, f = int(expected.codes[r, c]), int(got.codes[r, c])
        return (
            f"code at row {r}, column {c} (group {c // group_size}): expected {e}, found {f} "
            f"({len(bad)} differing codes)"
        )
    return None


def cuda_parity_gate(formats: Iterable[str], *, device: Any = "cuda") -> None:
    """Compare the torch backend on ``device`` with the oracle on the boundary corpus."""
    from . import encode_grouped_words

    for name in formats:
        fmt = lookup_format(name)
        assert fmt.group_size is not None
        for case, words in boundary_corpus(fmt):
            ref = encode_grouped_words(words, "F32", fmt, backend="oracle")
            got = encode_grouped_words(words, "F32", fmt, backend="torch", device=device)
            diff = first_difference(ref, got, fmt.group_size)
            if diff is not None:
                raise EncodeError(
                    f"GPU parity gate failed for {name} on corpus case {case!r}: {diff}",
                    rule="spec Sections 7 and 12",
                    kind="encoder_disagreement",
                    hint="the GPU encoder is not bit-identical to the oracle on this machine; "
                    "convert with --device cpu and report the GPU, driver and torch version",
                )


def spot_check_rows(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt_name: str,
    encoded: GroupedCodes,
    *,
    tensor: str | None = None,
    seed: int = 0,
    rows: int = 4,
    backend: str = "numpy",
) -> int:
    """Re-encode ``rows`` random rows with ``backend``; raise on any difference.  Returns the
    number of rows checked."""
    from . import encode_grouped_words

    fmt = lookup_format(fmt_name)
    assert fmt.group_size is not None
    n = words.shape[0]
    pick = np.sort(np.random.default_rng(seed).choice(n, size=min(rows, n), replace=False))
    sample = np.ascontiguousarray(words[pick])
    ref = encode_grouped_words(sample, source_dtype, fmt, backend=backend, tensor=tensor)
    got = GroupedCodes(codes=encoded.codes[pick], scales=encoded.scales[pick])
    diff = first_difference(ref, got, fmt.group_size)
    if diff is not None:
        raise EncodeError(
            f"re-encoding sampled rows {pick.tolist()} with the {backend} backend differs: {diff}",
            tensor=tensor,
            rule="spec Section 7 parity",
            kind="encoder_disagreement",
            hint="the fast encoder disagrees with the reference; nothing was written",
        )
    return int(pick.size)
