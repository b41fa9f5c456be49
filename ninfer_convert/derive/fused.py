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
releases the GIL in every ufunc used; the C encoder and packer release it for the whole block).
The value invariants the producer owes (spec Section 9) are checked per block on the codes and
scales before they are packed: by the C packer in the same pass, else by
``validate.grouped_problems``.  Each block is written straight into its slice of the output
planes, or compared with its slice of the stored ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ..encoder.common import check_words, grouped_format
from ..encoder.dispatch import encode_block
from ..encoder.host import ErrorSums
from ..encoder.host import native_available as native_encoder_available
from ..encoder.numpy_backend import CHUNK_ELEMENTS
from ..formats import MAXABS_F16_RECIP_RNE_V1, NumericFormat
from ..layouts import PlaneSpec, lookup_layout
from ..layouts.base import ceil_div
from ..layouts.row_split import BlockResult, RowSplitK128, native_packer_available
from ..logical import GroupedCodes
from ..recipe.materialize import DerivedWords
from ..validate import grouped_problems

__all__ = [
    "BLOCK_ELEMENTS",
    "BlockHook",
    "Digest",
    "PlaneSink",
    "encode_pack_grouped",
    "encode_pack_torch",
    "equals_packed_grouped",
]

BLOCK_ELEMENTS = 1 << 19
"""Source values per row block with the C encoder and packer; the numpy path keeps its own
:data:`~.encoder.numpy_backend.CHUNK_ELEMENTS`.  A native block costs two Python-level calls,
so blocks larger than numpy's 256 K win: on the 2.2 GB benchmark, cold, verify took
2.69-2.88 s at 256 K, 2.30-2.55 s at 512 K and 2.34-2.81 s at 1 M values (convert unchanged
within noise).  A block of BF16 or F16 source rows (1 MiB) plus its codes and scales stays
within a core's 2 MiB L2; F32 source rows alone fill it."""

Words = npt.NDArray[np.generic] | DerivedWords
"""Encoder input: the mapped source words, or a derived tensor produced a row block at a time."""

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


class PlaneSink(Protocol):
    """Where a worker stores a tensor's planes: ``write(plane, offset, data)`` puts ``data``
    at byte ``offset`` of plane number ``plane``; callable from several threads at once, for
    disjoint ranges (the writer's :attr:`~.container.writer.Reservation.sink`: a ``pwrite``
    into the reserved bytes of the output file)."""

    def write(self, plane: int, offset: int, data: npt.NDArray[np.uint8], /) -> None: ...


def encode_pack_grouped(
    words: Words,
    source_dtype: str,
    fmt_name: str,
    *,
    tensor: str | None = None,
    threads: int = 2,
    chunk_elements: int | None = None,
    on_block: BlockHook | None = None,
    kernel: str = "native",
    out: list[npt.NDArray[np.uint8]] | None = None,
    profile: str = MAXABS_F16_RECIP_RNE_V1,
    sink: PlaneSink | None = None,
    importance: npt.NDArray[np.uint32] | None = None,
    factor: npt.NDArray[np.uint32] | None = None,
) -> list[npt.NDArray[np.uint8]]:
    """Encode ``words`` [N, K] and pack them; ``on_block(r0, r1, words, codes, scales, sums)``
    (optional, called from worker threads) sees each encoded row block, e.g. for statistics.
    ``out`` (optional): planes of the layout's sizes to pack into, returned as the planes.
    ``sink`` (optional, with ``out``): each packed block goes to ``sink.write`` instead of
    into ``out``, which is then not written at all (convert passes the tensor's reserved
    bytes of the output file as both: ``out`` read-only views, ``sink`` a ``pwrite`` there,
    so no plane is held in memory and no mapped page is written)."""
    specs, strides = _plane_geometry(words, source_dtype, fmt_name)
    if out is not None and [int(p.size) for p in out] != [spec.nbytes for spec in specs]:
        raise ValueError("out planes do not have the layout's sizes")
    if sink is not None and out is None:
        raise ValueError("a sink needs the out planes it writes")
    planes = out if out is not None else [np.empty(spec.nbytes, dtype=np.uint8) for spec in specs]
    _run_blocks(words, source_dtype, fmt_name, planes, strides, False, None, tensor, threads,
                chunk_elements, on_block, kernel, profile, sink, importance, factor)  # fmt: skip
    return planes


TORCH_BLOCK_ELEMENTS = 1 << 24
"""Source values per row block on the torch path: each block is one ``encode_torch`` call (its
own chunk pipeline: on CUDA pinned buffers of a few chunks) whose codes and scales are packed
and stored before the next block starts, so host memory follows the block, not the tensor."""


def encode_pack_torch(
    words: Words,
    source_dtype: str,
    fmt_name: str,
    *,
    device: str,
    out: list[npt.NDArray[np.uint8]],
    sink: PlaneSink | None = None,
    tensor: str | None = None,
    block_elements: int = TORCH_BLOCK_ELEMENTS,
    chunk_elements: int | None = None,
    on_block: BlockHook | None = None,
) -> list[npt.NDArray[np.uint8]]:
    """The planes :func:`encode_pack_grouped` gives, encoded by the torch backend on ``device``
    (``"cuda"`` in convert; ``"cpu"`` runs the same code in CI) one row block at a time and
    packed into ``out`` (or handed to ``sink.write``, as there).  ``on_block`` sees each block
    (sums ``None``), e.g. to spot-check rows on the host.  Errors name tensor rows."""
    from ..encoder.torch_backend import encode_torch

    specs, strides = _plane_geometry(words, source_dtype, fmt_name)
    if [int(p.size) for p in out] != [spec.nbytes for spec in specs]:
        raise ValueError("out planes do not have the layout's sizes")
    fmt = grouped_format(fmt_name)
    layout = lookup_layout(fmt.layout)
    assert isinstance(layout, RowSplitK128)
    n, k = words.shape
    rows = max(1, block_elements // k)
    scratch = [np.empty(rows * st, dtype=np.uint8) for st in strides] if sink is not None else []
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        block_words = np.asarray(words[r0:r1])
        enc = encode_torch(block_words, source_dtype, fmt, device=device, tensor=tensor,
                           chunk_elements=chunk_elements, row0=r0)  # fmt: skip
        _raise_invalid(fmt, enc.codes, enc.scales, tensor)
        if on_block is not None:
            on_block(r0, r1, block_words, enc.codes, enc.scales, None)
        if sink is None:
            parts = [p[r0 * st : r1 * st] for p, st in zip(out, strides, strict=True)]
        else:
            parts = [b[: (r1 - r0) * st] for b, st in zip(scratch, strides, strict=True)]
        for part, new in zip(parts, layout.pack(fmt, enc), strict=True):
            part[...] = np.asarray(new).reshape(-1).view(np.uint8)
        if sink is not None:
            for i, (part, st) in enumerate(zip(parts, strides, strict=True)):
                sink.write(i, r0 * st, part)
    return out


class Digest(Protocol):
    def update(self, data: npt.NDArray[np.uint8], /) -> None: ...


def equals_packed_grouped(
    words: Words,
    source_dtype: str,
    fmt_name: str,
    stored: list[npt.NDArray[np.uint8]],
    *,
    tensor: str | None = None,
    threads: int = 2,
    chunk_elements: int | None = None,
    on_block: BlockHook | None = None,
    digests: list[Digest] | None = None,
    kernel: str = "native",
    profile: str = MAXABS_F16_RECIP_RNE_V1,
    importance: npt.NDArray[np.uint32] | None = None,
    factor: npt.NDArray[np.uint32] | None = None,
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
    lock = threading.Lock()
    done: dict[int, int] = {}  # first row -> end row of compared blocks not yet digested
    digested = 0  # rows [0, digested) of every plane are in the digests

    def after(r0: int, r1: int) -> None:
        nonlocal digested
        assert digests is not None
        with lock:  # digests need the bytes in order; blocks finish in any order
            done[r0] = r1
            while digested in done:
                end = done.pop(digested)
                for digest, plane, stride in zip(digests, stored, strides, strict=True):
                    digest.update(plane[digested * stride : end * stride])
                digested = end

    equal = _run_blocks(words, source_dtype, fmt_name, stored, strides, True,
                        after if digests is not None else None, tensor, threads, chunk_elements,
                        on_block, kernel, profile, None, importance, factor)  # fmt: skip
    for digest, plane, stride in zip(digests or [], stored, strides, strict=False):
        digest.update(plane[digested * stride :])  # nothing, unless a plane has a tail
    return equal


def _plane_geometry(
    words: Words, source_dtype: str, fmt_name: str
) -> tuple[list[PlaneSpec], list[int]]:
    """The layout's planes for ``words`` and each plane's bytes per row (checked input)."""
    fmt = grouped_format(fmt_name)
    check_words(words, source_dtype)  # type: ignore[arg-type]  # shape and dtype only
    n, k = words.shape
    specs = lookup_layout(fmt.layout).planes(fmt, (n, k))
    return specs, [spec.nbytes // n if n else 0 for spec in specs]


def _run_blocks(
    words: Words,
    source_dtype: str,
    fmt_name: str,
    planes: list[npt.NDArray[np.uint8]],
    strides: list[int],
    compare: bool,
    after: Callable[[int, int], None] | None,
    tensor: str | None,
    threads: int,
    chunk_elements: int | None,
    on_block: BlockHook | None,
    kernel: str,
    profile: str = MAXABS_F16_RECIP_RNE_V1,
    sink: PlaneSink | None = None,
    importance: npt.NDArray[np.uint32] | None = None,
    factor: npt.NDArray[np.uint32] | None = None,
) -> bool:
    """Encode, check and pack ``words`` one row block at a time, writing each block's rows of
    every plane into ``planes`` (or, with ``sink``, packing them into per-thread scratch and
    handing that to ``sink.write``) or, with ``compare``, comparing them with ``planes``;
    ``after`` is told each finished block.  Returns False when a comparison found a
    difference."""
    fmt = grouped_format(fmt_name)
    assert fmt.group_size is not None
    n, k = words.shape
    layout = lookup_layout(fmt.layout)
    assert isinstance(layout, RowSplitK128)
    native_pack = kernel == "native" and native_packer_available()
    if chunk_elements is None:
        native = kernel == "native" and native_encoder_available() and native_pack
        chunk_elements = BLOCK_ELEMENTS if native else CHUNK_ELEMENTS
    n_groups = ceil_div(k, fmt.group_size)
    rows = max(1, chunk_elements // k)
    differs = threading.Event()
    scratch = threading.local()  # per-thread packed rows of one block, reused (with a sink)

    def targets(r0: int, r1: int) -> list[npt.NDArray[np.uint8]]:
        if sink is None:
            return [p[r0 * st : r1 * st] for p, st in zip(planes, strides, strict=True)]
        bufs: list[npt.NDArray[np.uint8]] | None = getattr(scratch, "bufs", None)
        if bufs is None:
            bufs = scratch.bufs = [np.empty(rows * st, dtype=np.uint8) for st in strides]
        return [b[: (r1 - r0) * st] for b, st in zip(bufs, strides, strict=True)]

    def block(r0: int) -> None:
        r1 = min(n, r0 + rows)
        codes = np.empty((r1 - r0, k), dtype=np.int8)
        scales = np.empty((r1 - r0, n_groups), dtype=np.uint16)
        block_words = words[r0:r1]  # a view, or the derived rows
        sums = encode_block(
            block_words, source_dtype, fmt, r0, codes, scales, tensor, kernel,
            with_sums=on_block is not None, profile=profile, importance=importance,
            factor=factor,
        )  # fmt: skip
        if on_block is not None:
            on_block(r0, r1, block_words, codes, scales, sums)
        parts = targets(r0, r1)
        if not _pack_block(layout, fmt, codes, scales, parts, compare, native_pack, tensor):
            differs.set()
        if sink is not None:
            for i, (part, st) in enumerate(zip(parts, strides, strict=True)):
                sink.write(i, r0 * st, part)
        if after is not None:
            after(r0, r1)

    starts = range(0, n, rows)
    if threads <= 1 or len(starts) == 1:
        for r0 in starts:
            block(r0)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(block, starts))
    return not differs.is_set()


def _pack_block(
    layout: RowSplitK128,
    fmt: NumericFormat,
    codes: npt.NDArray[np.int8],
    scales: npt.NDArray[np.uint16],
    parts: list[npt.NDArray[np.uint8]],
    compare: bool,
    native_pack: bool,
    tensor: str | None,
) -> bool:
    """Check one block's values, then pack them into ``parts`` (one slice per plane) or, with
    ``compare``, compare them with ``parts``; False when a comparison found a difference."""
    if native_pack:  # checks the values, then packs or compares, without the GIL
        result = layout.pack_rows_into(fmt, codes, scales, parts, compare=compare)
        if result is BlockResult.INVALID:  # pragma: no cover - the encoder cannot emit these
            _raise_invalid(fmt, codes, scales, tensor)
            raise RuntimeError("the row-split packer rejected values grouped_problems accepts")
        return result is not BlockResult.DIFFERENT
    _raise_invalid(fmt, codes, scales, tensor)
    same = True
    for part, new in zip(parts, layout.pack(fmt, GroupedCodes(codes, scales)), strict=True):
        if not compare:
            part[...] = new
        elif not np.array_equal(part, new):
            same = False
    return same


def _raise_invalid(
    fmt: NumericFormat,
    codes: npt.NDArray[np.int8],
    scales: npt.NDArray[np.uint16],
    tensor: str | None,
) -> None:
    """Raise the first Section 5/6.1 problem of a block, if it has one (defence in depth: the
    encoder cannot emit one); the C packer only says that there is one, grouped_problems says
    which."""
    problems = grouped_problems(fmt, codes, scales, tensor)
    if problems:
        raise problems[0]
