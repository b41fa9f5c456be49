"""What every storage layout offers, and the helpers the four layouts share.

Contract (docs/layouts.md is the normative text):

* A layout maps one logical tensor (:mod:`ninfer_convert.logical`) of one registered format to an
  ordered list of byte *planes*, and back, bit-exactly.
* :meth:`Layout.planes` and :meth:`Layout.encoded_size` depend only on (format, logical shape)
  and are computed with Python ints, so a reader never infers an extent from payload length.
* :meth:`Layout.pack` writes canonical padding (all zero bits); :meth:`Layout.padding_problems`
  reports any padding bit that is not zero.  Padding never changes a logical word.
* :meth:`Layout.unpack` accepts any buffer per plane (``bytes``, ``memoryview`` of a memory map,
  a numpy array) and returns freshly allocated arrays in native byte order, so the result stays
  valid after the underlying file is closed.

Errors: a name outside the closed registries raises :class:`FormatError`; a shape the layout
cannot store, a logical tensor of the wrong kind, dtype or shape, or a plane buffer of the
wrong size is an API misuse and raises :class:`UsageError`.  A code word that does not fit the
layout's bit width raises :class:`ValueInvariantError` (packing it would silently change it).
Readers convert these into :class:`ArtifactError` naming the file and tensor.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import FormatError, UsageError
from ..formats import NumericFormat, lookup_format
from ..logical import DirectWords, FP8RowWords, GroupedCodes, LogicalTensor, NVFP4Words

__all__ = [
    "MAX_DIM",
    "MAX_RANK",
    "Buffer",
    "FormatLike",
    "Layout",
    "PlaneSpec",
    "ceil_div",
    "logical_shape",
    "plane_u8",
]

MAX_RANK = 16
"""Largest tensor rank any layout accepts (numpy itself stops at 64)."""

MAX_DIM = 1 << 40
"""Largest single dimension; 2^40 elements is already a terabyte of bytes."""

# Upper bound on (product of the non-zero dimensions) * 8 so that numpy can always form the
# array shape, even for a zero-size direct tensor whose other dimensions are large.
_MAX_ELEMENT_PRODUCT = 1 << 59

# A plane buffer: anything numpy.frombuffer accepts (bytes, bytearray, memoryview, ndarray).
Buffer = bytes | bytearray | memoryview | npt.NDArray[Any]
FormatLike = str | NumericFormat


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for non-negative Python ints, without floating point."""
    return -(-a // b)


@dataclass(frozen=True)
class PlaneSpec:
    """One plane of an encoded tensor.

    ``extents`` is the plane's physical array shape in units of ``word`` (a numpy dtype string:
    ``'u1'`` for bytes, ``'<u2'`` for little-endian 16-bit words, ...); ``nbytes`` equals
    ``prod(extents) * itemsize(word)``.
    """

    name: str
    nbytes: int
    extents: tuple[int, ...]
    word: str


def logical_shape(logical: LogicalTensor) -> tuple[int, ...]:
    """The logical tensor shape of a logical representation (the codes' shape when quantized)."""
    if isinstance(logical, DirectWords):
        return tuple(int(d) for d in logical.words.shape)
    if isinstance(logical, (GroupedCodes, NVFP4Words, FP8RowWords)):
        return tuple(int(d) for d in logical.codes.shape)
    raise UsageError(f"not a logical tensor: {type(logical).__name__}")


def plane_u8(buf: Buffer, spec: PlaneSpec) -> npt.NDArray[np.uint8]:
    """View one plane buffer as flat bytes after checking its size against ``spec``."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            buf = np.ascontiguousarray(buf)
        arr = buf.reshape(-1).view(np.uint8)
    else:
        arr = np.frombuffer(buf, dtype=np.uint8)
    if arr.size != spec.nbytes:
        raise UsageError(
            f"plane {spec.name!r} holds {arr.size} bytes but the layout needs {spec.nbytes}"
        )
    return arr


def check_array(
    arr: object, what: str, kind: str, itemsize: int, shape: tuple[int, ...]
) -> npt.NDArray[Any]:
    """Check that ``arr`` is an ndarray of the given dtype kind/size and exact shape."""
    if not isinstance(arr, np.ndarray):
        raise UsageError(f"{what} must be a numpy array, not {type(arr).__name__}")
    if arr.dtype.kind != kind or arr.dtype.itemsize != itemsize:
        want = {"u": "uint", "i": "int"}[kind] + str(itemsize * 8)
        raise UsageError(
            f"{what} has dtype {arr.dtype} but must be {want} words",
            hint="pass the logical words (e.g. .view(np.uint32) of float32 data), never values",
        )
    if tuple(arr.shape) != shape:
        raise UsageError(f"{what} has shape {list(arr.shape)} but must be {list(shape)}")
    return arr


class Layout(abc.ABC):
    """A registered storage layout.  Subclasses fill in the per-layout geometry and packing."""

    name: str
    """The exact registered layout name."""
    formats: frozenset[str]
    """Formats this layout stores (a closed whitelist)."""
    logical_type: type
    """The logical representation this layout packs and unpacks."""

    # -- geometry ------------------------------------------------------------------------------

    def resolve(self, fmt: FormatLike) -> NumericFormat:
        """Resolve ``fmt`` against the registry and refuse formats this layout cannot store."""
        entry = lookup_format(fmt)
        if entry.name not in self.formats or entry.layout != self.name:
            raise FormatError(
                f"format {entry.name} cannot be stored with layout {self.name}",
                hint=f"{entry.name} uses layout {entry.layout}; {self.name} stores only "
                + ", ".join(sorted(self.formats)),
            )
        return entry

    def check_shape(self, fmt: FormatLike, shape: Sequence[int]) -> tuple[int, ...]:
        """Validate a logical shape for ``fmt`` and return it as a tuple of Python ints."""
        entry = self.resolve(fmt)
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise UsageError(f"shape must be a sequence of ints, not {type(shape).__name__}")
        dims: list[int] = []
        for d in shape:
            # bool is an int subclass; a True dimension is a bug, not a 1.
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
                raise UsageError(f"shape {list(shape)!r} has a non-integer dimension {d!r}")
            dims.append(int(d))
        if len(dims) > MAX_RANK:
            raise UsageError(f"shape has rank {len(dims)}, more than the limit {MAX_RANK}")
        for d in dims:
            if d < 0 or d > MAX_DIM:
                raise UsageError(f"shape {dims} has dimension {d} outside [0, {MAX_DIM}]")
        product = 1
        for d in dims:
            product *= max(d, 1)
        if product > _MAX_ELEMENT_PRODUCT:
            raise UsageError(f"shape {dims} has too many elements ({product})")
        self._check_shape(entry, tuple(dims))
        return tuple(dims)

    @abc.abstractmethod
    def _check_shape(self, fmt: NumericFormat, shape: tuple[int, ...]) -> None:
        """Layout-specific shape rules (rank, positivity, divisibility)."""

    def physical_extents(self, fmt: FormatLike, shape: Sequence[int]) -> tuple[int, ...]:
        """The padded extents of the tensor as stored (recorded in the container header)."""
        dims = self.check_shape(fmt, shape)
        return self._physical(self.resolve(fmt), dims)

    @abc.abstractmethod
    def _physical(self, fmt: NumericFormat, shape: tuple[int, ...]) -> tuple[int, ...]: ...

    def planes(self, fmt: FormatLike, shape: Sequence[int]) -> list[PlaneSpec]:
        """The ordered planes of a tensor of this format and logical shape."""
        dims = self.check_shape(fmt, shape)
        return self._planes(self.resolve(fmt), dims)

    @abc.abstractmethod
    def _planes(self, fmt: NumericFormat, shape: tuple[int, ...]) -> list[PlaneSpec]: ...

    def encoded_size(self, fmt: FormatLike, shape: Sequence[int]) -> int:
        """Total bytes of all planes (alignment gaps of the container excluded)."""
        return sum(p.nbytes for p in self.planes(fmt, shape))

    # -- codec ---------------------------------------------------------------------------------

    def pack(self, fmt: FormatLike, logical: LogicalTensor) -> list[npt.NDArray[np.uint8]]:
        """Encode a logical tensor into one flat little-endian byte array per plane."""
        entry = self.resolve(fmt)
        if not isinstance(logical, self.logical_type):
            raise UsageError(
                f"{entry.name} packs {self.logical_type.__name__}, not {type(logical).__name__}"
            )
        shape = self.check_shape(entry, logical_shape(logical))
        out = self._pack(entry, shape, logical)
        # Cheap self-check of the geometry contract; a mismatch is a bug in this module.
        specs = self._planes(entry, shape)
        for arr, spec in zip(out, specs, strict=True):
            if arr.dtype != np.uint8 or arr.ndim != 1 or arr.size != spec.nbytes:
                raise RuntimeError(f"{self.name}: packed plane {spec.name} has the wrong size")
        return out

    @abc.abstractmethod
    def _pack(
        self, fmt: NumericFormat, shape: tuple[int, ...], logical: LogicalTensor
    ) -> list[npt.NDArray[np.uint8]]: ...

    def unpack(
        self, fmt: FormatLike, shape: Sequence[int], planes: Sequence[Buffer]
    ) -> LogicalTensor:
        """Decode planes back to the logical tensor (fresh native-order arrays)."""
        entry = self.resolve(fmt)
        dims = self.check_shape(entry, shape)
        return self._unpack(entry, dims, self._views(entry, dims, planes))

    @abc.abstractmethod
    def _unpack(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> LogicalTensor: ...

    def padding_problems(
        self, fmt: FormatLike, shape: Sequence[int], planes: Sequence[Buffer]
    ) -> list[str]:
        """Describe every region of non-zero padding (plane, row, byte); empty when canonical."""
        entry = self.resolve(fmt)
        dims = self.check_shape(entry, shape)
        return self._padding_problems(entry, dims, self._views(entry, dims, planes))

    def _padding_problems(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: list[npt.NDArray[np.uint8]]
    ) -> list[str]:
        """Layouts without padding have nothing to report."""
        return []

    def has_padding(self) -> bool:
        """Whether :meth:`padding_problems` can report anything: False for a layout without
        padding bits (it keeps the base check, which reports nothing), so a writer may skip
        the call and the plane views it needs."""
        return type(self)._padding_problems is not Layout._padding_problems

    def _views(
        self, fmt: NumericFormat, shape: tuple[int, ...], planes: Sequence[Buffer]
    ) -> list[npt.NDArray[np.uint8]]:
        specs = self._planes(fmt, shape)
        if isinstance(planes, (bytes, bytearray, memoryview, np.ndarray)) or len(planes) != len(
            specs
        ):
            raise UsageError(
                f"{self.name} stores {fmt.name} in {len(specs)} planes "
                f"({', '.join(s.name for s in specs)}); pass a sequence of that many buffers"
            )
        return [plane_u8(buf, spec) for buf, spec in zip(planes, specs, strict=True)]


def describe_bad_bytes(
    plane: str, bad: npt.NDArray[np.bool_], values: npt.NDArray[np.uint8], col0: int, limit: int = 8
) -> list[str]:
    """Messages for the first ``limit`` True cells of ``bad`` ([rows, bytes] of one plane).

    ``col0`` is the byte offset within the row of column 0 of ``bad``.  A final message gives the
    total count when more were found, so the report stays short for a badly damaged plane.
    """
    rows, cols = np.nonzero(bad)
    out = [
        f"plane {plane!r} row {int(r)} byte {int(c) + col0}: padding bits are "
        f"0x{int(values[r, c]):02x}, expected zero"
        for r, c in zip(rows[:limit], cols[:limit], strict=True)
    ]
    if rows.size > limit:
        out.append(f"plane {plane!r}: {rows.size} bytes with non-zero padding in total")
    return out
