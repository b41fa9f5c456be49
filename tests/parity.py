"""Shared parity assertion: compare two grouped encodings word by word and report the first
differing row/group with the differing bits (gguf-py style, but failing for real)."""

from __future__ import annotations

from ninfer_convert.encoder.parity import first_difference
from ninfer_convert.logical import GroupedCodes


def assert_same_encoding(
    expected: GroupedCodes, got: GroupedCodes, group_size: int, label: str = ""
) -> None:
    diff = first_difference(expected, got, group_size)
    assert diff is None, f"{label}: {diff}"
