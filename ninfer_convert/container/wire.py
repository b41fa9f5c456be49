"""Wire constants and byte-level helpers of the .ninfer container (docs/container.md).

Contract: every magic value, size, cap and file name of the container is a literal here, with
the reason beside it; the writer and the reader both import them, so they cannot drift apart.

File = prelude (48 bytes) | zero gap | planes at multiples of the alignment | header JSON.

=======  =====  =============================================================================
offset   size   field
=======  =====  =============================================================================
0        8      magic ``89 4E 49 4E 46 45 52 0A`` (``\\x89NINFER\\n``)
8        2      major version, u16 little-endian (1)
10       2      minor version, u16 little-endian (0)
12       4      reserved, u32, must be zero
16       8      header offset, u64 little-endian
24       8      header length in bytes, u64 little-endian
32       16     header digest: xxh3-128 (seed 0, canonical big-endian bytes) of bytes 0..31
                followed by the header bytes
=======  =====  =============================================================================
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from typing import Any

import xxhash

from ..jsonfields.values import MAX_INT as MAX_INT

__all__ = [
    "DEFAULT_ALIGNMENT",
    "DIGEST_HEX_RE",
    "INDEX_NAME",
    "MAGIC",
    "MAJOR_VERSION",
    "MAX_ALIGNMENT",
    "MAX_HEADER_BYTES",
    "MAX_INDEX_BYTES",
    "MINOR_VERSION",
    "MIN_ALIGNMENT",
    "PRELUDE",
    "PRELUDE_SIZE",
    "RECIPE_DIGEST_ALGORITHM",
    "SINGLE_NAME",
    "SOURCE_DIGEST_PREFIX",
    "align_up",
    "canonical_json",
    "digest_hex",
    "header_digest",
    "new_digest",
    "recipe_digest",
    "shard_name",
]

# The high byte 0x89 catches 7-bit transports, the trailing \n catches newline rewriting (the
# trick PNG uses); "NINFER" makes `head -c 8` readable.
MAGIC = b"\x89NINFER\n"

MAJOR_VERSION = 1
"""A reader rejects any other major version: the layout of everything after the prelude."""
MINOR_VERSION = 0
"""A reader rejects a minor version newer than this one (it might carry fields it would drop)."""

# magic, major, minor, reserved, header offset, header length, header digest.
PRELUDE = struct.Struct("<8sHHIQQ16s")
PRELUDE_SIZE = PRELUDE.size  # 48
DIGEST_COVERED_PRELUDE = 32
"""The header digest covers prelude bytes 0..31 (everything but the digest itself)."""

MAX_HEADER_BYTES = 64 << 20  # 64 MiB
"""Header size cap: a checkpoint with 100k tensors and full provenance stays well below it, and a
hostile length field cannot make a reader allocate more."""
MAX_INDEX_BYTES = 64 << 20
"""The same cap for ``model.ninfer.index.json``."""

DEFAULT_ALIGNMENT = 4096  # one page: planes can be memory-mapped and DMA'd directly
MIN_ALIGNMENT = 64  # one cache line; also keeps every 2- and 4-byte word naturally aligned
MAX_ALIGNMENT = 1 << 30

# MAX_INT (imported above, (1 << 63) - 1): the largest integer any header or index field may
# hold (fits a signed 64-bit reader); the schema's integer fields take it as their bound.

SINGLE_NAME = "model.ninfer"
INDEX_NAME = "model.ninfer.index.json"
_SHARD_RE = re.compile(r"model-(\d{5,})-of-(\d{5,})\.ninfer")

DIGEST_HEX_RE = re.compile(r"[0-9a-f]{32}")
"""A digest in JSON: xxh3-128 as 32 lowercase hex digits (canonical big-endian order)."""


def align_up(value: int, alignment: int) -> int:
    """The smallest multiple of ``alignment`` (a power of two) that is >= ``value``."""
    return (value + alignment - 1) & ~(alignment - 1)


def digest_hex(data: bytes | bytearray | memoryview) -> str:
    """xxh3-128 (seed 0) of ``data`` as 32 lowercase hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def new_digest() -> xxhash.xxh3_128:
    """A streaming hasher of the container digest (xxh3-128, seed 0): ``update`` it with the
    bytes in order, then ``hexdigest()`` (the JSON form) or ``digest()`` (the prelude form)."""
    return xxhash.xxh3_128()


SOURCE_DIGEST_PREFIX = "xxh3-128:"
"""The header's source-tensor and source-file digests: this prefix and 32 lowercase hex digits
of the container digest of the raw bytes."""

RECIPE_DIGEST_ALGORITHM = "sha256"
"""``recipe.digest`` is ``sha256:<64 hex digits>`` of the recipe text's UTF-8 bytes."""


def recipe_digest(text: str) -> str:
    """``recipe.digest`` of a recipe text."""
    return f"{RECIPE_DIGEST_ALGORITHM}:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


def header_digest(prelude_head: bytes, header: bytes | memoryview) -> bytes:
    """The 16 digest bytes stored at prelude offset 32."""
    h = new_digest()
    h.update(prelude_head[:DIGEST_COVERED_PRELUDE])
    h.update(header)
    return h.digest()


def canonical_json(value: Any) -> bytes:
    """Canonical UTF-8 JSON: sorted keys, no whitespace, non-ASCII kept, no NaN/Infinity.

    Arrays keep their order (the container gives every array a defined order), so equal values
    always give identical bytes.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def shard_name(index: int, count: int) -> str:
    """File name of shard ``index`` (1-based) of ``count``; ``model.ninfer`` when count == 1.

    Numbers are zero-padded to five digits (the Hugging Face habit), or to the width of
    ``count`` when it has more digits.
    """
    if count == 1:
        return SINGLE_NAME
    width = max(5, len(str(count)))
    return f"model-{index:0{width}d}-of-{count:0{width}d}.ninfer"


def parse_shard_name(name: str) -> tuple[int, int] | None:
    """(index, count) of a shard file name written by :func:`shard_name`, else ``None``."""
    m = _SHARD_RE.fullmatch(name)
    if m is None:
        return None
    index, count = int(m.group(1)), int(m.group(2))
    if shard_name(index, count) != name or not 1 <= index <= count or count < 2:
        return None
    return index, count
