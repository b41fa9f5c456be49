"""Shared parity assertion: compare two grouped encodings word by word and report the first
differing row/group with the differing bits (gguf-py style, but failing for real)."""

from __future__ import annotations

import numpy as np

from ninfer_convert.logical import GroupedCodes


def assert_same_encoding(
    expected: GroupedCodes, got: GroupedCodes, group_size: int, label: str = ""
) -> None:
    assert expected.codes.shape == got.codes.shape, f"{label}: code shapes differ"
    assert expected.scales.shape == got.scales.shape, f"{label}: scale shapes differ"
    bad_scale = np.argwhere(expected.scales != got.scales)
    if bad_scale.size:
        r, g = (int(i) for i in bad_scale[0])
        e, f = int(expected.scales[r, g]), int(got.scales[r, g])
        raise AssertionError(
            f"{label}: {len(bad_scale)} scale words differ; first at row {r}, group {g}: "
            f"expected 0x{e:04x}, got 0x{f:04x} (xor 0x{e ^ f:04x})"
        )
    bad_code = np.argwhere(expected.codes != got.codes)
    if bad_code.size:
        r, c = (int(i) for i in bad_code[0])
        e, f = int(expected.codes[r, c]), int(got.codes[r, c])
        raise AssertionError(
            f"{label}: {len(bad_code)} codes differ; first at row {r}, column {c} "
            f"(group {c // group_size}): expected {e}, got {f} "
            f"(bits {e & 0xFF:08b} vs {f & 0xFF:08b})"
        )
