"""Source checkpoints (safetensors) for conversion: see :mod:`.checkpoint` for the contract."""

from __future__ import annotations

from .checkpoint import (
    INDEX_NAME,
    SIDE_FILE_LEFT_OUT,
    SINGLE_NAME,
    SideFileSource,
    SourceArray,
    SourceCheckpoint,
    SourceKind,
    SourceTensorInfo,
    digest_bytes,
    open_source,
    scan_side_files,
)
from .header import DTYPES, OPAQUE_DTYPES, DTypeInfo, parse_header

__all__ = [
    "DTYPES",
    "INDEX_NAME",
    "OPAQUE_DTYPES",
    "SIDE_FILE_LEFT_OUT",
    "SINGLE_NAME",
    "DTypeInfo",
    "SideFileSource",
    "SourceArray",
    "SourceCheckpoint",
    "SourceKind",
    "SourceTensorInfo",
    "digest_bytes",
    "open_source",
    "parse_header",
    "scan_side_files",
]
