"""``blockscale-k16-m128x4-v1``: NVFP4 codes, swizzled E4M3FN block scales and the FP32 divisor.

Contract (docs/layouts.md, section blockscale-k16-m128x4-v1 is normative):

* Format NVFP4 on a rank-two [N, K] matrix, N >= 1, K >= 16, K % 16 == 0.  Kc = K / 16 scale
  columns; Np = ceil(N / 128) * 128 padded scale rows; Kcp = ceil(Kc / 4) * 4 padded columns.
* Plane ``codes`` (N * K / 2 bytes): row-major; byte j of row n holds the E2M1 word of element
  2j in bits 0-3 and of element 2j+1 in bits 4-7 (the order of public NVFP4 checkpoints).
  No padding (K is even).
* Plane ``scales`` (Np * Kcp bytes): the E4M3FN scale word s[m, k] sits at byte offset
  ``((m // 128) * (Kcp / 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4``:
  128x4 tiles of 512 bytes, tiles ordered row-tile-major, inside a tile the 32 sub-rows outer,
  then the 4 row quarters, then the 4 columns (the layout NVIDIA block-scaled GEMMs consume).
  Positions with m >= N or k >= Kc are padding and hold 0x00.
* Plane ``divisor`` (4 bytes): the binary32 word of d_w, little-endian.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import UsageError, ValueInvariantError
from ..formats import NumericFormat
from ..logical import LogicalTensor, NVFP4Words
from .base import Layout, PlaneSpec, ceil_div, check_array

__all__ = [
    "BLOCKSCALE_K16_M128X4_V1",
    "BlockscaleK16M128x4",
    "swizzle_offset",
    "swizzle_scales",
    "unswizzle_scales",
]

K_GROUP = 16
TILE_ROWS = 128
TILE_COLS = 4
TILE_BYTES = TILE_ROWS * TILE_COLS  # 512


def swizzle_offset(m: int, k: int, kc: int) -> int:
    """Byte offset of scale (m, k) in the swizzled plane of a matrix with ``kc`` scale columns.

    This is the normative formula, kept verbatim so tests can compare the vectorised
    :func:`swizzle_scales` against it.
    """
    return (
        ((m // 128) * ceil_div(kc, 4) + k // 4) * 512
        + (m % 32) * 16
        + ((m % 128) // 32) * 4
        + k % 4
    )


def swizzle_scales(scales: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Natural [N, Kc] scale words -> flat swizzled plane of Np * Kcp bytes (zero padding)."""
    n, kc = scales.shape
    mt, kt = ceil_div(n, TILE_ROWS), ceil_div(kc, TILE_COLS)
    padded = np.zeros((mt * TILE_ROWS, kt * TILE_COLS), dtype=np.uint8)
    padded[:n, :kc] = scales
    # Row m = mt*128 + q*32 + r (q: row quarter, r: sub-row), column k = kt*4 + c.  The plane is
    # ordered (mt, kt, r, q, c), which is exactly the offset formula; the permutation is its
    # own inverse, so unswizzle_scales uses the same axes.
    tiles = padded.reshape(mt, 4, 32, kt, 4).transpose(0, 3, 2, 1, 4)
    return np.ascontiguousarray(tiles).reshape(-1)


def unswizzle_scales(plane: npt.NDArray[np.uint8], n: int, kc: int) -> npt.NDArray[np.uint8]:
    """Flat swizzled plane -> natural [N, Kc] scale words (fresh array)."""
    mt, kt = ceil_div(n, TILE_ROWS), ceil_div(kc, TILE_COLS)
    natural = plane.reshape(mt, kt, 32, 4, 4).transpose(0, 3, 2, 1, 4)
    return np.ascontiguousarray(natural.reshape(mt * TILE_ROWS, kt * TILE_COLS)[:n, :kc])


class BlockscaleK16M128x4(Layout):
    name = "blockscale-k16-m128x4-v1"
    formats = frozenset({"NVFP4"})
    logical_type = NVFP4Words

    def _check_shape(self, fmt: NumericFormat, shape: tuple[int, ...]) -> None:
        if len(shape) != 2 or shape[0] < 1 or shape[1] < K_GROUP or shape[1] % K_GROUP:
            raise UsageError(
                f"NVFP4 with {self.name} needs a rank-two [N, K] shape with N >= 1 and K a "
                f"positive multiple of {K_GROUP}, got {list(shape)}"
            )

    def _physical(self, fmt: NumericFormat, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def _planes(self, fmt: NumericFormat, shape: tuple[int, ...]) -> list[PlaneSpec]:
        n, k = shape
        kc = k // K_GROUP
        np_, kcp = ceil_div(n, TILE_ROWS) * TILE_ROWS, ceil_div(kc, TILE_COLS) * TILE_COLS
        return [
            PlaneSpec("codes", n * k // 2, (n, k // 2), "u1"),
            PlaneSpec("scales", np_ * kcp, (np_ * kcp,), "u1"),
            PlaneSpec("divisor", 4, (1,), "<u4"),
        ]

    def _pack(
        self, fmt: NumericFormat, shape: tuple[int, ...], logical: LogicalTensor
    ) -> list[npt.NDArray[np.uint8]]:
        if not isinstance(logical, NVFP4Words):
            raise UsageError(f"NVFP4 packs NVFP4Words, not {type(logical).__name__}")
        n, k = shape
        codes = check_array(logical.codes, "NVFP4 codes", "u", 1, (n, k))
        scales = check_array(logical.scales, "NVFP4 scales", "u", 1, (n, k // K_GROUP))
        divisor = logical.divisor
        if isinstance(divisor, bool) or not isinstance(divisor, (int, np.integer)):
            raise UsageError(f"NVFP4 divisor must be the binary32 word as an int, not {divisor!r}")
        if not 0 <= int(divisor) <= 0xFFFFFFFF:
            raise UsageError(f"NVFP4 divisor word {int(divisor)} does not fit 32 bits")
        cmax = int(codes.max())
        if cmax > 0xF:
            raise ValueInvariantError(
                f"NVFP4 code word {cmax} is not a 4-bit E2M1 word; packing would change it"
            )
        packed = codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))
        return [
            np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1),
            swizzle_scales(np.asarray(scales, dtype=np.uint8)),
            np.array([int(divisor)], dtype="<u4").view(np.uint8),
        ]

    def _unpack(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> LogicalTensor:
        n, k = shape
        packed = planes[0].reshape(n, k // 2)
        codes = np.empty((n, k), dtype=np.uint8)
        codes[:, 0::2] = packed & np.uint8(0xF)
        codes[:, 1::2] = packed >> np.uint8(4)
        scales = unswizzle_scales(planes[1], n, k // K_GROUP)
        divisor = int(planes[2].view("<u4")[0])
        return NVFP4Words(codes=codes, scales=scales, divisor=divisor)

    def _padding_problems(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> list[str]:
        n, k = shape
        kc = k // K_GROUP
        mt, kt = ceil_div(n, TILE_ROWS), ceil_div(kc, TILE_COLS)
        natural = planes[1].reshape(mt, kt, 32, 4, 4).transpose(0, 3, 2, 1, 4)
        natural = natural.reshape(mt * TILE_ROWS, kt * TILE_COLS)
        pad = np.ones(natural.shape, dtype=bool)
        pad[:n, :kc] = False
        bad = pad & (natural != 0)
        if not bad.any():
            return []
        out = []
        ms, ks = np.nonzero(bad)
        for m, c in zip(ms[:8], ks[:8], strict=True):
            out.append(
                f"plane 'scales' padding scale (row {int(m)}, column {int(c)}) at byte "
                f"{swizzle_offset(int(m), int(c), kc)} is 0x{int(natural[m, c]):02x}, "
                "expected zero"
            )
        if ms.size > 8:
            out.append(f"plane 'scales': {ms.size} padding bytes are non-zero in total")
        return out


BLOCKSCALE_K16_M128X4_V1 = BlockscaleK16M128x4()
