"""Fused, chunked encode-and-pack of grouped tensors for the converter's host path.

Contract: :func:`encode_pack_grouped` returns exactly the planes that
``lookup_layout(fmt.layout).pack(fmt, encode_grouped_words(words, ...))`` returns, byte for byte
(tests compare the two), while never materialising the whole-tensor code array;
:func:`equals_packed_grouped` decides whether those planes equal stored ones without building
them.

Why: ``row-split-k128-v1`` stores every plane row-major with a fixed byte stride per row, so a
block of consecutive rows maps to one contiguous slice of each plane.  Encoding and packing one
cache-sized row block at a time keeps the working set in L2 and bounds memory to the output
planes plus a few blocks, and the blocks are independent, so two threads split them (numpy
releases the GIL in every ufunc used).  The value invariants the producer owes (spec Section 9)
are checked per block on the codes and scales before they are packed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import numpy.typing as npt

from .encoder.common import check_words, grouped_format
from .encoder.host import ErrorSums, encode_rows
from .encoder.numpy_backend import CHUNK_ELEMENTS
from .layouts import PlaneSpec, lookup_layout
from .logical import GroupedCodes
from .validate import grouped_problems

__all__ = ["BlockHook", "BlockSink", "Digest", "encode_pack_grouped", "equals_packed_grouped"]

BlockHook = Callable[
    [
        int,
        int,
        npt.NDArray[np.generic],
        npt.NDArray[np.int8],
        npt.NDArray[np.uint16],
        ErrorSums | None,
    ],
    None,
]
"""Called with (first row, end row, source words, codes, scales, error sums) of each encoded
block; the sums come from the C kernel's pass, or are ``None`` when the numpy kernel ran."""


BlockSink = Callable[[int, int, list[npt.NDArray[np.uint8]]], None]
"""Receives (first row, end row, the block's slice of every plane) of each packed block."""


def encode_pack_grouped(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt_name: str,
    *,
    tensor: str | None = None,
    threads: int = 2,
    chunk_elements: int = CHUNK_ELEMENTS,
    on_block: BlockHook | None = None,
    kernel: str = "native",
) -> list[npt.NDArray[np.uint8]]:
    """Encode ``words`` [N, K] and pack them; ``on_block(r0, r1, words, codes, scales, sums)``
    (optional, called from worker threads) sees each encoded row block, e.g. for statistics."""
    specs, strides = _plane_geometry(words, source_dtype, fmt_name)
    planes = [np.empty(spec.nbytes, dtype=np.uint8) for spec in specs]

    def store(r0: int, r1: int, packed: list[npt.NDArray[np.uint8]]) -> None:
        for plane, stride, part in zip(planes, strides, packed, strict=True):
            plane[r0 * stride : r1 * stride] = part

    _run_blocks(words, source_dtype, fmt_name, store, tensor, threads, chunk_elements, on_block,
                kernel)  # fmt: skip
    return planes


class Digest(Protocol):
    def update(self, data: npt.NDArray[np.uint8], /) -> None: ...


def equals_packed_grouped(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt_name: str,
    stored: list[npt.NDArray[np.uint8]],
    *,
    tensor: str | None = None,
    threads: int = 2,
    chunk_elements: int = CHUNK_ELEMENTS,
    on_block: BlockHook | None = None,
    digests: list[Digest] | None = None,
    kernel: str = "native",
) -> bool:
    """``encode_pack_grouped(words, ...) == stored`` plane by plane, byte for byte, without
    building the planes: each packed block is compared with its slice of ``stored`` while it
    is in cache (verify's fast path; tests check it agrees with the comparison of whole planes).
    When the stored planes have the layout's sizes every block is encoded (``on_block`` sees
    them all) whatever the outcome; otherwise nothing is encoded and the answer is False.
    ``digests`` (one per stored plane, optional) are fed every stored byte in plane order, the
    slices of each block as soon as the blocks before it are done, so the stored bytes are read
    from memory once for both the comparison and the digest."""
    specs, strides = _plane_geometry(words, source_dtype, fmt_name)
    if digests is not None and len(digests) != len(stored):
        raise ValueError("one digest per stored plane")
    if [int(p.size) for p in stored] != [spec.nbytes for spec in specs]:
        for digest, plane in zip(digests or [], stored, strict=False):
            digest.update(plane)
        return False
    differs = threading.Event()
    lock = threading.Lock()
    done: dict[int, int] = {}  # first row -> end row of compared blocks not yet digested
    digested = 0  # rows [0, digested) of every plane are in the digests

    def compare(r0: int, r1: int, packed: list[npt.NDArray[np.uint8]]) -> None:
        nonlocal digested
        for plane, stride, part in zip(stored, strides, packed, strict=True):
            if not np.array_equal(plane[r0 * stride : r1 * stride], part):
                differs.set()
        if digests is None:
            return
        with lock:  # digests need the bytes in order; blocks finish in any order
            done[r0] = r1
            while digested in done:
                end = done.pop(digested)
                for digest, plane, stride in zip(digests, stored, strides, strict=True):
                    digest.update(plane[digested * stride : end * stride])
                digested = end

    _run_blocks(words, source_dtype, fmt_name, compare, tensor, threads, chunk_elements,
                on_block, kernel)  # fmt: skip
    for digest, plane, stride in zip(digests or [], stored, strides, strict=False):
        digest.update(plane[digested * stride :])  # nothing, unless a plane has a tail
    return not differs.is_set()


def _plane_geometry(
    words: npt.NDArray[np.generic], source_dtype: str, fmt_name: str
) -> tuple[list[PlaneSpec], list[int]]:
    """The layout's planes for ``words`` and each plane's bytes per row (checked input)."""
    fmt = grouped_format(fmt_name)
    check_words(words, source_dtype)
    n, k = words.shape
    specs = lookup_layout(fmt.layout).planes(fmt, (n, k))
    return specs, [spec.nbytes // n if n else 0 for spec in specs]


def _run_blocks(
    words: npt.NDArray[np.generic],
    source_dtype: str,
    fmt_name: str,
    sink: BlockSink,
    tensor: str | None,
    threads: int,
    chunk_elements: int,
    on_block: BlockHook | None,
    kernel: str,
) -> None:
    """Encode, check and pack ``words`` one row block at a time; ``sink`` gets each block."""
    fmt = grouped_format(fmt_name)
    assert fmt.group_size is not None
    n, k = words.shape
    layout = lookup_layout(fmt.layout)
    n_groups = -(-k // fmt.group_size)
    rows = max(1, chunk_elements // k)

    def block(r0: int) -> None:
        r1 = min(n, r0 + rows)
        codes = np.empty((r1 - r0, k), dtype=np.int8)
        scales = np.empty((r1 - r0, n_groups), dtype=np.uint16)
        sums = encode_rows(
            words[r0:r1], source_dtype, fmt, r0, codes, scales, tensor, kernel,
            with_sums=on_block is not None,
        )  # fmt: skip
        problems = grouped_problems(fmt, codes, scales, tensor)
        if problems:  # pragma: no cover - the encoder cannot emit these; defence in depth
            raise problems[0]
        if on_block is not None:
            on_block(r0, r1, words[r0:r1], codes, scales, sums)
        sink(r0, r1, [np.asarray(p) for p in layout.pack(fmt, GroupedCodes(codes, scales))])

    starts = range(0, n, rows)
    if threads <= 1 or len(starts) == 1:
        for r0 in starts:
            block(r0)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(block, starts))
