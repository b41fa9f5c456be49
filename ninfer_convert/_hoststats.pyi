"""Type stub of the C statistics module (ninfer_convert/_hoststats.c)."""

from typing import Any

def error_stats(
    words: Any, source: int, n: int, k: int, group: int, codes: Any, scales: Any
) -> tuple[float, float, float]: ...
