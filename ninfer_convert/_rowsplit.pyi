"""Type stub of the C row-split packer (ninfer_convert/_rowsplit.c)."""

from typing import Any

def pack_rows(
    codes: Any,
    scales: Any,
    n: int,
    k: int,
    group: int,
    bits: int,
    qmin: int,
    qmax: int,
    planes: tuple[Any, ...],
    compare: bool,
) -> int: ...
