"""Type stub of the C kernel of block-compensated encoding (ninfer_convert/_gptqkernel.c)."""

from typing import Any

def group_values(
    w: Any, n: int, k: int, g0: int, group: int, qmax: int, failed: Any, reason: Any, v: Any
) -> None: ...
def group_columns(
    w: Any,
    n: int,
    k: int,
    factor: Any,
    block: int,
    g0: int,
    group: int,
    qmin: int,
    qmax: int,
    scales: Any,
    codes: Any,
    failed: Any,
    reason: Any,
    trace: Any = None,
) -> None: ...
