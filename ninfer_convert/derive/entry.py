"""The words stored for a plan entry: the one derivation ``convert`` writes and ``verify``
re-derives, so producer and verifier cannot drift apart.

Contract:

* :func:`derive_logical` materialises the entry's sources (transforms, conversions, copy paths
  and constraint checks live in :mod:`ninfer_convert.recipe`), runs the rule's encoder profile
  for grouped formats and checks the value invariants of the result.
* :func:`derive_packed` derives an entry and packs it with its registered layout: grouped
  tensors on the host take the fused row-block path (:mod:`.fused`), direct formats and copy
  paths stream block by block (:func:`plane_stream`), the CUDA path streams row blocks with a
  host spot check of a few rows per block.
* :func:`host_grouped_equals` and :func:`host_stream_equals` decide, block by block and
  without building the planes, whether stored planes equal the re-derivation (verify).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..encoder import encode_grouped_words
from ..encoder.parity import spot_check_rows
from ..errors import EncodeError
from ..factors import factor_words
from ..formats import MAXABS_F16_RECIP_RNE_V1, lookup_format
from ..layouts import lookup_layout
from ..logical import GroupedCodes, LogicalTensor
from ..recipe import EncodeInput, PlanEntry, materialize
from ..recipe.materialize import (
    DerivedWords,
    DirectStream,
    PlaneBlocks,
    stream_copy,
    stream_direct,
    streams_directly,
)
from ..source import SourceCheckpoint
from ..validate import validate_logical
from .fused import (
    BlockHook,
    Digest,
    PlaneSink,
    encode_pack_grouped,
    encode_pack_torch,
    equals_packed_grouped,
)

__all__ = [
    "DerivedTensor",
    "PackedTensor",
    "derive_into",
    "derive_logical",
    "derive_packed",
    "host_grouped_equals",
    "host_stream_equals",
    "plane_stream",
]


@dataclass(frozen=True)
class DerivedTensor:
    """The stored words of one plan entry, and what was read to make them."""

    entry: PlanEntry
    logical: LogicalTensor
    encode_input: EncodeInput | None
    """The source words a grouped tensor was encoded from (for error statistics)."""
    source_digests: dict[str, str]
    device: str


def derive_logical(
    entry: PlanEntry,
    source: SourceCheckpoint,
    *,
    backend: str = "numpy",
    device: str | None = None,
    threads: int = 2,
) -> DerivedTensor:
    """Materialise one plan entry and encode it: exactly the words convert stores."""
    m = materialize(entry, source)
    value = m.value
    used = "cpu"
    if isinstance(value, EncodeInput):
        encode_input: EncodeInput | None = value
        profile = entry.encoder_profile or MAXABS_F16_RECIP_RNE_V1
        if device == "cuda" and profile == MAXABS_F16_RECIP_RNE_V1:  # others: host only
            backend, used = "torch", "cuda"
        logical: LogicalTensor = encode_grouped_words(
            _whole(value.words),
            value.source_dtype,
            entry.format,
            backend=backend,
            device=device,
            tensor=entry.output,
            threads=threads,
            profile=profile,
            importance=entry.importance,
            factor=factor_words(entry),
        )
    else:
        encode_input = None
        logical = value
    # The producer establishes every value invariant before a byte is written (spec Sec. 9).
    validate_logical(entry.format, logical, entry.output)
    return DerivedTensor(entry, logical, encode_input, dict(m.source_digests), used)


@dataclass(frozen=True)
class PackedTensor:
    """The stored planes of one plan entry (what convert writes and verify compares)."""

    entry: PlanEntry
    planes: list[npt.NDArray[np.uint8]]
    source_digests: dict[str, str]
    logical: LogicalTensor | None
    """The logical words, when the path built them (not on the fused host grouped path)."""
    encode_input: EncodeInput | None
    """The source words of a grouped tensor (a view of the memory-mapped source)."""
    spot_rows: int = 0


def _whole(words: npt.NDArray[np.generic] | DerivedWords) -> npt.NDArray[np.generic]:
    return words.whole() if isinstance(words, DerivedWords) else words


def derive_packed(
    entry: PlanEntry,
    source: SourceCheckpoint,
    *,
    device: str = "cpu",
    threads: int = 2,
    seed: int = 0,
    on_block: BlockHook | None = None,
    out: list[npt.NDArray[np.uint8]] | None = None,
    sink: PlaneSink | None = None,
) -> PackedTensor:
    """Derive one plan entry and pack it with its registered layout.

    Grouped tensors on the host take the fused row-block path (same bytes as
    :func:`derive_logical` followed by ``pack``, proven by tests/test_fused.py); ``on_block``
    sees each encoded block there. Direct formats stream block by block
    (:func:`~.recipe.materialize.stream_direct`). On CUDA a sample of rows is re-encoded on the
    host; with ``out`` the CUDA path streams row blocks too (:func:`_packed_torch`, four
    spot-checked rows per block). ``out`` (optional): writable planes of the layout's sizes,
    filled in place and returned as the planes (convert passes the tensor's reserved slice of
    the output file, so the grouped and direct paths hold one block, never a plane). ``sink``
    (optional, with ``out``): the bytes go to ``sink.write`` instead, and ``out`` is only
    returned (convert's ``pwrite`` into the reserved bytes; see :class:`~.fused.PlaneSink`).
    """
    if sink is not None and out is None:
        raise ValueError("a sink needs the out planes it writes")
    fmt = lookup_format(entry.format)
    host_only = entry.encoder_profile not in (None, MAXABS_F16_RECIP_RNE_V1)
    if fmt.is_grouped and (device == "cpu" or host_only):
        enc, source_digests = _grouped_input(entry, source)
        planes = encode_pack_grouped(
            enc.words, enc.source_dtype, entry.format, tensor=entry.output,
            threads=threads, on_block=on_block, out=out,
            profile=entry.encoder_profile or MAXABS_F16_RECIP_RNE_V1, sink=sink,
            importance=entry.importance, factor=factor_words(entry),
        )  # fmt: skip
        return PackedTensor(entry, planes, source_digests, None, enc)
    if fmt.is_grouped and device == "cuda" and out is not None:
        return _packed_torch(entry, source, "cuda", out, sink, seed, on_block)
    if out is not None and (streams_directly(entry) or entry.copy is not None):
        streamed_digests, blocks = plane_stream(entry, source)
        pos = [0] * len(out)
        sizes = [int(p.size) for p in out]
        for i, data in blocks():
            if pos[i] + data.size > sizes[i]:
                raise ValueError("the out planes do not have the layout's sizes")
            if sink is not None:
                sink.write(i, pos[i], data)
            else:
                out[i][pos[i] : pos[i] + data.size] = data
            pos[i] += data.size
        if pos != sizes:
            raise ValueError("the out planes do not have the layout's sizes")
        return PackedTensor(entry, out, dict(streamed_digests), None, None)
    derived = derive_logical(entry, source, device=device, threads=threads)
    spot = 0
    if derived.device == "cuda" and derived.encode_input is not None:
        assert isinstance(derived.logical, GroupedCodes)
        spot = spot_check_rows(
            _whole(derived.encode_input.words),
            derived.encode_input.source_dtype,
            entry.format,
            derived.logical,
            tensor=entry.output,
            seed=seed,
        )
    layout = lookup_layout(fmt.layout)
    planes = [np.asarray(p) for p in layout.pack(entry.format, derived.logical)]
    if out is not None:  # copy paths and CUDA: packed whole, then stored in place
        for i, (dst, plane) in enumerate(zip(out, planes, strict=True)):
            if sink is not None:
                sink.write(i, 0, plane.reshape(-1).view(np.uint8))
            else:
                dst[...] = plane.reshape(-1).view(np.uint8)
        planes = out
    return PackedTensor(
        entry, planes, dict(derived.source_digests), derived.logical, derived.encode_input, spot
    )


def derive_into(
    entry: PlanEntry,
    source: SourceCheckpoint,
    out: list[npt.NDArray[np.uint8]],
    *,
    device: str = "cpu",
    threads: int = 2,
    seed: int = 0,
) -> tuple[Mapping[str, str], int]:
    """``derive_packed(entry, source, ..., out=out)`` (the same bytes in ``out``, the same
    checks and errors) returning only what convert keeps of it: (source digests, rows
    spot-checked).  A direct-format entry's blocks go straight into its plane: for the
    one-element tensors of a run, the layers of :func:`plane_stream` and the
    :class:`PackedTensor` cost more than the tensor."""
    if not streams_directly(entry):
        packed = derive_packed(entry, source, device=device, threads=threads, seed=seed, out=out)
        return packed.source_digests, packed.spot_rows
    stream = stream_direct(entry, source)
    if len(out) != 1:  # every direct layout has one plane
        raise ValueError("the out planes do not have the layout's sizes")
    plane = out[0]
    size = int(plane.size)
    le = _little_endian(stream.word_dtype)
    pos = 0
    for block in stream.blocks():
        data = block.astype(le, copy=False).view(np.uint8)
        end = pos + data.size
        if end > size:
            raise ValueError("the out planes do not have the layout's sizes")
        plane[pos:end] = data
        pos = end
    if pos != size:
        raise ValueError("the out planes do not have the layout's sizes")
    return stream.source_digests, 0


@functools.cache
def _little_endian(dtype: np.dtype[np.generic]) -> np.dtype[np.generic]:
    return dtype.newbyteorder("<")


def _packed_torch(
    entry: PlanEntry,
    source: SourceCheckpoint,
    device: str,
    out: list[npt.NDArray[np.uint8]],
    sink: PlaneSink | None,
    seed: int,
    on_block: BlockHook | None = None,
) -> PackedTensor:
    """A grouped entry encoded by the torch backend on ``device`` a row block at a time
    (:func:`~.fused.encode_pack_torch`) into ``out``/``sink``; a few random rows of every
    block are re-encoded on the host (:func:`~.encoder.parity.spot_check_rows`) before the
    block is stored.  ``device="cpu"`` runs the same code (tests)."""
    enc, source_digests = _grouped_input(entry, source)
    checked = 0

    def spot(r0: int, r1: int, words: Any, codes: Any, scales: Any, sums: Any) -> None:
        nonlocal checked
        checked += spot_check_rows(np.asarray(words), enc.source_dtype, entry.format,
                                   GroupedCodes(codes, scales), tensor=entry.output,
                                   seed=seed + r0)  # fmt: skip
        if on_block is not None:
            on_block(r0, r1, words, codes, scales, sums)

    planes = encode_pack_torch(enc.words, enc.source_dtype, entry.format, device=device,
                               out=out, sink=sink, tensor=entry.output, on_block=spot)  # fmt: skip
    return PackedTensor(entry, planes, source_digests, None, enc, checked)


def host_grouped_equals(
    entry: PlanEntry,
    source: SourceCheckpoint,
    stored: list[npt.NDArray[np.uint8]],
    *,
    threads: int = 2,
    on_block: BlockHook | None = None,
    digests: list[Digest] | None = None,
) -> tuple[bool, dict[str, str], EncodeInput]:
    """Whether ``derive_packed(entry, source, device="cpu").planes`` equals ``stored`` byte for
    byte, decided block by block without building the planes (the same materialize and the
    same fused encode-and-pack); returns (equal, source digests, encoder input).  For a
    grouped entry only; ``verify`` calls :func:`derive_packed` to locate differences.
    ``digests`` are fed the stored planes on the way (see :func:`~.fused.equals_packed_grouped`)
    once the source has been read; an exception leaves them incomplete."""
    enc, source_digests = _grouped_input(entry, source)
    equal = equals_packed_grouped(
        enc.words, enc.source_dtype, entry.format, stored, tensor=entry.output,
        threads=threads, on_block=on_block, digests=digests,
        profile=entry.encoder_profile or MAXABS_F16_RECIP_RNE_V1,
        importance=entry.importance, factor=factor_words(entry),
    )  # fmt: skip
    return equal, source_digests, enc


def plane_stream(
    entry: PlanEntry, source: SourceCheckpoint
) -> tuple[Mapping[str, str], Callable[[], PlaneBlocks]]:
    """The stored planes of a direct-format or copy-path entry as consecutive byte blocks
    (:func:`~.recipe.materialize.stream_direct`, :func:`~.recipe.materialize.stream_copy`):
    (source digests, blocks).  Each block is valid until the next one is asked for."""
    if entry.copy is not None:
        return stream_copy(entry, source)
    stream = stream_direct(entry, source)
    return stream.source_digests, _direct_blocks(stream)


def _direct_blocks(stream: DirectStream) -> Callable[[], PlaneBlocks]:
    """The stream's words as (plane 0, little-endian bytes) blocks."""
    le = stream.word_dtype.newbyteorder("<")

    def blocks() -> PlaneBlocks:
        for block in stream.blocks():
            yield 0, block.astype(le, copy=False).view(np.uint8)

    return blocks


def _same_bytes(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> bool:
    """Byte equality of two uint8 blocks (``tobytes`` for small ones: ``np.array_equal``'s
    own overhead dominated the check of tiny tensors)."""
    if a.size != b.size:
        return False
    if a.size <= 4096:
        return a.tobytes() == b.tobytes()
    return bool(np.array_equal(a, b))


@functools.lru_cache(maxsize=4096)
def _plane_sizes(format_name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Bytes of each plane, from the layout registry; cached per (format, shape), as a MoE
    checkpoint repeats a few shapes tens of thousands of times."""
    fmt = lookup_format(format_name)
    return tuple(spec.nbytes for spec in lookup_layout(fmt.layout).planes(fmt, shape))


def host_stream_equals(
    entry: PlanEntry,
    source: SourceCheckpoint,
    stored: list[npt.NDArray[np.uint8]],
    digests: list[Digest] | None = None,
) -> tuple[bool, dict[str, str]]:
    """Whether the stored planes of a direct-format or copy-path entry equal its re-derivation,
    decided block by block (:func:`plane_stream`) without building the tensor; ``digests``
    (one per stored plane) are fed every stored byte in order on the way.  Returns (equal,
    source digests)."""
    if entry.copy is None:
        stream = stream_direct(entry, source)
        source_digests: Mapping[str, str] = stream.source_digests
    else:
        source_digests, blocks = stream_copy(entry, source)
    sizes = list(_plane_sizes(entry.format, entry.shape))
    if digests is not None and len(digests) != len(stored):
        raise ValueError("one digest per stored plane")
    if [int(p.size) for p in stored] != sizes:
        for digest, plane in zip(digests or [], stored, strict=False):
            digest.update(plane)
        return False, dict(source_digests)
    if entry.copy is None and len(sizes) == 1:
        # A direct format (one plane): its blocks compared and digested without the (plane,
        # bytes) pairs of plane_stream, which cost more than a one-element tensor's check.
        return _direct_equals(stream, stored[0], digests[0] if digests else None), dict(
            source_digests
        )
    if entry.copy is None:  # pragma: no cover - every direct layout has one plane
        blocks = _direct_blocks(stream)
    equal = True
    pos = [0] * len(stored)
    for i, data in blocks():
        part = stored[i][pos[i] : pos[i] + data.size]
        if equal and not _same_bytes(part, data):
            equal = False
        if digests is not None:
            digests[i].update(part)
        pos[i] += data.size
    return equal and pos == sizes, dict(source_digests)


def _direct_equals(
    stream: DirectStream, plane: npt.NDArray[np.uint8], digest: Digest | None
) -> bool:
    """Whether the stored plane equals the stream's little-endian words (the plane has the
    layout's size), feeding ``digest`` the stored bytes in order on the way."""
    le = stream.word_dtype.newbyteorder("<")
    equal = True
    pos = 0
    for block in stream.blocks():
        data = block.astype(le, copy=False).view(np.uint8)
        part = plane[pos : pos + data.size]
        if equal and not _same_bytes(part, data):
            equal = False
        if digest is not None:
            digest.update(part)
        pos += data.size
    return equal and pos == plane.size


def _grouped_input(
    entry: PlanEntry, source: SourceCheckpoint
) -> tuple[EncodeInput, dict[str, str]]:
    """The encoder input and source digests of a grouped entry (its host-path materialize)."""
    m = materialize(entry, source)
    if not isinstance(m.value, EncodeInput):  # pragma: no cover - plan invariant
        raise EncodeError("grouped entry without encoder input", tensor=entry.output)
    return m.value, dict(m.source_digests)
