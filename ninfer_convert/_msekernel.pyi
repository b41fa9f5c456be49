"""Type stub of the C kernel of MSE_F16_SEARCH_V1 (ninfer_convert/_msekernel.c)."""

from typing import Any

def encode_rows(
    words: Any,
    source: int,
    n: int,
    k: int,
    group: int,
    qmin: int,
    qmax: int,
    codes: Any,
    scales: Any,
    weights: Any = None,
) -> tuple[str, int, int] | tuple[str, int, int, float] | None: ...
def group_errors(
    x: Any, scales: Any, qmin: int, qmax: int, out: Any, weights: Any = None
) -> None: ...
def f64_to_f16_words(values: Any, out: Any) -> None: ...
def screen_errors(x: Any, qmin: int, qmax: int, out: Any) -> int: ...
def screen_rule(f: Any, scales: Any, n: int, bmax: int) -> int: ...
def screen(flag: bool = ...) -> bool: ...
