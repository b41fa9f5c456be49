"""The stored planes of one tensor, for ``verify``'s per-tensor checks: read-only byte arrays
over the artifact's mapping (:class:`StoredPlanes`, released on exit) and their byte-for-byte
comparison with packed planes (:func:`bytes_equal`, :func:`stored_equals`)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..container import Artifact, PlaneEntry

__all__ = ["StoredPlanes", "bytes_equal", "stored_equals"]

_COMPARE_WORDS = 1 << 17
"""64-bit words compared per step (1 MiB): the comparison's boolean temporary stays in cache
instead of being a fresh allocation the size of the plane (2.5x faster on 300 MB)."""


def bytes_equal(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> bool:
    if a.size != b.size:
        return False
    whole = a.size // 8 * 8
    a64, b64 = a[:whole].view(np.uint64), b[:whole].view(np.uint64)
    for i in range(0, a64.size, _COMPARE_WORDS):
        if not np.array_equal(a64[i : i + _COMPARE_WORDS], b64[i : i + _COMPARE_WORDS]):
            return False
    return bool(np.array_equal(a[whole:], b[whole:]))


class StoredPlanes:
    """The stored planes of a tensor as read-only byte arrays over the mapping, released on
    exit (the caller must not keep them).  A class, not a generator context manager: this
    runs once per tensor, and the generator's set-up cost more than a one-element check."""

    __slots__ = ("arrays", "views")

    def __init__(self, art: Artifact, name: str, planes: tuple[PlaneEntry, ...]) -> None:
        self.views = [art.plane_buffer(name, p.name) for p in planes]
        self.arrays: list[npt.NDArray[np.uint8]] = []

    def __enter__(self) -> list[npt.NDArray[np.uint8]]:
        self.arrays = [np.frombuffer(v, dtype=np.uint8) for v in self.views]
        return self.arrays

    def __exit__(self, *exc: object) -> None:
        self.arrays.clear()
        for view in self.views:
            view.release()


def stored_equals(art: Artifact, name: str, planes: list[npt.NDArray[np.uint8]]) -> bool:
    """True when every stored plane of ``name`` equals ``planes`` byte for byte."""
    info = art.tensors[name]
    for plane, packed in zip(info.planes, planes, strict=True):
        view = art.plane_buffer(name, plane.name)
        try:
            stored = np.frombuffer(view, dtype=np.uint8)
            same = bytes_equal(stored, packed)
            del stored
        finally:
            view.release()
        if not same:
            return False
    return True
