"""Type stub of the header reader's C helpers (ninfer_convert/_jsonfast.c)."""

from collections.abc import Callable
from typing import Any

def scan(text: str, limit: int) -> tuple[int | None, int]: ...
def slot_maker(cls: type[Any], names: tuple[str, ...]) -> Callable[..., Any]: ...
def dict_maker(cls: type[Any], names: tuple[str, ...]) -> Callable[..., Any]: ...
def dict_values(value: object, keys: tuple[str, ...]) -> tuple[Any, ...] | None: ...
def decode(
    raw: bytes, plan: tuple[Any, ...], memo: dict[Any, Any], limit: int, json_depth: int
) -> Any: ...
def safetensors(
    raw: bytes,
    data_start: int,
    data_len: int,
    dtypes: tuple[str, ...],
    bits: tuple[int, ...],
    make: Callable[..., Any],
    file: str | None,
) -> tuple[dict[str, Any], tuple[int, int] | None] | None: ...
