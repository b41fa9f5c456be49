"""Type stub of the header reader's C helpers (ninfer_convert/_jsonfast.c)."""

from collections.abc import Callable
from typing import Any

def scan(text: str, limit: int) -> tuple[int | None, int]: ...
def slot_maker(cls: type[Any], names: tuple[str, ...]) -> Callable[..., Any]: ...
