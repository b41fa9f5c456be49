"""Value-invariant validators of spec Sections 3.3, 3.4, 5 and 6.1, side by side per format.

Contract: each ``*_problems`` function inspects logical words (see :mod:`.logical`) and returns
a list of :class:`~ninfer_convert.errors.ValueInvariantError`, one per kind of violation,
each naming the tensor, row, group/column and the offending word; an empty list means valid.
``validate_logical`` raises the first problem.  Checks are vectorised; only the first offender
of each kind is described, with the total count, so a corrupt 100 M-element tensor still gives a
short, exact report.

The value rules themselves are the small predicates below (``nvfp4_divisor_ok``,
``nvfp4_scale_invalid``, ``fp8_code_invalid``, ``bf16_row_scale_invalid``,
``zero_row_nonzero``): each rule is written once, here, and the copy paths
(:mod:`.recipe.copy_paths`) call the same predicates when they refuse a source, wording the
refusal for the source tensor.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .errors import ValueInvariantError
from .formats import Category, NumericFormat, lookup_format
from .ieee import BFLOAT16, BINARY16
from .layouts.base import ceil_div
from .logical import DirectWords, FP8RowWords, GroupedCodes, LogicalTensor, NVFP4Words
from .words import e4m3fn_is_nan

__all__ = [
    "bf16_row_scale_invalid",
    "fp8_code_invalid",
    "fp8_row_problems",
    "grouped_problems",
    "logical_problems",
    "nvfp4_divisor_ok",
    "nvfp4_problems",
    "nvfp4_scale_invalid",
    "validate_logical",
    "zero_row_nonzero",
]


# ---------------------------------------------------------------------------------------------
# The value rules (spec Sections 3.3 and 3.4), one predicate each


def nvfp4_divisor_ok(word: int) -> bool:
    """Section 3.3: the NVFP4 weight divisor d_w is a finite, strictly positive binary32 word
    (a ModelOpt multiplier, whose reciprocal becomes d_w, is held to the same rule)."""
    d = word & 0xFFFFFFFF
    return not (d >> 31) and ((d >> 23) & 0xFF) != 0xFF and d != 0


def nvfp4_scale_invalid(scales: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    """Section 3.3: True where an E4M3FN block scale is not a sign-zero finite word (+0 is
    valid; -0, negatives and NaN are not)."""
    return np.asarray(((scales & 0x80) != 0) | e4m3fn_is_nan(scales))


def fp8_code_invalid(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
    """Section 3.4: True where an E4M3FN weight code is NaN (0x7f, 0xff)."""
    return e4m3fn_is_nan(codes)


def bf16_row_scale_invalid(scales: npt.NDArray[np.uint16]) -> npt.NDArray[np.bool_]:
    """Section 3.4: True where a BF16 row scale is not +0 or finite positive."""
    sign, exp = BFLOAT16.sign_mask, BFLOAT16.exp_mask
    return np.asarray(((scales & sign) != 0) | ((scales & exp) == exp))


def zero_row_nonzero(
    codes: npt.NDArray[np.uint8], scales: npt.NDArray[np.uint16]
) -> npt.NDArray[np.bool_] | None:
    """Section 3.4: True where a row whose scale is +0 holds a code other than +-0; None when
    no row has a +0 scale (the common case, decided without a codes-sized mask)."""
    zero_rows = scales == 0
    if not zero_rows.any():
        return None
    return np.asarray(((codes & 0x7F) != 0) & zero_rows[:, None])


def _report(
    mask: npt.NDArray[np.bool_],
    tensor: str | None,
    what: str,
    describe: str,
    words: npt.NDArray[np.generic],
    *,
    group: int | None = None,
) -> list[ValueInvariantError]:
    if not mask.any():
        return []
    count = int(np.count_nonzero(mask))
    idx = tuple(int(i) for i in np.argwhere(mask)[0])
    word = int(words[idx])
    width = max(2, words.dtype.itemsize * 2)
    if len(idx) == 2:
        row, col = idx
        loc = f"row {row}, {what} {col}"
        if group is not None:
            loc += f" (group {col // group})"
    else:
        loc = f"{what} {idx[0]}"
    return [
        ValueInvariantError(
            f"{loc}: word 0x{word & ((1 << (8 * words.dtype.itemsize)) - 1):0{width}x} "
            f"{describe} ({count} such word{'s' if count != 1 else ''})",
            tensor=tensor,
        )
    ]


def grouped_problems(
    fmt: NumericFormat,
    codes: npt.NDArray[np.int8],
    scales: npt.NDArray[np.uint16],
    tensor: str | None = None,
) -> list[ValueInvariantError]:
    """Section 5/6.1: legal codes (W8 never -128), +0 or finite positive binary16 scales, and
    all-zero codes under a +0 scale."""
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    n, k = codes.shape
    n_groups = ceil_div(k, fmt.group_size)
    out: list[ValueInvariantError] = []
    if scales.shape != (n, n_groups):
        return [
            ValueInvariantError(
                f"scale shape {list(scales.shape)} does not match codes {list(codes.shape)} with "
                f"G={fmt.group_size}",
                tensor=tensor,
            )
        ]
    # Two reductions decide the common (valid) case without a tensor-sized mask.
    if codes.size and (int(codes.min()) < fmt.qmin or int(codes.max()) > fmt.qmax):
        illegal = (codes < fmt.qmin) | (codes > fmt.qmax)
    else:
        illegal = np.zeros((0, 0), dtype=bool)
    out += _report(
        illegal,
        tensor,
        "column",
        f"is outside the legal code interval [{fmt.qmin}, {fmt.qmax}]",
        codes,
        group=fmt.group_size,
    )
    # +0 (0x0000) or finite positive: sign bit clear and exponent field not all ones.
    sign, exp = BINARY16.sign_mask, BINARY16.exp_mask
    bad_scale = ((scales & sign) != 0) | ((scales & exp) == exp)
    out += _report(
        bad_scale,
        tensor,
        "group",
        "is not a valid scale (must be +0 or a finite positive binary16)",
        scales,
    )
    zero_scale = scales == 0
    if zero_scale.any():
        padded_k = n_groups * fmt.group_size
        nz = np.zeros((n, padded_k), dtype=bool)
        nz[:, :k] = codes != 0
        group_has_code = nz.reshape(n, n_groups, fmt.group_size).any(axis=2)
        bad = zero_scale & group_has_code
        out += _report(bad, tensor, "group", "is a +0 scale over non-zero codes", scales)
    return out


def nvfp4_problems(
    codes: npt.NDArray[np.uint8],
    scales: npt.NDArray[np.uint8],
    divisor: int,
    tensor: str | None = None,
) -> list[ValueInvariantError]:
    """Section 3.3: E2M1 words in 0..15, E4M3FN scales sign-zero and not NaN, d_w finite > 0."""
    out: list[ValueInvariantError] = []
    n, k = codes.shape
    if k % 16 or scales.shape != (n, k // 16):
        return [
            ValueInvariantError(
                f"NVFP4 needs K % 16 == 0 and scales [N, K/16]; got codes {list(codes.shape)}, "
                f"scales {list(scales.shape)}",
                tensor=tensor,
            )
        ]
    out += _report(codes > 0x0F, tensor, "column", "is not a 4-bit E2M1 word", codes)
    invalid = nvfp4_scale_invalid(scales)
    negative = (scales & 0x80) != 0
    out += _report(
        invalid & negative, tensor, "group", "is a negative (or -0) E4M3FN block scale", scales
    )
    out += _report(invalid & ~negative, tensor, "group", "is a NaN E4M3FN block scale", scales)
    if not nvfp4_divisor_ok(divisor):
        out.append(
            ValueInvariantError(
                f"weight divisor d_w word 0x{divisor & 0xFFFFFFFF:08x} must be finite and "
                "strictly positive",
                tensor=tensor,
            )
        )
    return out


def fp8_row_problems(
    codes: npt.NDArray[np.uint8], scales: npt.NDArray[np.uint16], tensor: str | None = None
) -> list[ValueInvariantError]:
    """Section 3.4: codes not NaN, BF16 row scales +0 or finite positive, +0 rows hold only
    signed-zero codes."""
    n = codes.shape[0]
    if scales.shape != (n,):
        return [
            ValueInvariantError(
                f"row scales {list(scales.shape)} do not match codes {list(codes.shape)}",
                tensor=tensor,
            )
        ]
    out = _report(fp8_code_invalid(codes), tensor, "column", "is a NaN E4M3FN code", codes)
    out += _report(
        bf16_row_scale_invalid(scales),
        tensor,
        "row",
        "is not a valid BF16 row scale (must be +0 or finite positive)",
        scales,
    )
    bad = zero_row_nonzero(codes, scales)
    if bad is not None:
        out += _report(
            bad, tensor, "column", "is a non-zero code in a row whose scale is +0", codes
        )
    return out


def logical_problems(
    fmt: str | NumericFormat, logical: LogicalTensor, tensor: str | None = None
) -> list[ValueInvariantError]:
    """Dispatch on the format's category; direct words are valid by definition (Section 3.1)."""
    entry = lookup_format(fmt)
    if entry.category is Category.DIRECT and isinstance(logical, DirectWords):
        return []
    if entry.category is Category.GROUPED and isinstance(logical, GroupedCodes):
        return grouped_problems(entry, logical.codes, logical.scales, tensor)
    if entry.category is Category.BLOCK_SCALED and isinstance(logical, NVFP4Words):
        return nvfp4_problems(logical.codes, logical.scales, logical.divisor, tensor)
    if entry.category is Category.ROW_SCALED and isinstance(logical, FP8RowWords):
        return fp8_row_problems(logical.codes, logical.scales, tensor)
    return [
        ValueInvariantError(
            f"{type(logical).__name__} is not the logical representation of {entry.name}",
            tensor=tensor,
        )
    ]


def validate_logical(
    fmt: str | NumericFormat, logical: LogicalTensor, tensor: str | None = None
) -> None:
    problems = logical_problems(fmt, logical, tensor)
    if problems:
        raise problems[0]
