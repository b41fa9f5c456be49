"""Source checkpoints (safetensors) for conversion: see :mod:`.checkpoint` for the contract."""

from __future__ import annotations

from .checkpoint import (
    INDEX_NAME,
    SINGLE_NAME,
    SourceArray,
    SourceCheckpoint,
    SourceKind,
    SourceTensorInfo,
    digest_bytes,
    open_source,
)
from .header import DTYPES, DTypeInfo, parse_header

__all__ = [
    "DTYPES",
    "INDEX_NAME",
    "SINGLE_NAME",
    "DTypeInfo",
    "SourceArray",
    "SourceCheckpoint",
    "SourceKind",
    "SourceTensorInfo",
    "digest_bytes",
    "open_source",
    "parse_header",
]
