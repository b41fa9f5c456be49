"""The work of one cluster task, in plain Python: what a Ray worker runs, testable without Ray.

Contract:

* :func:`write_shard` writes the payload of one shard of a conversion: the prelude's
  :data:`~ninfer_convert.container.wire.PRELUDE_SIZE` placeholder bytes, then the planes of
  the plan entries ``[start, stop)`` at the writer's own offsets
  (:func:`~ninfer_convert.container.placement.place_tensors`), each derived by
  :func:`~ninfer_convert.derive.derive_packed` exactly as a local convert derives it.  It writes
  a per-attempt file ``shard-NNNNN.<random>.attempt`` in the run's staging folder and renames it
  to ``shard-NNNNN.payload`` only once every byte is written and fsynced, so a retry never sees
  a half-written shard of an earlier attempt.  It returns a :class:`ShardResult`: the payload's
  size, the header entries (plane digests taken from the stored bytes, padding checked as
  :meth:`~ninfer_convert.container.ArtifactWriter.complete` checks it), the source digests and
  the progress counts.  A user error (a non-finite value, ...) is raised as the same typed
  :class:`~ninfer_convert.errors.NinferError` as locally and removes the attempt's file; an
  ``OSError`` of the file system becomes a :class:`~ninfer_convert.errors.ResourceError`.
* :func:`probe` is the pre-flight check a worker runs on its node: the package version, a
  fingerprint of the files it must read (:func:`fingerprint`: sizes and a digest of each
  file's header) and, given a staging folder, whether it sees the driver's token file there
  and can write a probe file of its own.
* Test-only fault hook: when the environment variable :data:`FAULT_DIR_ENV` names a folder
  holding a file ``kill-shard-NNNNN``, the first attempt of shard NNNNN that removes that file
  kills its own process with SIGKILL half-way through its tensors (tests/test_cluster.py
  checks that Ray retries it and the bytes still equal a local run).  Never set it otherwise.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import signal
import socket
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._version import __version__
from ..container.checks import check_tensor_geometry, require_canonical_padding
from ..container.placement import place_tensors
from ..container.publish import resource_error
from ..container.schema import PlaneEntry, TensorEntry
from ..container.wire import PRELUDE_SIZE, digest_hex, new_digest
from ..derive import derive_packed, provenance_of
from ..formats import lookup_format
from ..layouts import check_combination
from ..recipe import PlanEntry
from ..source import SourceCheckpoint, open_source

__all__ = [
    "FAULT_DIR_ENV",
    "Fingerprint",
    "ProbeResult",
    "ShardResult",
    "ShardTask",
    "attempt_name",
    "fingerprint",
    "payload_name",
    "probe",
    "write_shard",
]

FAULT_DIR_ENV = "NINFER_TEST_FAULT_DIR"
"""Test-only: the folder of fault triggers (see the module contract)."""

_HEAD_BYTES = 1 << 20
"""Bytes digested of a file that has no header of its own (an index, a side file)."""
_MAX_SAFETENSORS_HEADER = 100 << 20


def payload_name(number: int) -> str:
    """The name a shard task's finished payload gets in the staging folder."""
    return f"shard-{number:05d}.payload"


def attempt_name(number: int) -> str:
    """A fresh per-attempt name (``*.attempt``) for one attempt of a shard task."""
    return f"shard-{number:05d}.{uuid.uuid4().hex}.attempt"


@dataclass(frozen=True)
class ShardTask:
    """One shard of a conversion: the plan entries ``[start, stop)`` (0-based, plan order)."""

    number: int
    start: int
    stop: int
    staging: str
    source: str
    """What the worker opens (:func:`~ninfer_convert.source.open_source`)."""
    alignment: int
    device: str
    threads: int


@dataclass(frozen=True)
class ShardResult:
    number: int
    path: str
    payload_end: int
    tensors: tuple[TensorEntry, ...]
    source_digests: dict[str, str]
    spot_rows: int
    source_bytes: int
    node: str
    seconds: float
    cpu_s: float
    """CPU seconds of the worker process (all its threads) while the task ran."""


class _FileSink:
    """A :class:`~ninfer_convert.derive.fused.PlaneSink` that ``pwrite`` s into the payload."""

    def __init__(self, fd: int, offsets: Sequence[int], sizes: Sequence[int]) -> None:
        self._fd = fd
        self._offsets = offsets
        self._sizes = sizes

    def write(self, plane: int, offset: int, data: npt.NDArray[np.uint8], /) -> None:
        n = int(data.size)
        if offset < 0 or offset + n > self._sizes[plane]:
            raise ValueError(f"bytes [{offset}, {offset + n}) lie outside plane {plane}")
        view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
        at = self._offsets[plane] + offset
        done = 0
        while done < n:
            stored = os.pwrite(self._fd, view[done:], at + done)
            if stored <= 0:
                raise OSError(errno.EIO, f"pwrite stored no bytes at offset {at + done}")
            done += stored


def node_label() -> str:
    """The host name and process id a result or probe came from."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _fault_point(number: int) -> None:
    folder = os.environ.get(FAULT_DIR_ENV)
    if not folder:
        return
    trigger = Path(folder) / f"kill-shard-{number:05d}"
    try:
        trigger.unlink()  # only one attempt can claim the trigger
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def write_shard(
    task: ShardTask, entries: Sequence[PlanEntry], source: SourceCheckpoint | None = None
) -> ShardResult:
    """Write one shard's payload (see the module contract); ``entries`` is the whole plan's."""
    started, cpu = time.perf_counter(), time.process_time()
    src = source if source is not None else open_source(task.source)
    mine = list(entries[task.start : task.stop])
    geometry = []
    for entry in mine:
        layout = check_combination(entry.format, lookup_format(entry.format).layout)
        dims = layout.check_shape(entry.format, entry.shape)
        geometry.append(
            (layout, dims, layout.planes(entry.format, dims),
             layout.physical_extents(entry.format, dims))
        )  # fmt: skip
    placed = place_tensors(
        ([s.nbytes for s in g[2]] for g in geometry), alignment=task.alignment, max_shard_size=None
    )
    end = placed[-1].end if placed else PRELUDE_SIZE
    staging = Path(task.staging)
    attempt = staging / attempt_name(task.number)
    final = staging / payload_name(task.number)
    try:
        fd = os.open(attempt, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise resource_error(exc, attempt, doing=f"writing shard {task.number}") from None
    try:
        tensors, digests, spot = _fill(task, src, mine, geometry, placed, fd, end)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(attempt, final)
    except OSError as exc:
        raise resource_error(exc, attempt, doing=f"writing shard {task.number}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            attempt.unlink()
    return ShardResult(
        number=task.number,
        path=str(final),
        payload_end=end,
        tensors=tuple(tensors),
        source_digests=digests,
        spot_rows=spot,
        source_bytes=sum(e.source_bytes for e in mine),
        node=node_label(),
        seconds=time.perf_counter() - started,
        cpu_s=time.process_time() - cpu,
    )


def _fill(
    task: ShardTask,
    src: SourceCheckpoint,
    mine: list[PlanEntry],
    geometry: list[Any],
    placed: list[Any],
    fd: int,
    end: int,
) -> tuple[list[TensorEntry], dict[str, str], int]:
    os.pwrite(fd, bytes(PRELUDE_SIZE), 0)
    if hasattr(os, "posix_fallocate") and end > PRELUDE_SIZE:
        # Blocks first: a full disk is an OSError here, never a SIGBUS on a mapped page.
        os.posix_fallocate(fd, PRELUDE_SIZE, end - PRELUDE_SIZE)
    os.ftruncate(fd, end)
    mapped = mmap.mmap(fd, end)
    tensors: list[TensorEntry] = []
    digests: dict[str, str] = {}
    spot = 0
    try:
        whole = np.frombuffer(mapped, dtype=np.uint8)
        for i, (entry, (layout, dims, specs, physical), place) in enumerate(
            zip(mine, geometry, placed, strict=True)
        ):
            if i == len(mine) // 2:
                _fault_point(task.number)
            if i + 1 < len(mine):  # the next tensor's cold read overlaps this one's encoding
                src.prefetch(s.name for s in mine[i + 1].sources)
            planes = [whole[o : o + s.nbytes] for o, s in zip(place.offsets, specs, strict=True)]
            sink = _FileSink(fd, place.offsets, [s.nbytes for s in specs])
            packed = derive_packed(
                entry, src, device=task.device, threads=task.threads,
                seed=zlib.crc32(entry.output.encode()), out=planes, sink=sink,
            )  # fmt: skip
            digests.update(packed.source_digests)
            spot += packed.spot_rows
            del packed
            require_canonical_padding(layout, entry.format, dims, planes, entry.output)
            tensor = TensorEntry(
                name=entry.output,
                format=entry.format,
                layout=layout.name,
                shape=dims,
                physical=physical,
                planes=tuple(
                    PlaneEntry(s.name, o, s.nbytes, digest_hex(memoryview(p.data)))
                    for s, o, p in zip(specs, place.offsets, planes, strict=True)
                ),
                role=entry.role,
                provenance=provenance_of(entry),
            )
            check_tensor_geometry(tensor, f"tensor {entry.output!r}")
            tensors.append(tensor)
            del planes
        del whole
    finally:
        with contextlib.suppress(BufferError):  # a view still held: unmapped when dropped
            mapped.close()
    return tensors, digests, spot


# ---------------------------------------------------------------------------------------------
# pre-flight


Fingerprint = tuple[tuple[str, int, str], ...]
"""(path, size, digest of the file's header) of each file, in the order given."""


def _head_length(path: Path, size: int) -> int:
    """The bytes that identify a file: a safetensors file's length word and JSON header, a
    .ninfer shard's prelude (which holds its header's digest), else the first MiB."""
    if path.suffix == ".safetensors" and size >= 8:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
        return 8 + min(n, _MAX_SAFETENSORS_HEADER, size - 8)
    if path.suffix == ".ninfer":
        return min(size, PRELUDE_SIZE)
    return min(size, _HEAD_BYTES)


def fingerprint(paths: Sequence[str]) -> Fingerprint:
    """Sizes and header digests of ``paths``; a missing or unreadable file gets size -1 and
    the reason instead of a digest."""
    out = []
    for name in paths:
        path = Path(name)
        try:
            size = path.stat().st_size
            h = new_digest()
            with open(path, "rb") as fh:
                h.update(fh.read(_head_length(path, size)))
            out.append((name, size, h.hexdigest()))
        except OSError as exc:
            out.append((name, -1, exc.strerror or str(exc)))
    return tuple(out)


@dataclass(frozen=True)
class ProbeResult:
    node: str
    version: str
    fingerprint: Fingerprint
    token_seen: str | None
    """The driver's token as this worker read it from the staging folder (None: no file)."""
    probe_file: str | None
    """The file this worker wrote in the staging folder (its content: :attr:`probe_token`)."""
    probe_token: str
    write_error: str | None


def probe(
    paths: Sequence[str], staging: str | None = None, token_file: str | None = None
) -> ProbeResult:
    """The pre-flight check of one worker (see the module contract)."""
    token_seen: str | None = None
    probe_file: str | None = None
    write_error: str | None = None
    mine = uuid.uuid4().hex
    if staging is not None and token_file is not None:
        with contextlib.suppress(OSError):
            token_seen = (Path(staging) / token_file).read_text()
        target = Path(staging) / f"probe-{mine}"
        try:
            with open(target, "x") as fh:
                fh.write(mine)
                fh.flush()
                os.fsync(fh.fileno())
            probe_file = str(target)
        except OSError as exc:
            write_error = exc.strerror or str(exc)
    return ProbeResult(
        node=node_label(),
        version=__version__,
        fingerprint=fingerprint(paths),
        token_seen=token_seen,
        probe_file=probe_file,
        probe_token=mine,
        write_error=write_error,
    )
