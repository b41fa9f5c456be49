"""The Section 12 boundary corpus for MAXABS_F16_RECIP_RNE_V1 parity.

Contract: :func:`boundary_corpus` returns named [N, K] binary32 word matrices that exercise
every boundary the spec names: reciprocal-multiply versus direct division, positive and negative
ties-to-even, the minimum-subnormal rescue, binary16 scale rounding and its overflow edge,
partial last groups, all-zero groups and signed zeros, the qmax (not |qmin|) denominator and the
W8 clamp.  Every matrix encodes successfully; :func:`failing_corpus` lists inputs the encoder must
refuse.  The tests, the converter's CUDA parity gate and the verifier all use this one corpus.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..formats import NumericFormat

__all__ = ["RECIP_VS_DIV_CASES", "boundary_corpus", "failing_corpus", "mse_boundary_corpus"]

U32 = npt.NDArray[np.uint32]

# (qmax, binary16 scale word, binary32 word of x): round(x * RNE32(1/s)) differs from
# round(x / s).  A group [s * qmax, x] has amax = s * qmax (exact), so its scale is exactly s.
RECIP_VS_DIV_CASES: tuple[tuple[int, int, int], ...] = (
    (7, 0x418A, 0x4173B7FF),  # s = 2.76953125, x ~ 15.2324; recip -> 6, div -> 5
    (7, 0x4788, 0x41D2DFFF),  # s = 7.53125, x ~ 26.3594; recip -> 4, div -> 3
    (15, 0x47DF, 0x42D484FF),  # s = 7.87109375; recip -> 14, div -> 13
    (15, 0x3FA8, 0x4165B000),  # s = 1.9140625, x = 14.35546875; recip -> 7, div -> 8
    (31, 0x4675, 0x404EA001),  # s = 6.45703125; recip -> 0, div -> 1
    (31, 0x469B, 0x4335A680),  # s = 6.60546875; recip -> 27, div -> 28
    (127, 0x4741, 0x43E9F041),  # s = 7.25390625; recip -> 64, div -> 65
    (127, 0x47A2, 0x43781101),  # s = 7.6328125; recip -> 32, div -> 33
)


def _f32(values: list[float] | npt.NDArray[np.float64]) -> U32:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def _rows(rows: list[list[float]], k: int) -> U32:
    out = np.zeros((len(rows), k), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out.view(np.uint32)


def boundary_corpus(fmt: NumericFormat) -> list[tuple[str, U32]]:
    """Named [N, K] binary32 word matrices for ``fmt`` (a grouped format)."""
    assert fmt.group_size is not None and fmt.qmax is not None and fmt.qmin is not None
    g, qmax = fmt.group_size, fmt.qmax
    cases: list[tuple[str, U32]] = []

    # Reciprocal-multiply versus division, for this format's qmax.
    recip_rows = []
    for case_qmax, s_word, x_word in RECIP_VS_DIV_CASES:
        if case_qmax != qmax:
            continue
        s = float(np.array([s_word], dtype=np.uint16).view(np.float16)[0])
        x = float(np.array([x_word], dtype=np.uint32).view(np.float32)[0])
        recip_rows.append([s * qmax, x, -x])
    cases.append(("reciprocal-vs-division", _rows(recip_rows, g)))

    # Ties: amax = qmax makes scale 1.0 exactly, so x * inv = x and k + 0.5 is an exact tie.
    ties = [float(qmax)] + [v for k in range(qmax) for v in (k + 0.5, -(k + 0.5))]
    ties = ties[:g]
    cases.append(("ties-to-even", _rows([ties], g)))
    cases.append(("spec-rounding-examples", _rows([[qmax, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5]], g)))

    # Underflow rescue: amax / qmax below half of 2^-24 rounds to binary16 +0 -> 0x0001.
    tiny = float.fromhex("0x1p-149")  # smallest binary32 subnormal
    cases.append(
        (
            "subnormal-rescue",
            _rows(
                [[tiny], [-tiny, tiny], [float.fromhex("0x1p-30"), -float.fromhex("0x1p-31")]], g
            ),
        )
    )
    # Scales that land on binary16 subnormals and the normal/subnormal edge.
    edge = [
        float.fromhex("0x1p-24") * qmax,
        float.fromhex("0x1p-14") * qmax,
        float.fromhex("0x1.ff8p-15") * qmax,
        float.fromhex("0x1.ffcp-15") * qmax,
    ]
    cases.append(("binary16-subnormal-scales", _rows([[v, v / 3, -v / 7] for v in edge], g)))
    # Largest scales that still fit: 65504 = 0x1.ffcp15, and 65519, the largest integer that
    # rounds down to it (65520 is the halfway point to 2^16 and rounds to inf).  Both products
    # with qmax are below 2^24, so amax and amax / qmax are exact in binary32.
    big = [65504.0 * qmax, 65519.0 * qmax]
    cases.append(("binary16-max-scale", _rows([[v, -v / 2, v / 3] for v in big], g)))

    # Partial last group: K not a multiple of G, each group computed from its own values.
    k = g * 2 + 5
    rng = np.random.default_rng(12)
    part = rng.standard_normal((3, k)).astype(np.float32)
    part[:, -5:] *= 1000  # the partial group's scale must come from its 5 values only
    cases.append(("partial-last-group", part.view(np.uint32)))

    # All-zero groups, signed zeros, and a zero group beside a non-zero one.
    zeros = np.zeros((2, 2 * g), dtype=np.float32)
    zeros[0, 1] = -0.0
    zeros[1, g:] = np.linspace(-1, 1, g, dtype=np.float32)
    cases.append(("all-zero-and-signed-zero", zeros.view(np.uint32)))

    # qmax (not |qmin|) is the denominator; W8 clamps at -127 (never -128).
    cases.append(
        ("qmax-denominator-and-clamp", _rows([[-float(qmax), 1.0], [1.0, -qmax - 0.5]], g))
    )
    # The clamp is forced only when the binary16 scale rounds *down* far: with amax =
    # (qmax + 2) * 2^-24 the scale is 2^-24 (the smallest subnormal), so x * inv = -(qmax + 2)
    # lies below qmin and must clamp; for W8, -2^-17 gives -128 unclamped (legal code: -127).
    unit = float.fromhex("0x1p-24")
    cases.append(
        (
            "subnormal-scale-clamp",
            _rows([[-(qmax + 2) * unit], [(qmax + 2) * unit], [-float.fromhex("0x1p-17")]], g),
        )
    )

    # Mixed magnitudes across the binary32 range.
    mags = rng.standard_normal((8, 3 * g)).astype(np.float32)
    mags *= np.float32(2.0) ** rng.integers(-140, 12, size=(8, 1)).astype(np.float32)
    cases.append(("mixed-magnitudes", mags.view(np.uint32)))
    return cases


def failing_corpus(fmt: NumericFormat) -> list[tuple[str, U32, int, int]]:
    """(name, matrix, failing row, failing group) the encoder must refuse."""
    assert fmt.group_size is not None and fmt.qmax is not None
    g = fmt.group_size
    out = []
    for name, bad in (("nan", np.nan), ("+inf", np.inf), ("-inf", -np.inf)):
        m = np.ones((3, g + 3), dtype=np.float32)
        m[2, g + 1] = bad
        out.append((name, m.view(np.uint32), 2, 1))
    over = np.ones((2, 2 * g), dtype=np.float32)
    over[1, g] = np.float32(65520.0 * fmt.qmax)  # amax/qmax rounds to binary16 inf
    out.append(("scale-overflow", over.view(np.uint32), 1, 1))
    return out


def mse_boundary_corpus(fmt: NumericFormat) -> list[tuple[str, U32]]:
    """Named [N, K] binary32 word matrices for MSE_F16_SEARCH_V1 parity: the canonical corpus
    (every Section 7 boundary is also a boundary of candidate 0) plus the profile's own cases:
    a negative maximum that the |qmin| candidate represents exactly (code -8 for Q4, -32 for
    Q6; W8 stays at -127), an exact tie between distinct candidate scales (both reconstruct the
    group without error: the lower index must win), candidates that overflow binary16 beside a
    finite canonical scale, candidates on and across binary16 subnormals, values spanning the
    binary32 range in one group, and Gaussian rows with a partial last group."""
    assert fmt.group_size is not None and fmt.qmax is not None and fmt.qmin is not None
    g, qmax, qmin = fmt.group_size, fmt.qmax, fmt.qmin
    cases = list(boundary_corpus(fmt))
    steps = [float(v) for v in range(qmin, qmax + 1)][:g]
    cases.append(("negative-maximum-uses-qmin", _rows([steps, [float(qmin), 3.0, 1.0]], g)))
    # For Q4, [4.25, 1, -7.875] has the same binary64 error 0.078125 under scales 1.125
    # (candidates 0 and 5) and 1.0 (candidate 9): only the lower-index rule picks 1.125.
    ties = [[-float(qmax)], [-float(qmax)] * 2, [4.25, 1.0, -7.875]]
    cases.append(("tie-between-candidates", _rows(ties, g)))
    cases.append(
        ("candidate-overflow", _rows([[65504.0 * qmax, 1.0, -3.0], [65519.0 * qmax, -2.0]], g))
    )
    unit = float.fromhex("0x1p-24")
    sub = [[k * unit * qmax, -k * unit, k * unit * 0.3] for k in (0.25, 0.5, 1, 3, 5, 1023, 1024)]
    cases.append(("subnormal-candidate-scales", _rows(sub, g)))
    span = [1.0, float.fromhex("0x1p-149"), -float.fromhex("0x1p-126"), 1e-30, -0.49, 0.51]
    cases.append(("binary32-range-in-one-group", _rows([span, [-x for x in span]], g)))
    rng = np.random.default_rng(16)
    gauss = rng.standard_normal((4, 3 * g + 7)).astype(np.float32)
    gauss[1] *= np.float32(1e-6)
    gauss[2, :g] = 0.0
    cases.append(("gaussian-with-partial-group", gauss.view(np.uint32)))
    return cases
