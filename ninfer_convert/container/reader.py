"""Reader of .ninfer artifacts: one file, one shard, a shard index, or a model directory.

Contract (docs/container.md, "Reading" and "Validation"):

* :func:`open_artifact` memory-maps every container file and validates the prelude and the
  whole header (schema, registries, geometry, plane placement, shard index consistency) before
  any payload byte is touched.  Every failure is an :class:`ArtifactError` naming the file (and
  the tensor when there is one) and giving the numbers; a digest mismatch is an
  :class:`IntegrityError`.  Nothing else escapes, whatever the bytes: sizes are checked against
  the file before anything is allocated, so a hostile file cannot cause a huge allocation.
* The header digest is checked at open (the header is small); pass
  ``check_header_digest=False`` to open a damaged artifact anyway and collect every problem with
  :meth:`Artifact.integrity_problems`.  Plane digests are checked only by that method and by
  :meth:`Artifact.verify_tensor` (one tensor's share of it).
* :meth:`Artifact.read` returns the logical tensor as fresh arrays (valid after ``close``);
  :meth:`Artifact.read_rows` decodes only the requested rows of a row-split tensor.
* One snapshot (docs/container.md sections 5 and 9): the model directory is opened once and
  every file of the artifact (index, shards, side files) is opened through that descriptor
  before :func:`open_artifact` returns, without following symbolic links, without blocking on
  a FIFO, and only when ``fstat`` says it is a regular file.  Side files stay open and are
  read (never beyond their recorded size) by :meth:`Artifact.read_side_file` and the integrity
  check, so a concurrent ``convert --force`` cannot pair one version's shards with another's
  side files.  A file's ``shard`` object must match the name it was opened under, and
  :attr:`Artifact.stray_files` lists container-like names that are not part of the artifact.

The reader is split by job: this module resolves what a path names and opens one snapshot of
it (a single file, a shard, or the shard index and its shards); :mod:`.dir_snapshot` opens the
files through the directory; :mod:`.container_file` validates one file's prelude and header;
:mod:`.typed_json` is the strict JSON of the header and index; :mod:`.artifact` is the open
artifact and :mod:`.integrity` its digest and gap checks; :mod:`.artifact_path` is the path
check made before opening.  ``__all__`` re-exports their public names for callers of this
module.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ArtifactError, IntegrityError
from .artifact import Artifact, PlaneInfo, TensorInfo
from .artifact_path import check_artifact_path
from .container_file import ContainerFile
from .dir_snapshot import entry_kind, open_dir, open_in_directory, read_bounded, replaced
from .schema import IndexFile, paused_gc
from .typed_json import INDEX_DEPTH, parse_typed
from .wire import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    SINGLE_NAME,
    canonical_json,
    parse_shard_name,
    shard_name,
)

__all__ = ["Artifact", "PlaneInfo", "TensorInfo", "check_artifact_path", "open_artifact"]

_SNAPSHOT_TRIES = 5
"""Opens tried when the directory is replaced while it is being opened (convert --force)."""


def open_artifact(path: str | os.PathLike[str], *, check_header_digest: bool = True) -> Artifact:
    """Open a .ninfer file, one shard, a ``model.ninfer.index.json`` or a model directory.

    The directory is opened once and every file of the artifact (shards, index, side files)
    is opened through that descriptor before this returns, so the artifact is one consistent
    snapshot even while ``convert --force`` replaces the directory (docs/container.md
    section 9): when the directory is replaced or removed while it is being opened and a file
    is missing because of it, the open starts again on what the name holds now."""
    p = Path(path)
    for attempt in range(1, _SNAPSHOT_TRIES + 1):
        dir_fd, is_dir = open_dir(p)
        try:
            with paused_gc():  # see paused_gc: the collector's passes cost more than the parse
                art = _open_snapshot(p, dir_fd, is_dir, check_header_digest)
        except ArtifactError:
            again = attempt < _SNAPSHOT_TRIES and replaced(p, dir_fd, is_dir)
            os.close(dir_fd)
            if again:
                continue
            raise
        except BaseException:
            os.close(dir_fd)
            raise
        if attempt < _SNAPSHOT_TRIES and art._side_missing() and replaced(p, dir_fd, is_dir):
            art.close()
            continue
        return art
    raise AssertionError("unreachable")  # pragma: no cover - the last try returns or raises


def _open_snapshot(p: Path, dir_fd: int, is_dir: bool, check_header_digest: bool) -> Artifact:
    """One try of :func:`open_artifact`; the caller owns ``dir_fd`` until this returns."""
    directory = p if is_dir else p.parent
    if is_dir:
        has_index = entry_kind(dir_fd, INDEX_NAME, directory) is not None
        has_single = entry_kind(dir_fd, SINGLE_NAME, directory) is not None
        if has_index and has_single:
            raise ArtifactError(
                f"directory holds both {SINGLE_NAME} and {INDEX_NAME}; which one is the "
                "artifact is ambiguous",
                path=str(p),
            )
        if not has_index and not has_single:
            raise ArtifactError(
                f"no artifact here: expected {SINGLE_NAME} or {INDEX_NAME}", path=str(p)
            )
        name = INDEX_NAME if has_index else SINGLE_NAME
    else:
        name = p.name
        if entry_kind(dir_fd, name, directory) is None:
            raise ArtifactError("no such file or directory", path=str(p))
    if name.endswith(".index.json"):
        return _open_index(p, dir_fd, directory, name, check_header_digest)
    expect = parse_shard_name(name) or (1, 1)
    container = ContainerFile(
        dir_fd, name, directory / name, check_header_digest=check_header_digest, expect=expect
    )
    try:
        whole = name == SINGLE_NAME
        return Artifact(p, None, [container], None, dir_fd=dir_fd, whole_directory=whole)
    except BaseException:
        container.close()
        raise


def _open_index(
    opened: Path, dir_fd: int, directory: Path, name: str, check_digest: bool
) -> Artifact:
    index_path = directory / name
    where = str(index_path)
    fd, st = open_in_directory(dir_fd, name, where)
    try:
        if st.st_size > MAX_INDEX_BYTES:
            raise ArtifactError(
                f"index is {st.st_size} bytes, over the {MAX_INDEX_BYTES}-byte cap", path=where
            )
        raw = read_bounded(fd, st.st_size, where)
    finally:
        os.close(fd)
    index = parse_typed(IndexFile, raw, "index", index_path, INDEX_DEPTH)
    if canonical_json(index.to_json()) != raw:
        raise ArtifactError(
            "index is not in canonical JSON form (sorted keys, no whitespace, UTF-8)",
            path=where,
        )
    if index.version != 1:
        raise ArtifactError(f"unsupported index version {index.version}", path=where)
    count = len(index.shards)
    if count < 2:
        raise ArtifactError(
            f"index lists {count} shard(s); an index exists only for 2 or more", path=where
        )
    for i, s in enumerate(index.shards, start=1):
        if s.file != shard_name(i, count):
            raise ArtifactError(
                f"shard {i} is named {s.file!r}, expected {shard_name(i, count)!r}", path=where
            )
    containers: list[ContainerFile] = []
    try:
        for i, s in enumerate(index.shards, start=1):
            shard_path = directory / s.file
            if entry_kind(dir_fd, s.file, directory) is None:
                raise ArtifactError(f"shard {i} of {count} is missing", path=str(shard_path))
            c = ContainerFile(
                dir_fd, s.file, shard_path, check_header_digest=check_digest,
                expect=(i, count), expect_size=s.size,
            )  # fmt: skip
            containers.append(c)
            if check_digest and c.stored_digest.hex() != s.digest:
                raise IntegrityError(
                    f"shard header digest {c.stored_digest.hex()} differs from {s.digest} "
                    "recorded in the index",
                    path=str(shard_path),
                )
        artifact = Artifact(
            opened, index_path, containers, index, dir_fd=dir_fd, whole_directory=True
        )
    except BaseException:
        for c in containers:
            c.close()
        raise
    return artifact
