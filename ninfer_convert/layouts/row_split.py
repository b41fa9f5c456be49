"""``row-split-k128-v1``: grouped signed-integer codes split into bit planes, plus binary16 scales.

Contract (docs/layouts.md, section row-split-k128-v1 is normative):

* Formats Q4G64_F16S, Q5G64_F16S, Q6G64_F16S, W8G32_F16S on a rank-two [N, K] matrix, N >= 1,
  K >= 1.  Kp = ceil(K / 128) * 128 is the padded row length; G is the format's group size
  (64 or 32, both divide 128), Gp = Kp / G scale slots per stored row.
* Each code is first turned into its unsigned b-bit word u = q mod 2^b (two's complement).
  Logical position k of row n is padded position k; positions K..Kp-1 are padding with u = 0.
* Planes, in this order, each row-major with a fixed row stride and no gaps between rows:

  ======  ==========  ============  ===============================================
  format  plane       row stride    byte j of row n holds
  ======  ==========  ============  ===============================================
  Q4      ``codes``   Kp / 2        u[2j] in bits 0-3, u[2j+1] in bits 4-7
  Q5      ``lo4``     Kp / 2        (u & 0xF) of 2j in bits 0-3, of 2j+1 in bits 4-7
  Q5      ``hi1``     Kp / 8        bit 4 of u[8j+i] in bit i, i = 0..7
  Q6      ``lo4``     Kp / 2        as Q5 ``lo4``
  Q6      ``hi2``     Kp / 4        bits 4-5 of u[4j+i] in bits 2i..2i+1, i = 0..3
  W8      ``codes``   Kp            u[j] (the two's-complement byte)
  all     ``scales``  2 * Gp        binary16 scale word of group j, little-endian,
                                    at bytes 2j, 2j+1
  ======  ==========  ============  ===============================================

* Padding: code bits of padded positions are zero; scale slots ceil(K/G)..Gp-1 are +0 (0x0000).
  The partial last group of a row keeps its logical scale; only its positions >= K are padding.
* Because every plane has a fixed per-row stride, one row, a range of rows or an arbitrary row
  list can be decoded from those rows' bytes alone (:meth:`RowSplitK128.unpack_rows`), and a
  block of rows can be packed straight into (or compared with) its slice of every plane
  (:meth:`RowSplitK128.pack_rows_into`, the C packer in ``_rowsplit.c``; tests hold it
  byte-identical to :meth:`Layout.pack`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import UsageError, ValueInvariantError
from ..formats import NumericFormat
from ..logical import GroupedCodes, LogicalTensor
from ..native import optional_module
from .base import Buffer, FormatLike, Layout, PlaneSpec, ceil_div, check_array, describe_bad_bytes

__all__ = ["ROW_SPLIT_K128_V1", "BlockResult", "RowSplitK128", "Rows", "native_packer_available"]

_native: Any = optional_module("_rowsplit")  # None when the build skipped it


def native_packer_available() -> bool:
    return _native is not None


class BlockResult(IntEnum):
    """What :meth:`RowSplitK128.pack_rows_into` did (the C packer's return values)."""

    DONE = 0
    """Written, or compared and every byte equal."""
    DIFFERENT = 1
    """Compared, and some byte differs."""
    INVALID = 2
    """The values break Section 5/6.1 (see ``validate.grouped_problems``); nothing usable."""


K_ALIGN = 128
"""Rows are padded to a multiple of 128 codes (the "k128" of the name)."""

Rows = slice | range | Sequence[int] | npt.NDArray[np.integer[Any]]

# (plane name, bit shift into u, bit width of the plane's field) per code width.
_PLANE_FIELDS: dict[int, tuple[tuple[str, int, int], ...]] = {
    4: (("codes", 0, 4),),
    5: (("lo4", 0, 4), ("hi1", 4, 1)),
    6: (("lo4", 0, 4), ("hi2", 4, 2)),
    8: (("codes", 0, 8),),
}


def _padded_k(k: int) -> int:
    return ceil_div(k, K_ALIGN) * K_ALIGN


def _group(fmt: NumericFormat) -> int:
    """The format's group size; the registry guarantees 128 is a multiple of it."""
    group = fmt.group_size
    if group is None or K_ALIGN % group:  # pragma: no cover - registry invariant
        raise RuntimeError(f"{fmt.name} has no group size dividing {K_ALIGN}")
    return group


def _pack_fields(field: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.uint8]:
    """Pack [rows, Kp] fields of ``width`` bits, element c*per+i into bits i*width.. of byte c."""
    if width == 8:
        return field
    if width == 1:  # numpy's bit packer, least significant bit first, is the same order
        return np.packbits(field, axis=-1, bitorder="little")
    if width == 4:
        # Read each pair of fields as one little-endian u16 v = f0 | f1 << 8; then
        # (v | v >> 4) has f0 in bits 0-3 and f1 in bits 4-7 (f0 < 16, so v >> 4 only brings
        # f1 down), and the cast to u8 keeps exactly that byte.  Three contiguous passes.
        v = np.ascontiguousarray(field).view("<u2")
        return (v | (v >> np.uint16(4))).astype(np.uint8)
    if width == 2:
        # Same trick on four fields per little-endian u32: f_i sits at bit 8i and moves to
        # bit 2i with a right shift of 6i.
        v = np.ascontiguousarray(field).view("<u4")
        out = v | (v >> np.uint32(6))
        out |= v >> np.uint32(12)
        out |= v >> np.uint32(18)
        return out.astype(np.uint8)
    raise RuntimeError(f"no packer for {width}-bit fields")  # pragma: no cover


def _unpack_fields(packed: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.uint8]:
    """Inverse of :func:`_pack_fields`: [rows, bytes] -> [rows, bytes * 8 / width] fields."""
    if width == 8:
        return packed
    if width == 1:
        return np.unpackbits(packed, axis=-1, bitorder="little")
    per = 8 // width
    mask = np.uint8((1 << width) - 1)
    rows, nb = packed.shape
    out = np.empty((rows, nb, per), dtype=np.uint8)
    for i in range(per):
        out[:, :, i] = (packed >> np.uint8(i * width)) & mask
    return out.reshape(rows, nb * per)


class RowSplitK128(Layout):
    name = "row-split-k128-v1"
    formats = frozenset({"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"})
    logical_type = GroupedCodes

    def _check_shape(self, fmt: NumericFormat, shape: tuple[int, ...]) -> None:
        if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
            raise UsageError(
                f"{fmt.name} with {self.name} needs a rank-two [N, K] shape with N >= 1 and "
                f"K >= 1, got {list(shape)}",
                hint="reshape or transpose to rank two in the recipe (spec Section 4)",
            )

    def _physical(self, fmt: NumericFormat, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], _padded_k(shape[1]))

    def _planes(self, fmt: NumericFormat, shape: tuple[int, ...]) -> list[PlaneSpec]:
        n, k = shape
        kp = _padded_k(k)
        group = _group(fmt)
        specs = [
            PlaneSpec(name, n * kp * width // 8, (n, kp * width // 8), "u1")
            for name, _, width in _PLANE_FIELDS[fmt.code_bits]
        ]
        specs.append(PlaneSpec("scales", n * (kp // group) * 2, (n, kp // group), "<u2"))
        return specs

    def row_strides(self, fmt: FormatLike, shape: Sequence[int]) -> list[int]:
        """Bytes per row of each plane, in plane order."""
        return [p.nbytes // p.extents[0] for p in self.planes(fmt, shape)]

    # -- pack ----------------------------------------------------------------------------------

    def _pack(
        self, fmt: NumericFormat, shape: tuple[int, ...], logical: LogicalTensor
    ) -> list[npt.NDArray[np.uint8]]:
        if not isinstance(logical, GroupedCodes):
            raise UsageError(f"{fmt.name} packs GroupedCodes, not {type(logical).__name__}")
        n, k = shape
        group = _group(fmt)
        bits = fmt.code_bits
        codes = check_array(logical.codes, f"{fmt.name} codes", "i", 1, (n, k))
        scales = check_array(logical.scales, f"{fmt.name} scales", "u", 2, (n, ceil_div(k, group)))
        if bits < 8:
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            cmin, cmax = int(codes.min()), int(codes.max())
            if cmin < lo or cmax > hi:
                raise ValueInvariantError(
                    f"{fmt.name} codes span [{cmin}, {cmax}] but {bits}-bit codes must lie in "
                    f"[{lo}, {hi}]; packing would silently change them"
                )
        kp = _padded_k(k)
        mask = np.uint8((1 << bits) - 1)
        # u = q mod 2^b: the two's-complement byte masked to b bits (spec Section 5).
        if k == kp:
            words = np.bitwise_and(codes.view(np.uint8), mask)
        else:
            words = np.zeros((n, kp), dtype=np.uint8)
            words[:, :k] = codes.view(np.uint8) & mask
        out = []
        for _, shift, width in _PLANE_FIELDS[bits]:
            if shift == 0 and width == bits:
                field = words  # already masked to the code width
            else:
                field = (words >> np.uint8(shift)) & np.uint8((1 << width) - 1)
            out.append(np.ascontiguousarray(_pack_fields(field, width)).reshape(-1))
        padded_scales = np.zeros((n, kp // group), dtype="<u2")
        padded_scales[:, : scales.shape[1]] = scales
        out.append(padded_scales.reshape(-1).view(np.uint8))
        return out

    def pack_rows_into(
        self,
        fmt: NumericFormat,
        codes: npt.NDArray[np.int8],
        scales: npt.NDArray[np.uint16],
        planes: Sequence[npt.NDArray[np.uint8]],
        *,
        compare: bool = False,
    ) -> BlockResult:
        """Pack a block of rows ([r, K] codes, [r, ceil(K/G)] scales, C-contiguous) into
        ``planes`` -- the block's slice of every plane, each exactly r rows of the plane's row
        stride -- or, with ``compare``, compare the packed bytes with them.  The values are
        checked first, with grouped_problems' rules; INVALID means some value breaks them.
        Needs the C packer (:func:`native_packer_available`)."""
        if _native is None:  # pragma: no cover - depends on the build
            raise RuntimeError("the C row-split packer was not built")
        group = _group(fmt)
        assert fmt.qmin is not None and fmt.qmax is not None
        if not isinstance(codes, np.ndarray) or codes.ndim != 2:
            raise UsageError(f"{fmt.name} codes must be a two-dimensional numpy array")
        r, k = codes.shape
        check_array(codes, f"{fmt.name} codes", "i", 1, (r, k))
        check_array(scales, f"{fmt.name} scales", "u", 2, (r, ceil_div(k, group)))
        for arr, what in ((codes, "codes"), (scales, "scales")):
            if not arr.flags.c_contiguous or not arr.dtype.isnative:
                raise UsageError(f"{fmt.name} {what} must be C-contiguous in native byte order")
        result = _native.pack_rows(
            codes, scales, r, k, group, fmt.code_bits, fmt.qmin, fmt.qmax, tuple(planes),
            compare,
        )  # fmt: skip
        return BlockResult(result)

    # -- unpack --------------------------------------------------------------------------------

    def _decode_rows(
        self,
        fmt: NumericFormat,
        k: int,
        rows2d: list[npt.NDArray[np.uint8]],
    ) -> GroupedCodes:
        """Decode already-selected rows: ``rows2d`` holds one [r, stride] array per plane."""
        group = _group(fmt)
        bits = fmt.code_bits
        r = rows2d[0].shape[0]
        words = np.zeros((r, rows2d[0].shape[1] * 8 // _PLANE_FIELDS[bits][0][2]), np.uint8)
        for arr, (_, shift, width) in zip(rows2d[:-1], _PLANE_FIELDS[bits], strict=True):
            words |= _unpack_fields(arr, width) << np.uint8(shift)
        # Sign-extend the b-bit word: move its sign bit to bit 7, then shift back arithmetically.
        codes = (words[:, :k] << np.uint8(8 - bits)).view(np.int8) >> np.int8(8 - bits)
        scales = rows2d[-1].view("<u2")[:, : ceil_div(k, group)].astype(np.uint16)
        return GroupedCodes(codes=np.ascontiguousarray(codes, dtype=np.int8), scales=scales)

    def _unpack(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> LogicalTensor:
        n, k = shape
        return self._decode_rows(fmt, k, [p.reshape(n, -1) for p in planes])

    def unpack_rows(
        self, fmt: FormatLike, shape: Sequence[int], planes: Sequence[Buffer], rows: Rows
    ) -> GroupedCodes:
        """Decode only ``rows`` (a slice, range, or list/array of row indices, in that order).

        Only the bytes of the selected rows are read, so on a memory-mapped artifact an
        embedding gather touches only the pages of the gathered rows.  Indices must lie in
        [0, N); duplicates are allowed and repeated in the result.
        """
        entry = self.resolve(fmt)
        dims = self.check_shape(entry, shape)
        n, k = dims
        views = [p.reshape(n, -1) for p in self._views(entry, dims, planes)]
        if isinstance(rows, slice):
            start, stop, step = rows.indices(n)
            return self._decode_rows(entry, k, [v[start:stop:step] for v in views])
        if isinstance(rows, range):
            idx = np.asarray(rows, dtype=np.int64)
        else:
            try:
                idx = np.asarray(rows)
            except (TypeError, ValueError) as exc:
                raise UsageError(f"rows must be a slice, range or list of ints: {exc}") from None
            if idx.size == 0:
                idx = idx.astype(np.int64)
            if idx.ndim != 1 or idx.dtype.kind not in "iu":
                raise UsageError(
                    f"rows must be a slice, range or one-dimensional list of ints, got "
                    f"dtype {idx.dtype} shape {list(idx.shape)}"
                )
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise UsageError(
                f"row indices span [{int(idx.min())}, {int(idx.max())}] but the tensor has "
                f"{n} rows (valid 0..{n - 1})"
            )
        return self._decode_rows(entry, k, [v[idx] for v in views])

    # -- padding -------------------------------------------------------------------------------

    def _padding_problems(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> list[str]:
        n, k = shape
        group = _group(fmt)
        kp = _padded_k(k)
        problems: list[str] = []
        if k < kp:
            for arr, (name, _, width) in zip(
                planes[:-1], _PLANE_FIELDS[fmt.code_bits], strict=True
            ):
                per = 8 // width
                # Per-byte mask of the bits that belong to padded positions k >= K; only the
                # columns from the first byte holding a padded position are read.
                pos = np.arange(kp).reshape(-1, per)
                field_mask = np.uint8((1 << width) - 1)
                byte_mask = np.zeros(kp // per, dtype=np.uint8)
                for i in range(per):
                    byte_mask |= np.where(
                        pos[:, i] >= k, field_mask << np.uint8(i * width), 0
                    ).astype(np.uint8)
                first = k // per
                tail = arr.reshape(n, -1)[:, first:]
                masked = tail & byte_mask[first:]
                problems += describe_bad_bytes(name, masked != 0, masked, first)
        used = ceil_div(k, group)
        scales = planes[-1].reshape(n, -1)[:, used * 2 :]
        if scales.size:
            problems += describe_bad_bytes("scales", scales != 0, scales, used * 2)
        return problems


ROW_SPLIT_K128_V1 = RowSplitK128()
