"""Derivation in blocks: the concat, transpose and reshape of a plan entry's transforms as a
tree of nodes, each yielding any flat range of its row-major words, so a derived tensor is
produced block by block and never held whole.

Contract: :func:`derivation` builds the node of a plan entry from its source arrays (the
recorded transforms, in order) and checks the planned shape; ``node.flat(a, b)`` gives words
[a, b) of the derived tensor, ``node.mapped()`` the whole tensor when it is a view of the mapped
source.  :class:`DerivedWords` is the encoder's view of a derived grouped input (row blocks on
request).  The words are moved, never converted: every node keeps the source dtype.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ..errors import SourceError
from ..layouts.base import ceil_div

if TYPE_CHECKING:
    from ..source import SourceArray
    from .entries import PlanEntry

__all__ = ["TRANSPOSE_STRIP", "TRANSPOSE_TILE", "DerivedWords", "Node", "derivation"]


class Node:
    """One step of a derivation (a source, reshape, concat or transpose) over its children."""

    shape: tuple[int, ...]
    dtype: np.dtype[np.generic]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        """Words [a, b) of the row-major order, 1-D and C-contiguous (a view when possible)."""
        raise NotImplementedError

    def mapped(self) -> npt.NDArray[np.generic] | None:
        """The whole tensor as a view of the mapped source, when it is one."""
        return None


class _Source(Node):
    def __init__(self, words: npt.NDArray[np.generic]) -> None:
        self.words, self.shape, self.dtype = words, tuple(words.shape), words.dtype

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        return self.words.reshape(-1)[a:b]

    def mapped(self) -> npt.NDArray[np.generic] | None:
        return self.words


class _Reshape(Node):
    def __init__(self, child: Node, shape: tuple[int, ...]) -> None:
        self.child, self.shape, self.dtype = child, shape, child.dtype

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        return self.child.flat(a, b)  # row-major reshape keeps the word order

    def mapped(self) -> npt.NDArray[np.generic] | None:
        m = self.child.mapped()
        return None if m is None else m.reshape(self.shape)


class _Concat(Node):
    def __init__(self, parts: list[Node], axis: int) -> None:
        first = parts[0].shape
        self.parts, self.dtype = parts, parts[0].dtype
        self.axis = axis % len(first) if first else 0
        self.shape = (
            *first[: self.axis],
            sum(p.shape[self.axis] for p in parts),
            *first[self.axis + 1 :],
        )
        # Rows of the concatenation: the dimensions before the axis; each part contributes
        # a run of ``width`` consecutive words to every row.
        self.widths = [math.prod(p.shape[self.axis :]) for p in parts]
        self.row = sum(self.widths)

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        if b <= a or self.row == 0:
            return np.empty(0, dtype=self.dtype)
        # Only the words of [a, b): the partial rows at either end piece by piece, the whole
        # rows between them part by part.  A row can be far larger than a block (along axis 0
        # it is the whole tensor), so a block never reads whole rows it only touches.
        row = self.row
        r0, r1 = ceil_div(a, row), b // row  # whole rows [r0, r1)
        pieces: list[npt.NDArray[np.generic]] = []
        if r1 < r0:  # inside one row
            self._partial(pieces, a // row, a % row, a % row + (b - a))
        else:
            if a % row:
                self._partial(pieces, r0 - 1, a % row, row)
            if r1 > r0:
                whole = [
                    p.flat(r0 * w, r1 * w).reshape(r1 - r0, w)
                    for p, w in zip(self.parts, self.widths, strict=True)
                ]
                pieces.append(np.concatenate(whole, axis=1).reshape(-1))
            if b % row:
                self._partial(pieces, r1, 0, b % row)
        if len(pieces) == 1:
            return np.ascontiguousarray(pieces[0])
        return np.concatenate(pieces)

    def _partial(self, pieces: list[npt.NDArray[np.generic]], r: int, lo: int, hi: int) -> None:
        """Append words [lo, hi) of row ``r`` (offsets within the row)."""
        start = 0
        for p, w in zip(self.parts, self.widths, strict=True):
            s, e = max(lo, start), min(hi, start + w)
            if s < e:
                pieces.append(p.flat(r * w + s - start, r * w + e - start))
            start += w


class _ConcatTiles:
    """A rank-two concatenation of mapped parts read as ``[i0:i1, c0:c1]`` tiles, each copied
    from the parts' rows and columns it covers only (a transpose of a concat then reads strips
    the way it reads a mapped source, instead of building the concatenation whole)."""

    ndim = 2

    def __init__(
        self, parts: list[npt.NDArray[np.generic]], axis: int, shape: tuple[int, ...]
    ) -> None:
        self.parts, self.axis, self.shape = parts, axis, shape

    def __getitem__(self, key: tuple[slice, slice]) -> npt.NDArray[np.generic]:
        rows, cols = key
        span = (rows, cols)[self.axis].indices(self.shape[self.axis])[:2]
        pieces, start = [], 0
        for part in self.parts:
            n = part.shape[self.axis]
            lo, hi = max(span[0], start) - start, min(span[1], start + n) - start
            if lo < hi:
                cut = slice(lo, hi)
                pieces.append(part[cut, cols] if self.axis == 0 else part[rows, cut])
            start += n
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:  # pragma: no cover - strips ask for non-empty tiles
            return np.empty((0, 0), dtype=self.parts[0].dtype)
        return np.concatenate(pieces, axis=self.axis)


TRANSPOSE_TILE = 1024
"""Source rows per tile of a transposed strip: a tile of 1024 source rows x 64 columns of F32
(256 KiB) stays in L2 while numpy transposes it, where a whole strip of a [65536, K] source
(its columns 8 KiB apart) did not: 0.07 GB/s before tiling."""
TRANSPOSE_STRIP = 64
"""Output rows (source columns) per strip at least: each source row then gives the strip
64 adjacent words (two cache lines of BF16)."""


class _Transpose(Node):
    """Rank two: output row i is source column i.  Strips of at least
    :data:`TRANSPOSE_STRIP` output rows are copied from the mapped source (or the mapped parts
    of a concat, :class:`_ConcatTiles`) in cache-sized tiles (:data:`TRANSPOSE_TILE` source
    rows) and kept per thread for the next request, since the encoder asks for consecutive row
    blocks smaller than a strip."""

    def __init__(self, child: Node) -> None:
        self.child, self.dtype = child, child.dtype
        self.shape = tuple(reversed(child.shape))
        self._whole: npt.NDArray[np.generic] | None = None
        self._cache = threading.local()

    def _source(self) -> npt.NDArray[np.generic] | _ConcatTiles:
        m = self.child.mapped()
        if m is not None:
            return m
        child = self.child
        if isinstance(child, _Concat) and len(child.shape) == 2:
            parts = [p.mapped() for p in child.parts]
            if all(p is not None for p in parts):  # tiles read from the mapped parts
                return _ConcatTiles(parts, child.axis, child.shape)  # type: ignore[arg-type]
        if self._whole is None:  # no mapped source to read strips of (e.g. a double transpose)
            self._whole = self.child.flat(0, self.child.size).reshape(self.child.shape)
        return self._whole

    def _strip(
        self, src: npt.NDArray[np.generic] | _ConcatTiles, r0: int, r1: int
    ) -> tuple[int, npt.NDArray[np.generic]]:
        """(first output row, strip) holding output rows [r0, r1)."""
        cached = getattr(self._cache, "strip", None)
        if cached is not None and cached[0] <= r0 and r1 <= cached[0] + cached[1].shape[0]:
            return cached  # type: ignore[no-any-return]
        rows = src.shape[0]
        # At least the rows asked for; up to TRANSPOSE_STRIP while the strip stays <= 8 MiB.
        width = min(TRANSPOSE_STRIP, max(1, (8 << 20) // max(1, rows * self.dtype.itemsize)))
        end = min(self.shape[0], max(r1, r0 + width))
        strip = np.empty((end - r0, rows), dtype=self.dtype)
        for i0 in range(0, rows, TRANSPOSE_TILE):
            i1 = min(rows, i0 + TRANSPOSE_TILE)
            strip[:, i0:i1] = src[i0:i1, r0:end].T
        self._cache.strip = (r0, strip)
        return r0, strip

    def flat(self, a: int, b: int) -> npt.NDArray[np.generic]:
        src = self._source()
        if isinstance(src, np.ndarray) and src.ndim != 2:
            whole = np.ascontiguousarray(src.T).reshape(-1)
            return whole[a:b]
        n = self.shape[1]
        if b <= a or n == 0:
            return np.empty(0, dtype=self.dtype)
        r0, r1 = a // n, ceil_div(b, n)
        first, strip = self._strip(src, r0, r1)
        flat = strip[r0 - first : r1 - first].reshape(-1)
        return flat[a - r0 * n : b - r0 * n]


def derivation(entry: PlanEntry, arrays: list[SourceArray]) -> Node:
    node: Node = _Source(arrays[0].words)
    for step in entry.transforms:
        if step.op == "concat":
            by_name = {a.name: a.words for a in arrays}
            node = _Concat([_Source(by_name[n]) for n in step.inputs], step.axis or 0)
        elif step.op == "transpose":
            node = _Transpose(node)
        else:
            node = _Reshape(node, tuple(step.shape or ()))
    if tuple(node.shape) != entry.shape:
        raise SourceError(
            f"derived shape {list(node.shape)} differs from the planned {list(entry.shape)}",
            tensor=entry.output,
        )
    return node


class DerivedWords:
    """The encoder input of a derived grouped entry: [N, K] words derived on request, a block
    of rows at a time (``words[r0:r1]``, ``words[r0:r1, c0:c1]``); never built whole unless
    :meth:`whole` is called."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self.shape = (int(node.shape[0]), int(node.shape[1]))
        self.dtype = node.dtype
        self.ndim = 2

    def rows(self, r0: int, r1: int) -> npt.NDArray[np.generic]:
        k = self.shape[1]
        return self._node.flat(r0 * k, r1 * k).reshape(-1, k)

    def __getitem__(self, key: slice | tuple[slice, slice]) -> npt.NDArray[np.generic]:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        r0, r1, step = rows.indices(self.shape[0])
        if step != 1:
            raise IndexError("DerivedWords takes contiguous row ranges")
        block = self.rows(r0, max(r0, r1))
        return block if cols == slice(None) else block[:, cols]

    def whole(self) -> npt.NDArray[np.generic]:
        return self.rows(0, self.shape[0])
