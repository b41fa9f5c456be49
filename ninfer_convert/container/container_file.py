"""One container file of an artifact: memory-mapped, its prelude and header validated.

Contract (docs/container.md sections 2-5): :class:`ContainerFile` opens one ``.ninfer`` file
through the snapshot's directory descriptor, checks its size against the prelude (and against
the index when it is a shard), maps it read-only, and validates the prelude, the header digest
(unless told not to), the whole header (schema, registries, geometry, alignment, plane
placement, side-file names) and its ``shard`` object before any payload byte is touched.
Every failure is an :class:`~ninfer_convert.errors.ArtifactError` (a digest mismatch an
:class:`~ninfer_convert.errors.IntegrityError`) naming the file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

from ..errors import ArtifactError, IntegrityError, UsageError
from .checks import check_alignment, check_header_tensors, check_side_file_name
from .dir_snapshot import open_in_directory
from .schema import Header, SchemaError
from .typed_json import HEADER_DEPTH, parse_typed
from .wire import (
    MAGIC,
    MAJOR_VERSION,
    MAX_HEADER_BYTES,
    MINOR_VERSION,
    PRELUDE,
    PRELUDE_SIZE,
    header_digest,
)

__all__ = ["ContainerFile"]


class ContainerFile:
    """One memory-mapped container file whose prelude and header have been validated.

    ``expect`` is the (index, count) its ``shard`` object must say: the position the index
    gives it, or what its file name says (section 5: a file not named as a shard is a
    single-file artifact)."""

    def __init__(
        self,
        dir_fd: int,
        name: str,
        path: Path,
        *,
        check_header_digest: bool,
        expect: tuple[int, int],
        expect_size: int | None = None,
    ) -> None:
        self.path = path
        self.mm: mmap.mmap | None = None
        where = str(path)
        fd, st = open_in_directory(dir_fd, name, where)
        try:
            self.size = st.st_size
            if expect_size is not None and self.size != expect_size:
                raise ArtifactError(
                    f"shard is {self.size} bytes but the index records {expect_size} "
                    "(truncated or replaced shard)",
                    path=where,
                )
            if self.size < PRELUDE_SIZE:
                raise ArtifactError(
                    f"file is {self.size} bytes, shorter than the {PRELUDE_SIZE}-byte prelude "
                    "(truncated, or not a .ninfer file)",
                    path=where,
                )
            try:
                self.mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise ArtifactError(f"cannot memory-map: {exc}", path=where) from None
        finally:
            os.close(fd)
        try:
            self._read_header(check_header_digest)
            self._check_shard(expect, expect_size is not None)
        except BaseException:
            self.close()
            raise

    def _check_shard(self, expect: tuple[int, int], via_index: bool) -> None:
        shard = (self.header.shard.index, self.header.shard.count)
        if shard == expect:
            return
        if expect == (1, 1) and not via_index:
            raise ArtifactError(
                f"header says shard {shard[0]} of {shard[1]}, but the file is not named as a "
                f"shard, so it must be a single-file artifact ({{index: 1, count: 1}})",
                path=str(self.path),
                hint="a shard is read through its model.ninfer.index.json or under its own "
                "model-NNNNN-of-NNNNN.ninfer name",
            )
        said = "the index says" if via_index else "its file name says"
        raise ArtifactError(
            f"header says shard {shard[0]} of {shard[1]}, {said} {expect[0]} of {expect[1]}",
            path=str(self.path),
            hint="a shard renamed or copied under another shard's name",
        )

    def _read_prelude(self) -> tuple[bytes, int, int, bytes]:
        """(prelude bytes, header offset, header length, stored digest), once the prelude's
        magic, version, reserved field and header bounds are valid for this file."""
        mm = self.mm
        assert mm is not None
        where = str(self.path)
        head = bytes(mm[:PRELUDE_SIZE])
        magic, major, minor, reserved, h_off, h_len, digest = PRELUDE.unpack(head)
        if magic != MAGIC:
            raise ArtifactError(
                f"not a .ninfer container: the first 8 bytes are {magic.hex(' ')}, expected "
                f"{MAGIC.hex(' ')}",
                path=where,
            )
        if major != MAJOR_VERSION:
            raise ArtifactError(
                f"unsupported container major version {major}; this reader supports only "
                f"version {MAJOR_VERSION}",
                path=where,
                hint="use a ninfer-convert release that reads it",
            )
        if minor > MINOR_VERSION:
            raise ArtifactError(
                f"container version {major}.{minor} is newer than this reader's "
                f"{MAJOR_VERSION}.{MINOR_VERSION}",
                path=where,
            )
        if reserved != 0:
            raise ArtifactError(f"reserved prelude field is {reserved:#x}, must be 0", path=where)
        if h_len > MAX_HEADER_BYTES:
            raise ArtifactError(
                f"header length {h_len} exceeds the {MAX_HEADER_BYTES}-byte cap", path=where
            )
        if h_off < PRELUDE_SIZE or h_off + h_len != self.size:
            raise ArtifactError(
                f"the prelude puts the header at [{h_off}, {h_off + h_len}) but the file is "
                f"{self.size} bytes; the header must start after the {PRELUDE_SIZE}-byte prelude "
                "and end exactly at the end of the file (truncated or extended file?)",
                path=where,
            )
        return head, h_off, h_len, digest

    def _read_header(self, check_digest: bool) -> None:
        mm = self.mm
        assert mm is not None
        where = str(self.path)
        head, h_off, h_len, digest = self._read_prelude()
        raw = bytes(mm[h_off : h_off + h_len])
        self.stored_digest: bytes = digest
        self.actual_digest: bytes = header_digest(head, raw)
        if check_digest and self.stored_digest != self.actual_digest:
            raise IntegrityError(
                f"header digest mismatch: stored {digest.hex()}, computed "
                f"{self.actual_digest.hex()} (the prelude or header bytes changed)",
                path=where,
                hint="run verify, or open with check_header_digest=False to inspect it",
            )
        self.header_offset = h_off
        header = parse_typed(Header, raw, "header", self.path, HEADER_DEPTH)
        try:
            check_alignment(header.artifact.alignment)
            end = check_header_tensors(
                header.tensors, header.artifact.alignment, PRELUDE_SIZE, h_off
            )
            if end != h_off:
                raise SchemaError(
                    "tensors",
                    f"the last plane ends at {end} but the header starts at {h_off}; the header "
                    "must follow the last plane directly",
                )
            seen: list[str] = []
            for i, f in enumerate(header.files):
                check_side_file_name(f.name, f"files[{i}].name")
                if seen and f.name <= seen[-1]:
                    raise SchemaError(
                        f"files[{i}].name", "side files must be sorted by name without repeats"
                    )
                seen.append(f.name)
        except SchemaError as exc:
            raise exc.as_error(
                ArtifactError, "invalid header", kind="header_invalid", path=where
            ) from None
        self.header = header

    def buffer(self, offset: int, nbytes: int) -> memoryview:
        return memoryview(self.mapping())[offset : offset + nbytes]

    def mapping(self) -> mmap.mmap:
        """The file's read-only map (UsageError once closed)."""
        if self.mm is None:
            raise UsageError("the artifact is closed", path=str(self.path))
        return self.mm

    def close(self) -> None:
        if self.mm is not None:
            # A caller may still hold a plane view; the map is then released when it is dropped.
            with contextlib.suppress(BufferError):
                self.mm.close()
            self.mm = None
