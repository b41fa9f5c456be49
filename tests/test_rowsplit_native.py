"""The C row-split packer (ninfer_convert/_rowsplit.c) writes exactly Layout.pack's bytes,
compares like a byte comparison, and rejects the values grouped_problems rejects.

Skipped when the packer was not built (no C compiler); CI sets NINFER_REQUIRE_NATIVE=1 so that
there a missing packer is an import error, not a skip.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_convert.derive.fused import encode_pack_grouped, equals_packed_grouped
from ninfer_convert.errors import UsageError
from ninfer_convert.formats import FORMATS, NumericFormat
from ninfer_convert.layouts import lookup_layout
from ninfer_convert.layouts.row_split import (
    ROW_SPLIT_K128_V1,
    BlockResult,
    native_packer_available,
)
from ninfer_convert.logical import GroupedCodes
from ninfer_convert.validate import grouped_problems

pytestmark = pytest.mark.skipif(not native_packer_available(), reason="C packer not built")
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
# Row lengths around the 128-code padding and the group sizes: one code, partial groups,
# exact multiples, one past, and a long row.
KS = [1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 256, 1000]


def _random_block(
    fmt: NumericFormat, n: int, k: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Legal codes over the whole interval and legal scales, some groups all-zero under +0."""
    assert fmt.group_size is not None and fmt.qmin is not None and fmt.qmax is not None
    groups = -(-k // fmt.group_size)
    codes = rng.integers(fmt.qmin, fmt.qmax + 1, size=(n, k), dtype=np.int16).astype(np.int8)
    scales = rng.integers(0x0001, 0x7C00, size=(n, groups), dtype=np.uint16)
    zero = rng.random((n, groups)) < 0.2
    scales[zero] = 0
    for r, g in zip(*np.nonzero(zero), strict=True):
        codes[r, g * fmt.group_size : (g + 1) * fmt.group_size] = 0
    return codes, scales


def _native_planes(fmt: NumericFormat, codes: np.ndarray, scales: np.ndarray) -> list[np.ndarray]:
    specs = ROW_SPLIT_K128_V1.planes(fmt, codes.shape)
    planes = [np.full(spec.nbytes, 0xA5, dtype=np.uint8) for spec in specs]  # no free zeros
    result = ROW_SPLIT_K128_V1.pack_rows_into(fmt, codes, scales, planes)
    assert result is BlockResult.DONE
    return planes


def _assert_same_planes(got: list[np.ndarray], want: list[np.ndarray], k: int) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        if a.tobytes() != b.tobytes():
            at = int(np.argmax(a != b))
            pytest.fail(
                f"plane {i}, K={k}: first differing byte {at}: {a[at]:#04x} != {b[at]:#04x}"
            )


@pytest.mark.parametrize("name", GROUPED)
@pytest.mark.parametrize("k", KS)
def test_native_pack_writes_the_reference_bytes(name: str, k: int) -> None:
    fmt = FORMATS[name]
    codes, scales = _random_block(fmt, 5, k, np.random.default_rng(k))
    want = lookup_layout(fmt.layout).pack(fmt, GroupedCodes(codes, scales))
    _assert_same_planes(_native_planes(fmt, codes, scales), want, k)


@pytest.mark.parametrize("name", GROUPED)
def test_native_pack_every_code_in_every_position_of_a_packed_byte(name: str) -> None:
    # Each row holds one legal code at every position: rows cycle the code through all 8
    # positions of every field (2 per lo4 byte, 4 per hi2 byte, 8 per hi1 byte).
    fmt = FORMATS[name]
    assert fmt.qmin is not None and fmt.qmax is not None
    legal = np.arange(fmt.qmin, fmt.qmax + 1, dtype=np.int16).astype(np.int8)
    k = 128
    rows = [np.roll(np.resize(legal, k), shift) for shift in range(8)]
    codes = np.stack(rows)
    scales = np.full((len(rows), k // (fmt.group_size or 1)), 0x3C00, dtype=np.uint16)
    want = lookup_layout(fmt.layout).pack(fmt, GroupedCodes(codes, scales))
    _assert_same_planes(_native_planes(fmt, codes, scales), want, k)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(GROUPED),
    n=st.integers(1, 6),
    k=st.integers(1, 400),
    seed=st.integers(0, 2**32 - 1),
)
def test_native_pack_matches_reference_on_random_blocks(
    name: str, n: int, k: int, seed: int
) -> None:
    fmt = FORMATS[name]
    codes, scales = _random_block(fmt, n, k, np.random.default_rng(seed))
    want = lookup_layout(fmt.layout).pack(fmt, GroupedCodes(codes, scales))
    _assert_same_planes(_native_planes(fmt, codes, scales), want, k)


@pytest.mark.parametrize("name", GROUPED)
def test_native_compare_finds_any_single_flipped_bit(name: str) -> None:
    fmt = FORMATS[name]
    codes, scales = _random_block(fmt, 3, 200, np.random.default_rng(7))
    planes = _native_planes(fmt, codes, scales)
    assert ROW_SPLIT_K128_V1.pack_rows_into(fmt, codes, scales, planes, compare=True) is (
        BlockResult.DONE
    )
    for i, plane in enumerate(planes):
        for at in (0, plane.size // 2, plane.size - 1):  # first row, middle, padding at the end
            for bit in (0, 7):
                changed = [p.copy() for p in planes]
                changed[i][at] ^= np.uint8(1 << bit)
                got = ROW_SPLIT_K128_V1.pack_rows_into(fmt, codes, scales, changed, compare=True)
                assert got is BlockResult.DIFFERENT, (i, at, bit)


def _invalid_cases(fmt: NumericFormat) -> list[tuple[str, np.ndarray, np.ndarray]]:
    assert fmt.qmin is not None and fmt.qmax is not None and fmt.group_size is not None
    codes, scales = _random_block(fmt, 2, 130, np.random.default_rng(3))
    scales[scales == 0] = 0x3C00  # no zero groups, so only the planted problem remains
    cases = []
    if fmt.qmin > -128:
        c = codes.copy()
        c[1, 129] = fmt.qmin - 1
        cases.append(("code below qmin", c, scales))
    if fmt.qmax < 127:
        c = codes.copy()
        c[0, 5] = fmt.qmax + 1
        cases.append(("code above qmax", c, scales))
    for word, what in ((0x8001, "negative scale"), (0x8000, "-0 scale"), (0x7C00, "inf scale"),
                       (0x7E00, "NaN scale")):  # fmt: skip
        s = scales.copy()
        s[1, 2] = word
        cases.append((what, codes, s))
    s, c = scales.copy(), codes.copy()
    s[0, 1] = 0
    c[0, fmt.group_size : 2 * fmt.group_size] = 0
    c[0, fmt.group_size + 3] = 1
    cases.append(("non-zero code under a +0 scale", c, s))
    return cases


@pytest.mark.parametrize("name", GROUPED)
@pytest.mark.parametrize("compare", [False, True])
def test_native_pack_rejects_what_grouped_problems_rejects(name: str, compare: bool) -> None:
    fmt = FORMATS[name]
    for what, codes, scales in _invalid_cases(fmt):
        assert grouped_problems(fmt, codes, scales), what  # the rule the packer mirrors
        planes = [np.zeros(s.nbytes, np.uint8) for s in ROW_SPLIT_K128_V1.planes(fmt, codes.shape)]
        got = ROW_SPLIT_K128_V1.pack_rows_into(fmt, codes, scales, planes, compare=compare)
        assert got is BlockResult.INVALID, what


def test_native_pack_refuses_planes_of_the_wrong_size() -> None:
    fmt = FORMATS["Q4G64_F16S"]
    codes, scales = _random_block(fmt, 2, 128, np.random.default_rng(0))
    planes = [np.zeros(s.nbytes, np.uint8) for s in ROW_SPLIT_K128_V1.planes(fmt, codes.shape)]
    with pytest.raises(ValueError, match="row stride"):
        ROW_SPLIT_K128_V1.pack_rows_into(fmt, codes, scales, [planes[0][:-1], planes[1]])
    with pytest.raises(ValueError, match="one buffer per plane"):
        ROW_SPLIT_K128_V1.pack_rows_into(fmt, codes, scales, planes[:1])
    with pytest.raises(BufferError):  # stored planes may be read-only, outputs may not
        ROW_SPLIT_K128_V1.pack_rows_into(fmt, codes, scales, [bytes(p) for p in planes])


@pytest.mark.parametrize("name", GROUPED)
def test_fused_paths_with_and_without_the_native_packer_agree(name: str) -> None:
    rng = np.random.default_rng(11)
    words = (rng.standard_normal((9, 300)).astype(np.float32).view(np.uint32) >> 16).astype(
        np.uint16
    )
    native = encode_pack_grouped(words, "BF16", name, chunk_elements=600)
    numpy_path = encode_pack_grouped(words, "BF16", name, chunk_elements=600, kernel="numpy")
    _assert_same_planes(native, numpy_path, 300)
    assert equals_packed_grouped(words, "BF16", name, native, kernel="numpy")
    assert equals_packed_grouped(words, "BF16", name, numpy_path)


def test_native_pack_refuses_codes_and_scales_it_would_misread() -> None:
    fmt = FORMATS["Q4G64_F16S"]
    codes, scales = _random_block(fmt, 2, 128, np.random.default_rng(1))
    planes = [np.zeros(s.nbytes, np.uint8) for s in ROW_SPLIT_K128_V1.planes(fmt, codes.shape)]
    bad = [
        (codes.astype(np.int16), scales, "dtype int16"),
        (codes, np.zeros((2, 3), np.uint16), r"shape \[2, 3\]"),
        (codes, scales.astype(">u2"), "native byte order"),
        (np.asfortranarray(codes), scales, "C-contiguous"),
        (codes[:, ::2], scales[:, :1], "C-contiguous"),
    ]
    for c, s, message in bad:
        with pytest.raises(UsageError, match=message):
            ROW_SPLIT_K128_V1.pack_rows_into(fmt, c, s, planes)


def test_native_pack_sizes_cannot_overflow() -> None:
    from ninfer_convert import _rowsplit

    # n * k and every plane size would wrap around in 64-bit arithmetic: refused, not packed.
    for n, k in ((1 << 62, 4), (4, 1 << 62), (1 << 40, 1 << 30)):
        with pytest.raises(ValueError, match="inconsistent arguments"):
            _rowsplit.pack_rows(bytearray(8), bytearray(8), n, k, 32, 8, -127, 127,
                                (bytearray(0), bytearray(0)), False)  # fmt: skip
