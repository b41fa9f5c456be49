"""The artifact's integrity checks: header, shard, plane and side-file digests and zero gaps.

Contract (docs/container.md section 6): the checks collect their problems as
:class:`~ninfer_convert.errors.IntegrityError` values rather than stop at the first, in a
fixed order: file by file in shard order, the header digest, the index's digest of that
shard, then each tensor in stored order with the gaps before its planes and, when asked, its
plane digests; the side files come last (:class:`~.artifact.Artifact` checks them in
recorded order).  Plane bytes and side files are read in chunks of at most
:data:`~.dir_snapshot.CHUNK_BYTES` (a side-file check that keeps nothing: of
:data:`SIDE_CHUNK_BYTES`, into one buffer), through the mapping and the descriptors pinned at
open, never beyond a side file's recorded size.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import IntegrityError, UsageError
from .container_file import ContainerFile
from .dir_snapshot import CHUNK_BYTES, SideHandle
from .schema import IndexFile, SideFile
from .wire import PRELUDE_SIZE, new_digest

__all__ = [
    "SIDE_CHUNK_BYTES",
    "container_problems",
    "gap_problems",
    "plane_digest",
    "side_file_check",
    "side_file_range",
]

SIDE_CHUNK_BYTES = 8 << 20
"""Bytes read per call by a side-file check that keeps nothing (into one reused buffer)."""


def container_problems(
    containers: list[ContainerFile],
    index: IndexFile | None,
    verify_tensor: Callable[[str], list[IntegrityError]] | None,
) -> list[IntegrityError]:
    """Header digest, index digest and gap problems of every container file, and after each
    tensor's gaps its plane-digest problems from ``verify_tensor`` (unless it is None)."""
    problems: list[IntegrityError] = []
    for number, c in enumerate(containers, start=1):
        where = str(c.path)
        if c.mm is None:
            raise UsageError("the artifact is closed", path=where)
        if c.stored_digest != c.actual_digest:
            problems.append(
                IntegrityError(
                    f"header digest mismatch: stored {c.stored_digest.hex()}, computed "
                    f"{c.actual_digest.hex()}",
                    path=where,
                )
            )
        if index is not None:
            recorded = index.shards[number - 1].digest
            if c.stored_digest.hex() != recorded:
                problems.append(
                    IntegrityError(
                        f"shard header digest {c.stored_digest.hex()} differs from "
                        f"{recorded} recorded in the index",
                        path=where,
                    )
                )
        cursor = PRELUDE_SIZE
        for t in c.header.tensors:
            for p in t.planes:
                problems += gap_problems(c, cursor, p.offset, t.name, p.name)
                cursor = p.offset + p.nbytes
            if verify_tensor is not None:
                problems += verify_tensor(t.name)
    return problems


def plane_digest(c: ContainerFile, offset: int, nbytes: int) -> str:
    """The hex digest of ``nbytes`` stored bytes at ``offset`` of ``c``."""
    h = new_digest()
    pos = offset
    while pos < offset + nbytes:
        step = min(CHUNK_BYTES, offset + nbytes - pos)
        view = c.buffer(pos, step)
        h.update(view)
        view.release()
        pos += step
    return h.hexdigest()


def gap_problems(
    c: ContainerFile, start: int, end: int, tensor: str, plane: str
) -> list[IntegrityError]:
    """The non-zero bytes of the gap ``[start, end)`` before ``plane`` (one problem at most)."""
    if end <= start:
        return []
    n = end - start
    if n <= _ZERO_GAP_BYTES and c.mm is not None and c.mm[start:end] == _zeros(n):
        # A small gap (alignment padding: a tiny tensor's is most of its 4 KiB) compared with
        # zero bytes as one string: a tenth of the array scan below, only needed to word a
        # problem.
        return []
    view = c.buffer(start, n)
    arr = np.frombuffer(view, dtype=np.uint8)
    nonzero = np.flatnonzero(arr)
    count = int(nonzero.size)
    first = int(nonzero[0]) + start if count else 0
    del arr
    view.release()
    if not count:
        return []
    return [
        IntegrityError(
            f"{count} non-zero byte(s) in the gap [{start}, {end}) before plane {plane!r}, "
            f"first at byte {first}",
            kind="nonzero_gap",
            path=str(c.path),
            tensor=tensor,
        )
    ]


_ZERO_GAP_BYTES = 64 << 10
"""Gaps up to this size are compared with zero bytes (:func:`_zeros`) before any scan."""


@functools.lru_cache(maxsize=64)
def _zeros(n: int) -> bytes:
    """``n`` zero bytes (the padding of a run of equal tensors repeats a few gap sizes)."""
    return bytes(n)


def side_file_check(
    f: SideFile, handle: SideHandle | None, path: str, artifact: Path, *, keep: bool
) -> tuple[IntegrityError | None, bytes | None]:
    """(problem, bytes when ``keep``) of the side file ``f`` at ``path``, read through its
    pinned descriptor ``handle`` and never beyond its recorded size; ``artifact`` is the path
    the artifact was opened under, for the error when it is closed."""
    if handle is None or (handle.fd is None and handle.error is None):
        raise UsageError("the artifact is closed", path=str(artifact))
    if handle.error is not None:
        return IntegrityError(f"side file {f.name!r}: {handle.error.message}", path=path), None
    assert handle.fd is not None
    if handle.size != f.size:
        return (
            IntegrityError(
                f"side file {f.name!r} is {handle.size} bytes, recorded {f.size} bytes "
                f"with digest {f.digest}",
                path=path,
            ),
            None,
        )
    h = new_digest()
    parts: list[bytes] = []
    pos = 0
    # A check that keeps nothing reads into one reused buffer of SIDE_CHUNK_BYTES: a side file
    # (compensation.safetensors can be GBs) costs that much memory, not two read chunks.
    buf = None if keep else memoryview(bytearray(min(SIDE_CHUNK_BYTES, f.size)))
    try:
        while pos < f.size:
            if buf is None:
                chunk = os.pread(handle.fd, min(CHUNK_BYTES, f.size - pos), pos)
                parts.append(chunk)
                n = len(chunk)
                h.update(chunk)
            else:
                n = os.preadv(handle.fd, [buf[: min(SIDE_CHUNK_BYTES, f.size - pos)]], pos)
                h.update(buf[:n])
            if not n:
                break
            pos += n
    except OSError as exc:
        return IntegrityError(f"side file {f.name!r}: {exc.strerror}", path=path), None
    if pos != f.size or h.hexdigest() != f.digest:
        return (
            IntegrityError(
                f"side file {f.name!r} is {pos} bytes with digest {h.hexdigest()}, "
                f"recorded {f.size} bytes with digest {f.digest}",
                path=path,
            ),
            None,
        )
    return None, b"".join(parts) if keep else None


def side_file_range(
    f: SideFile, handle: SideHandle | None, path: str, artifact: Path, offset: int, size: int
) -> bytes:
    """``size`` bytes at ``offset`` of the side file ``f`` at ``path`` through its pinned
    descriptor ``handle``, within its recorded size (outside it: a :class:`UsageError`); not
    digest-checked (see :meth:`~.artifact.Artifact.read_side_range`)."""
    if offset < 0 or size < 0 or offset + size > f.size:
        raise UsageError(
            f"bytes [{offset}, {offset + size}) are outside the side file {f.name!r} of "
            f"{f.size} bytes",
            path=path,
        )
    if handle is None or (handle.fd is None and handle.error is None):
        raise UsageError("the artifact is closed", path=str(artifact))
    if handle.error is not None:
        raise IntegrityError(f"side file {f.name!r}: {handle.error.message}", path=path)
    assert handle.fd is not None
    parts: list[bytes] = []
    pos = offset
    try:
        while pos < offset + size:
            chunk = os.pread(handle.fd, offset + size - pos, pos)
            if not chunk:
                break
            parts.append(chunk)
            pos += len(chunk)
    except OSError as exc:
        raise IntegrityError(f"side file {f.name!r}: {exc.strerror}", path=path) from None
    if pos != offset + size:
        raise IntegrityError(
            f"side file {f.name!r} ends at byte {pos}, before its recorded {f.size} bytes",
            path=path,
        )
    return parts[0] if len(parts) == 1 else b"".join(parts)
