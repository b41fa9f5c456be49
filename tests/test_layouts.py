"""Storage layouts: geometry, bit order, bit-exact round trips, padding, swizzle, row access."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from artifact_fixtures import ALL_FORMATS, DIRECT, GROUPED, logical_equal, make_logical
from hypothesis import given
from hypothesis import strategies as st

from ninfer_convert.errors import FormatError, UsageError, ValueInvariantError
from ninfer_convert.formats import FORMATS
from ninfer_convert.layouts import (
    LAYOUTS,
    check_combination,
    layout_for,
    lookup_layout,
    swizzle_offset,
    swizzle_scales,
    unswizzle_scales,
)
from ninfer_convert.logical import DirectWords, FP8RowWords, GroupedCodes, NVFP4Words

ROW_SPLIT = LAYOUTS["row-split-k128-v1"]
BLOCK = LAYOUTS["blockscale-k16-m128x4-v1"]
CONTIG = LAYOUTS["contiguous-le-v1"]
ROWSCALE = LAYOUTS["row-scale-v1"]

# Shapes that hit partial groups, K not a multiple of 128, N not a multiple of 128, one row.
MATRIX_SHAPES = [(1, 1), (1, 64), (3, 70), (2, 128), (5, 129), (130, 200), (1, 300), (129, 33)]
NVFP4_SHAPES = [(1, 16), (3, 48), (127, 64), (128, 80), (130, 16), (257, 272)]


# ---------------------------------------------------------------------------------------------
# Registry


def test_registry_complete() -> None:
    """Every format names a registered layout that accepts it, and every layout is used."""
    assert list(LAYOUTS) == [
        "contiguous-le-v1",
        "row-split-k128-v1",
        "blockscale-k16-m128x4-v1",
        "row-scale-v1",
    ]
    used = set()
    for fmt in FORMATS.values():
        layout = lookup_layout(fmt.layout)
        assert fmt.name in layout.formats
        assert check_combination(fmt.name, fmt.layout) is layout
        assert layout_for(fmt.name) is layout
        used.add(layout.name)
    assert used == set(LAYOUTS)
    for name, layout in LAYOUTS.items():
        assert layout.name == name
        assert layout.formats <= set(FORMATS)


@pytest.mark.parametrize("name", ["", "contiguous-le-v2", "Contiguous-le-v1", None, 3])
def test_unknown_layout(name: object) -> None:
    with pytest.raises(FormatError, match="registered layouts: contiguous-le-v1"):
        lookup_layout(name)


@pytest.mark.parametrize(
    ("fmt", "layout"),
    [(f, lay) for f in ALL_FORMATS for lay in LAYOUTS if FORMATS[f].layout != lay],
)
def test_unsupported_combinations(fmt: str, layout: str) -> None:
    with pytest.raises(FormatError, match="cannot be stored"):
        check_combination(fmt, layout)
    with pytest.raises(FormatError):
        LAYOUTS[layout].planes(fmt, (2, 32))


def test_unknown_format() -> None:
    with pytest.raises(FormatError, match="unknown numeric format"):
        check_combination("FP16", "contiguous-le-v1")
    with pytest.raises(FormatError):
        CONTIG.planes("INT32", (1,))


# ---------------------------------------------------------------------------------------------
# Geometry


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("shape", MATRIX_SHAPES)
def test_row_split_geometry(fmt: str, shape: tuple[int, int]) -> None:
    n, k = shape
    f = FORMATS[fmt]
    kp = _ceil(k, 128) * 128
    assert f.group_size is not None
    code_planes = {
        4: [("codes", kp // 2)],
        5: [("lo4", kp // 2), ("hi1", kp // 8)],
        6: [("lo4", kp // 2), ("hi2", kp // 4)],
        8: [("codes", kp)],
    }[f.code_bits]
    expected = [*code_planes, ("scales", 2 * kp // f.group_size)]
    planes = ROW_SPLIT.planes(fmt, shape)
    assert [(p.name, p.nbytes) for p in planes] == [(nm, n * stride) for nm, stride in expected]
    assert ROW_SPLIT.encoded_size(fmt, shape) == n * sum(s for _, s in expected)
    assert ROW_SPLIT.physical_extents(fmt, shape) == (n, kp)
    assert ROW_SPLIT.row_strides(fmt, shape) == [s for _, s in expected]  # type: ignore[attr-defined]
    # Full groups with K a multiple of 128: exactly the logical bit cost of spec Section 6.3.
    if k % 128 == 0:
        assert ROW_SPLIT.encoded_size(fmt, shape) * 8 == n * k * f.logical_bits_per_weight


@pytest.mark.parametrize("shape", NVFP4_SHAPES)
def test_blockscale_geometry(shape: tuple[int, int]) -> None:
    n, k = shape
    kc = k // 16
    planes = BLOCK.planes("NVFP4", shape)
    assert [(p.name, p.nbytes) for p in planes] == [
        ("codes", n * k // 2),
        ("scales", _ceil(n, 128) * 128 * _ceil(kc, 4) * 4),
        ("divisor", 4),
    ]


@pytest.mark.parametrize("fmt", DIRECT)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 0, 2), (2, 3, 4, 5)])
def test_contiguous_geometry(fmt: str, shape: tuple[int, ...]) -> None:
    width = FORMATS[fmt].code_bits // 8
    assert CONTIG.encoded_size(fmt, shape) == int(np.prod(shape, dtype=object)) * width
    assert CONTIG.physical_extents(fmt, shape) == shape


def test_row_scale_geometry() -> None:
    fmt = "FP8_E4M3FN_ROW_BF16S"
    assert [(p.name, p.nbytes) for p in ROWSCALE.planes(fmt, (3, 5))] == [
        ("codes", 15),
        ("scales", 6),
    ]


def test_sizes_are_python_ints_without_overflow() -> None:
    """Huge shapes: sizes computed with Python ints, never wrapped by numpy."""
    n, k = 1 << 20, (1 << 20) + 1
    size = ROW_SPLIT.encoded_size("W8G32_F16S", (n, k))
    kp = _ceil(k, 128) * 128
    assert size == n * kp + n * (kp // 32) * 2
    assert isinstance(size, int) and size > 1 << 40


@pytest.mark.parametrize(
    ("layout", "fmt", "shape"),
    [
        (ROW_SPLIT, "Q4G64_F16S", (64,)),
        (ROW_SPLIT, "Q4G64_F16S", (0, 64)),
        (ROW_SPLIT, "Q4G64_F16S", (2, 0)),
        (ROW_SPLIT, "W8G32_F16S", (2, 3, 4)),
        (BLOCK, "NVFP4", (2, 8)),
        (BLOCK, "NVFP4", (2, 24)),
        (BLOCK, "NVFP4", (0, 16)),
        (ROWSCALE, "FP8_E4M3FN_ROW_BF16S", (4,)),
        (CONTIG, "BF16", (-1,)),
        (CONTIG, "BF16", (1 << 41,)),
        (CONTIG, "BF16", (True, 2)),
        (CONTIG, "BF16", (2.0,)),
        (CONTIG, "BF16", (1,) * 17),
        (CONTIG, "BF16", "12"),
    ],
)
def test_bad_shapes(layout: object, fmt: str, shape: object) -> None:
    with pytest.raises(UsageError):
        layout.planes(fmt, shape)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Round trips


def _roundtrip(fmt: str, shape: tuple[int, ...], seed: int = 0) -> None:
    layout = layout_for(fmt)
    logical = make_logical(fmt, shape, seed)
    planes = layout.pack(fmt, logical)
    specs = layout.planes(fmt, shape)
    assert [p.size for p in planes] == [s.nbytes for s in specs]
    assert layout.padding_problems(fmt, shape, planes) == []
    # Unpack from immutable bytes and from memoryviews (what the reader passes).
    for bufs in ([bytes(p) for p in planes], [memoryview(bytes(p)) for p in planes]):
        assert logical_equal(layout.unpack(fmt, shape, bufs), logical)


@pytest.mark.parametrize("fmt", [*GROUPED, "FP8_E4M3FN_ROW_BF16S"])
@pytest.mark.parametrize("shape", MATRIX_SHAPES)
def test_matrix_roundtrip(fmt: str, shape: tuple[int, int]) -> None:
    _roundtrip(fmt, shape)


@pytest.mark.parametrize("shape", NVFP4_SHAPES)
def test_nvfp4_roundtrip(shape: tuple[int, int]) -> None:
    _roundtrip("NVFP4", shape)


@pytest.mark.parametrize("fmt", DIRECT)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (5,), (3, 70), (2, 0, 3), (2, 3, 4)])
def test_direct_roundtrip(fmt: str, shape: tuple[int, ...]) -> None:
    _roundtrip(fmt, shape)


@given(
    fmt=st.sampled_from([*GROUPED, "FP8_E4M3FN_ROW_BF16S", "NVFP4"]),
    n=st.integers(1, 140),
    k=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shape_roundtrip(fmt: str, n: int, k: int, seed: int) -> None:
    if fmt == "NVFP4":
        k = _ceil(k, 16) * 16
    _roundtrip(fmt, (n, k), seed)


def test_direct_words_bit_exact_specials() -> None:
    """NaN payloads, signalling NaNs, signed zeros, subnormals and integer extremes survive."""
    bf16 = np.array([0x0000, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x7FC1, 0x7F81, 0xFFFF], np.uint16)
    fp32 = np.array(
        [0x00000000, 0x80000000, 0x00000001, 0x7F800000, 0x7FA00001, 0xFFC00123, 0x7FBFFFFF],
        np.uint32,
    )
    i32 = np.array([-(2**31), -1, 0, 1, 2**31 - 1], np.int32)
    for fmt, words in (("BF16", bf16), ("FP32", fp32), ("I32", i32)):
        planes = CONTIG.pack(fmt, DirectWords(words))
        # Little-endian words in row-major order.
        assert bytes(planes[0]) == words.astype(words.dtype.newbyteorder("<")).tobytes()
        out = CONTIG.unpack(fmt, words.shape, planes)
        assert isinstance(out, DirectWords)
        assert out.words.dtype == np.dtype(FORMATS[fmt].word_dtype)
        assert out.words.tobytes() == words.tobytes()


def test_direct_scalar_and_big_endian_input() -> None:
    scalar = np.array(0x7FA00001, dtype=np.uint32).reshape(())
    planes = CONTIG.pack("FP32", DirectWords(scalar))
    assert bytes(planes[0]) == bytes.fromhex("0100a07f")
    big = np.array([0x1234, 0xABCD], dtype=">u2")
    assert bytes(CONTIG.pack("BF16", DirectWords(big))[0]) == bytes.fromhex("3412cdab")
    out = CONTIG.unpack("FP32", (), planes)
    assert isinstance(out, DirectWords) and out.words.shape == () and int(out.words) == 0x7FA00001


# ---------------------------------------------------------------------------------------------
# Bit order, pinned by hand


def test_row_split_q4_bit_order() -> None:
    codes = np.zeros((1, 3), np.int8)
    codes[0] = [1, -1, -8]  # u = 0x1, 0xF, 0x8
    scales = np.array([[0x3C00]], np.uint16)  # 1.0
    planes = ROW_SPLIT.pack("Q4G64_F16S", GroupedCodes(codes, scales))
    assert bytes(planes[0]) == bytes([0xF1, 0x08]) + bytes(62)
    assert bytes(planes[1]) == bytes([0x00, 0x3C]) + bytes(2)


def test_row_split_q5_bit_order() -> None:
    codes = np.array([[15, -16, -1, 0, 1, 2, 3, 4, -2]], np.int8)
    # u: 0x0F 0x10 0x1F 0x00 0x01 0x02 0x03 0x04 0x1E
    planes = ROW_SPLIT.pack("Q5G64_F16S", GroupedCodes(codes, np.array([[1]], np.uint16)))
    lo, hi, sc = (bytes(p) for p in planes)
    assert lo[:5] == bytes([0x0F, 0x0F, 0x21, 0x43, 0x0E]) and lo[5:] == bytes(59)
    # hi1: bit i of byte j = bit 4 of u[8j+i]: elements 1, 2 -> 0b110; element 8 -> byte 1 bit 0.
    assert hi == bytes([0x06, 0x01]) + bytes(14)
    assert sc == bytes([0x01, 0x00, 0x00, 0x00])


def test_row_split_q6_bit_order() -> None:
    codes = np.array([[-32, 31, -1, 16, 5]], np.int8)
    # u: 0x20 0x1F 0x3F 0x10 0x05 -> hi2 fields 2, 1, 3, 1, 0
    planes = ROW_SPLIT.pack("Q6G64_F16S", GroupedCodes(codes, np.array([[7]], np.uint16)))
    lo, hi, _ = (bytes(p) for p in planes)
    assert lo[:3] == bytes([0xF0, 0x0F, 0x05])
    assert hi[:2] == bytes([0b01_11_01_10, 0x00]) and hi[2:] == bytes(30)


def test_row_split_w8_bytes_and_two_rows() -> None:
    codes = np.array([[-127, 127, 0], [1, -1, 2]], np.int8)
    scales = np.array([[0x0001], [0x7BFF]], np.uint16)
    c, s = (bytes(p) for p in ROW_SPLIT.pack("W8G32_F16S", GroupedCodes(codes, scales)))
    assert c[:3] == bytes([0x81, 0x7F, 0x00]) and c[128:131] == bytes([0x01, 0xFF, 0x02])
    assert len(c) == 256 and c[3:128] == bytes(125)
    assert s == bytes([0x01, 0x00]) + bytes(6) + bytes([0xFF, 0x7B]) + bytes(6)


def test_row_split_exhaustive_code_words() -> None:
    """Every legal code of every grouped format survives pack/unpack at every phase position."""
    for fmt in GROUPED:
        f = FORMATS[fmt]
        assert f.qmin is not None and f.qmax is not None
        legal = np.arange(f.qmin, f.qmax + 1, dtype=np.int8)
        # Roll the code list over 8 rows so each code lands in each bit-phase of a byte.
        codes = np.stack([np.roll(legal, r) for r in range(8)])
        scales = np.zeros((8, _ceil(codes.shape[1], f.group_size or 1)), np.uint16)
        logical = GroupedCodes(codes, scales)
        out = ROW_SPLIT.unpack(fmt, codes.shape, ROW_SPLIT.pack(fmt, logical))
        assert logical_equal(out, logical)


def test_nvfp4_codes_nibble_order_and_divisor() -> None:
    codes = np.arange(16, dtype=np.uint8).reshape(1, 16)
    scales = np.array([[0x38]], np.uint8)
    c, s, d = (bytes(p) for p in BLOCK.pack("NVFP4", NVFP4Words(codes, scales, 0x3F800000)))
    assert c == bytes([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE])
    assert s == bytes([0x38]) + bytes(511)
    assert d == bytes.fromhex("0000803f")


def test_row_scale_bytes() -> None:
    codes = np.array([[0x00, 0x80, 0x7E], [0x01, 0xFE, 0x38]], np.uint8)
    scales = np.array([0x3F80, 0x0001], np.uint16)
    c, s = (bytes(p) for p in ROWSCALE.pack("FP8_E4M3FN_ROW_BF16S", FP8RowWords(codes, scales)))
    assert c == bytes([0x00, 0x80, 0x7E, 0x01, 0xFE, 0x38])
    assert s == bytes([0x80, 0x3F, 0x01, 0x00])


# ---------------------------------------------------------------------------------------------
# Swizzle


def _swizzle_by_formula(scales: np.ndarray) -> np.ndarray:
    """Independent implementation: scatter every scale to the normative offset."""
    n, kc = scales.shape
    size = _ceil(n, 128) * 128 * _ceil(kc, 4) * 4
    out = np.zeros(size, np.uint8)
    m, k = np.meshgrid(np.arange(n), np.arange(kc), indexing="ij")
    offsets = ((m // 128) * _ceil(kc, 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4
    offsets += k % 4
    out[offsets.reshape(-1)] = scales.reshape(-1)
    return out


def _swizzle_by_tiles(scales: np.ndarray) -> np.ndarray:
    """Second independent implementation: pad, cut 128x4 tiles, lay each tile out as [32,4,4]."""
    n, kc = scales.shape
    np_, kcp = _ceil(n, 128) * 128, _ceil(kc, 4) * 4
    padded = np.zeros((np_, kcp), np.uint8)
    padded[:n, :kc] = scales
    tiles = []
    for mt in range(np_ // 128):
        for kt in range(kcp // 4):
            tile = padded[mt * 128 : (mt + 1) * 128, kt * 4 : (kt + 1) * 4]  # [128, 4]
            # tile row m = q*32 + r  ->  stored at [r, q, c]
            tiles.append(tile.reshape(4, 32, 4).transpose(1, 0, 2).reshape(-1))
    return np.concatenate(tiles)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (128, 4), (129, 9), (300, 17), (256, 8)])
def test_swizzle_matches_formula_and_tiles(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(1)
    scales = rng.integers(1, 256, shape, dtype=np.uint8)
    sw = swizzle_scales(scales)
    assert np.array_equal(sw, _swizzle_by_formula(scales))
    assert np.array_equal(sw, _swizzle_by_tiles(scales))
    assert np.array_equal(unswizzle_scales(sw, *shape), scales)


def test_swizzle_offset_known_values() -> None:
    kc = 8  # two tile columns
    assert swizzle_offset(0, 0, kc) == 0
    assert swizzle_offset(0, 3, kc) == 3
    assert swizzle_offset(1, 0, kc) == 16
    assert swizzle_offset(31, 0, kc) == 31 * 16
    assert swizzle_offset(32, 0, kc) == 4
    assert swizzle_offset(127, 3, kc) == 31 * 16 + 3 * 4 + 3
    assert swizzle_offset(0, 4, kc) == 512
    assert swizzle_offset(128, 0, kc) == 2 * 512
    assert swizzle_offset(130, 5, kc) == 3 * 512 + 2 * 16 + 1
    # Every (m, k) of a padded 256 x 8 grid maps to a distinct byte: the swizzle is a bijection.
    offsets = {swizzle_offset(m, k, kc) for m, k in itertools.product(range(256), range(8))}
    assert offsets == set(range(256 * 8))


def test_swizzle_scalar_formula_matches_vector() -> None:
    n, kc = 200, 7
    scales = (np.arange(n * kc) % 251 + 1).astype(np.uint8).reshape(n, kc)
    sw = swizzle_scales(scales)
    for m, k in itertools.product(range(0, n, 7), range(kc)):
        assert sw[swizzle_offset(m, k, kc)] == scales[m, k]


# ---------------------------------------------------------------------------------------------
# Rows


@pytest.mark.parametrize("fmt", GROUPED)
def test_row_views_and_gathers(fmt: str) -> None:
    shape = (137, 200)
    logical = make_logical(fmt, shape, 3)
    assert isinstance(logical, GroupedCodes)
    planes = [memoryview(bytes(p)) for p in ROW_SPLIT.pack(fmt, logical)]
    selections: list[object] = [
        slice(0, 1),
        slice(136, 137),
        slice(5, 40),
        slice(None, None, 3),
        slice(100, 10, -7),
        range(3, 9),
        [136, 0, 5, 5, 77],
        np.array([2, 1], dtype=np.int64),
        np.array([9], dtype=np.uint16),
        [],
    ]
    for rows in selections:
        idx = np.arange(shape[0])[rows]  # type: ignore[index]
        got = ROW_SPLIT.unpack_rows(fmt, shape, planes, rows)  # type: ignore[attr-defined]
        assert np.array_equal(got.codes, logical.codes[idx]), rows
        assert np.array_equal(got.scales, logical.scales[idx]), rows
        assert got.codes.dtype == np.int8 and got.scales.dtype == np.uint16


def test_row_gather_reads_only_those_rows() -> None:
    """Rows other than the requested ones may be garbage without affecting the result."""
    fmt, shape = "Q5G64_F16S", (10, 130)
    logical = make_logical(fmt, shape, 4)
    assert isinstance(logical, GroupedCodes)
    planes = ROW_SPLIT.pack(fmt, logical)
    strides = ROW_SPLIT.row_strides(fmt, shape)  # type: ignore[attr-defined]
    poisoned = []
    for plane, stride in zip(planes, strides, strict=True):
        p = np.full_like(plane, 0xFF)
        for r in (2, 7):
            p[r * stride : (r + 1) * stride] = plane[r * stride : (r + 1) * stride]
        poisoned.append(p)
    got = ROW_SPLIT.unpack_rows(fmt, shape, poisoned, [7, 2])  # type: ignore[attr-defined]
    assert np.array_equal(got.codes, logical.codes[[7, 2]])
    assert np.array_equal(got.scales, logical.scales[[7, 2]])


@pytest.mark.parametrize("rows", [[10], [-1], [0.5], [[1, 2]], "ab", np.array([True])])
def test_row_gather_rejects_bad_rows(rows: object) -> None:
    fmt, shape = "Q4G64_F16S", (10, 64)
    planes = ROW_SPLIT.pack(fmt, make_logical(fmt, shape))
    with pytest.raises(UsageError):
        ROW_SPLIT.unpack_rows(fmt, shape, planes, rows)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Padding


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_layout_without_padding_reports_none_for_any_bytes(fmt: str) -> None:
    """The writer skips padding_problems where has_padding() is False: such a layout must
    report nothing whatever the plane bytes, and the layouts with padding bits say so."""
    layout = layout_for(fmt)
    shape = (130, 16) if fmt == "NVFP4" else (3, 70)
    planes = [np.full(s.nbytes, 0xFF, np.uint8) for s in layout.planes(fmt, shape)]
    if not layout.has_padding():
        assert layout.padding_problems(fmt, shape, planes) == []
    padded = {name for name, lay in LAYOUTS.items() if lay.has_padding()}
    assert padded == {"row-split-k128-v1", "blockscale-k16-m128x4-v1"}


@pytest.mark.parametrize("fmt", GROUPED)
def test_row_split_padding_detected(fmt: str) -> None:
    shape = (3, 70)  # K=70: codes 70..127 and scale slot 2 (Q) or 3 (W8) are padding
    planes = [p.copy() for p in ROW_SPLIT.pack(fmt, make_logical(fmt, shape))]
    strides = ROW_SPLIT.row_strides(fmt, shape)  # type: ignore[attr-defined]
    # The first padded position (k = 70) of row 1 in the first code plane.
    per = {4: 2, 5: 2, 6: 2, 8: 1}[FORMATS[fmt].code_bits]
    byte, bit = 70 // per, (70 % per) * (8 // per)
    planes[0][strides[0] + byte] |= np.uint8(1 << bit)
    problems = ROW_SPLIT.padding_problems(fmt, shape, planes)
    assert problems == [
        f"plane {ROW_SPLIT.planes(fmt, shape)[0].name!r} row 1 byte {byte}: padding bits are "
        f"0x{1 << bit:02x}, expected zero"
    ]
    # A logical bit just below K is not padding.
    clean = [p.copy() for p in ROW_SPLIT.pack(fmt, make_logical(fmt, shape))]
    clean[0][(69 // per)] ^= np.uint8(1 << ((69 % per) * (8 // per)))
    assert ROW_SPLIT.padding_problems(fmt, shape, clean) == []
    # Padding scale slot (K=60 leaves the last slot of each row unused in every format).
    shape = (3, 60)
    scales = [p.copy() for p in ROW_SPLIT.pack(fmt, make_logical(fmt, shape))]
    scales[-1][-1] = 0x80
    problems = ROW_SPLIT.padding_problems(fmt, shape, scales)
    assert len(problems) == 1 and "plane 'scales' row 2" in problems[0]


PLANE_WIDTHS = {
    "Q4G64_F16S": [4],
    "Q5G64_F16S": [4, 1],
    "Q6G64_F16S": [4, 2],
    "W8G32_F16S": [8],
}


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize("k", [69, 131, 1])  # odd, so the last logical byte is shared
def test_row_split_partially_padded_byte_checks_exactly_its_padding_bits(fmt: str, k: int) -> None:
    shape = (3, k)
    names = [p.name for p in ROW_SPLIT.planes(fmt, shape)][:-1]
    strides = ROW_SPLIT.row_strides(fmt, shape)  # type: ignore[attr-defined]
    for plane, (name, width) in enumerate(zip(names, PLANE_WIDTHS[fmt], strict=True)):
        per = 8 // width
        byte, used = k // per, k % per  # the byte holding position K, and its logical fields
        field = (1 << width) - 1
        pad_bits = sum(field << (i * width) for i in range(used, per))
        logical_bits = sum(field << (i * width) for i in range(used))
        # Every padding bit of that byte set: reported, and exactly those bits.
        planes = [p.copy() for p in ROW_SPLIT.pack(fmt, make_logical(fmt, shape))]
        planes[plane][strides[plane] + byte] |= np.uint8(pad_bits)
        assert ROW_SPLIT.padding_problems(fmt, shape, planes) == [
            f"plane {name!r} row 1 byte {byte}: padding bits are 0x{pad_bits:02x}, expected zero"
        ], (name, k)
        # Its logical bits, whatever they hold, are not padding.
        if logical_bits:
            planes = [p.copy() for p in ROW_SPLIT.pack(fmt, make_logical(fmt, shape))]
            planes[plane][strides[plane] + byte] ^= np.uint8(logical_bits)
            assert ROW_SPLIT.padding_problems(fmt, shape, planes) == [], (name, k)


def test_row_split_high_plane_padding_detected() -> None:
    fmt, shape = "Q6G64_F16S", (2, 65)
    planes = [p.copy() for p in ROW_SPLIT.pack(fmt, make_logical(fmt, shape))]
    planes[1][-1] = 0xC0  # hi2 of position 127, row 1
    assert ROW_SPLIT.padding_problems(fmt, shape, planes) == [
        "plane 'hi2' row 1 byte 31: padding bits are 0xc0, expected zero"
    ]


def test_padding_report_is_bounded() -> None:
    fmt, shape = "W8G32_F16S", (50, 1)
    planes = [np.full(p.nbytes, 0xFF, np.uint8) for p in ROW_SPLIT.planes(fmt, shape)]
    problems = ROW_SPLIT.padding_problems(fmt, shape, planes)
    assert len(problems) == 18  # 8 + summary per plane
    assert problems[8] == "plane 'codes': 6350 bytes with non-zero padding in total"


def test_nvfp4_padding_detected() -> None:
    shape = (3, 48)  # Kc = 3, so column 3 and rows 3..127 are padding
    planes = [p.copy() for p in BLOCK.pack("NVFP4", make_logical("NVFP4", shape))]
    planes[1][swizzle_offset(1, 3, 3)] = 0x11
    planes[1][swizzle_offset(100, 0, 3)] = 0x22
    assert BLOCK.padding_problems("NVFP4", shape, planes) == [
        f"plane 'scales' padding scale (row 1, column 3) at byte {swizzle_offset(1, 3, 3)} is "
        "0x11, expected zero",
        f"plane 'scales' padding scale (row 100, column 0) at byte {swizzle_offset(100, 0, 3)} "
        "is 0x22, expected zero",
    ]


@pytest.mark.parametrize("fmt", ["BF16", "FP8_E4M3FN_ROW_BF16S"])
def test_layouts_without_padding(fmt: str) -> None:
    shape = (2, 5)
    layout = layout_for(fmt)
    planes = [np.full(p.nbytes, 0xFF, np.uint8) for p in layout.planes(fmt, shape)]
    assert layout.padding_problems(fmt, shape, planes) == []


# ---------------------------------------------------------------------------------------------
# Misuse


def test_pack_rejects_wrong_inputs() -> None:
    with pytest.raises(UsageError, match="must be uint16 words"):
        CONTIG.pack("BF16", DirectWords(np.zeros(3, np.float16)))
    with pytest.raises(UsageError, match=r"view\(np.uint32\)"):
        CONTIG.pack("FP32", DirectWords(np.zeros(3, np.float32)))
    with pytest.raises(UsageError, match="packs DirectWords"):
        CONTIG.pack("I32", GroupedCodes(np.zeros((1, 1), np.int8), np.zeros((1, 1), np.uint16)))
    with pytest.raises(UsageError, match="scales has shape"):
        ROW_SPLIT.pack(
            "Q4G64_F16S", GroupedCodes(np.zeros((2, 65), np.int8), np.zeros((2, 1), np.uint16))
        )
    with pytest.raises(ValueInvariantError, match=r"span \[-9, -9\]"):
        ROW_SPLIT.pack(
            "Q4G64_F16S",
            GroupedCodes(np.full((1, 2), -9, np.int8), np.zeros((1, 1), np.uint16)),
        )
    with pytest.raises(ValueInvariantError):
        ROW_SPLIT.pack(
            "Q5G64_F16S", GroupedCodes(np.full((1, 2), 16, np.int8), np.zeros((1, 1), np.uint16))
        )
    with pytest.raises(ValueInvariantError, match="E2M1"):
        BLOCK.pack(
            "NVFP4", NVFP4Words(np.full((1, 16), 16, np.uint8), np.zeros((1, 1), np.uint8), 1)
        )
    with pytest.raises(UsageError, match="divisor"):
        BLOCK.pack(
            "NVFP4", NVFP4Words(np.zeros((1, 16), np.uint8), np.zeros((1, 1), np.uint8), 1 << 32)
        )


def test_unpack_rejects_wrong_plane_sizes() -> None:
    planes = ROW_SPLIT.pack("Q4G64_F16S", make_logical("Q4G64_F16S", (2, 64)))
    with pytest.raises(UsageError, match="holds 127 bytes but the layout needs 128"):
        ROW_SPLIT.unpack("Q4G64_F16S", (2, 64), [bytes(p)[:-1] for p in planes[:1]] + planes[1:])
    with pytest.raises(UsageError, match="in 2 planes"):
        ROW_SPLIT.unpack("Q4G64_F16S", (2, 64), planes[:1])
    with pytest.raises(UsageError, match="in 2 planes"):
        ROW_SPLIT.unpack("Q4G64_F16S", (2, 64), bytes(192))  # type: ignore[arg-type]


def test_pack_output_is_little_endian_flat_bytes() -> None:
    for fmt in ALL_FORMATS:
        shape = (2, 32) if fmt not in DIRECT else (2, 3)
        for p in layout_for(fmt).pack(fmt, make_logical(fmt, shape)):
            assert p.dtype == np.uint8 and p.ndim == 1 and p.flags.c_contiguous
