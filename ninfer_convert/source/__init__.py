"""Source checkpoints (safetensors) for conversion: see :mod:`.checkpoint` for the contract."""

from __future__ import annotations

from .checkpoint import (
    SourceArray,
    SourceCheckpoint,
    SourceKind,
    SourceTensorInfo,
    digest_bytes,
)
from .header import DTYPES, OPAQUE_DTYPES, DTypeInfo, parse_header
from .opening import INDEX_NAME, SINGLE_NAME, open_source
from .side_files import SIDE_FILE_LEFT_OUT, SideFileSource, scan_side_files

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
