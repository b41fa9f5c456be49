"""Type stub of the C host kernel (ninfer_convert/_hostkernel.c)."""

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
    stats: Any = None,
) -> tuple[str, int, int] | tuple[str, int, int, float] | None: ...
def f32_to_f16_words(words: Any, out: Any) -> None: ...
def convert_words(op: int, words: Any, out: Any) -> tuple[int, int]: ...
