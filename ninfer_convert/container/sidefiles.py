"""The side files of one model directory (docs/container.md section 4.6): the naming rules a
writer applies beyond the schema's (names that collide on a case-insensitive file system are
refused) and the checked copy of each file into the staging directory.

Contract: :meth:`SideFiles.add` copies exactly the size ``fstat`` reported of a regular file
opened without blocking, digests it on the way, fsyncs the copy and records it; a source that
changes meanwhile is a :class:`SourceError`, a bad name a :class:`UsageError` (nothing is
written then).  :meth:`SideFiles.add_stream` writes a generated file of a declared size from
an iterator of chunks the same way (one chunk in memory at a time; another size is refused).
:meth:`SideFiles.entries` lists them sorted by name, as every header does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import SourceError, UsageError
from ..regular import open_regular
from .checks import check_side_file_name, side_file_key
from .schema import SchemaError, SideFile
from .wire import new_digest

__all__ = ["SideFiles"]

_COPY_CHUNK = 8 << 20


class SideFiles:
    """The side files copied so far, by name (see :meth:`ArtifactWriter.add_file`)."""

    def __init__(self) -> None:
        self._side: dict[str, SideFile] = {}
        self._side_keys: dict[str, str] = {}  # side_file_key -> name or "folder/" (add)

    def entries(self) -> tuple[SideFile, ...]:
        """The recorded side files sorted by name (the order of every header's ``files``)."""
        return tuple(self._side[k] for k in sorted(self._side))

    def add(self, staging: Path, src_path: str | os.PathLike[str], dest_name: str) -> SideFile:
        """Copy ``src_path`` to ``staging / dest_name`` and record it; the rules are those of
        :meth:`ArtifactWriter.add_file`."""
        parts, keys = self._check_name(dest_name)
        src = Path(src_path)
        try:
            opened = open_regular(src)
        except OSError as exc:
            raise UsageError(f"side file {src} cannot be opened: {exc.strerror or exc}") from None
        if opened is None:
            raise UsageError(f"side file {src} is not a regular file (a FIFO, device or socket)")
        fd, st = opened
        with open(fd, "rb", buffering=0) as fin:
            if len(parts) > 1:
                (staging / dest_name).parent.mkdir(parents=True, exist_ok=True)
            h = new_digest()
            size = 0
            with open(staging / dest_name, "xb") as fout:
                while size < st.st_size:
                    chunk = fin.read(min(_COPY_CHUNK, st.st_size - size))
                    if not chunk:
                        break
                    h.update(chunk)
                    fout.write(chunk)
                    size += len(chunk)
                if size != st.st_size or fin.read(1):
                    raise SourceError(
                        f"side file changed while it was copied ({st.st_size} bytes when opened)",
                        path=str(src),
                        hint="do not modify the source during conversion",
                    )
                fout.flush()
                os.fsync(fout.fileno())
        return self._record(SideFile(dest_name, size, h.hexdigest()), parts, keys)

    def add_stream(
        self,
        staging: Path,
        dest_name: str,
        size: int,
        chunks: Iterable[bytes | bytearray | memoryview],
    ) -> SideFile:
        """Write the generated side file ``dest_name`` of exactly ``size`` bytes from
        ``chunks`` (consumed one at a time, each digested and written as it comes, so a file
        larger than memory can be written) and record it; the naming rules are those of
        :meth:`add`.  Chunks that add up to another size are a :class:`UsageError` (nothing
        is recorded; the staging directory is the writer's to remove)."""
        parts, keys = self._check_name(dest_name)
        if len(parts) > 1:
            (staging / dest_name).parent.mkdir(parents=True, exist_ok=True)
        h = new_digest()
        written = 0
        with open(staging / dest_name, "xb") as fout:
            for chunk in chunks:
                n = memoryview(chunk).nbytes
                if written + n > size:
                    break
                h.update(chunk)
                fout.write(chunk)
                written += n
            else:
                n = 0
            if written + n != size:
                raise UsageError(
                    f"generated side file {dest_name!r}: {size} bytes were declared but the "
                    f"chunks hold {'more' if n else written} bytes"
                )
            fout.flush()
            os.fsync(fout.fileno())
        return self._record(SideFile(dest_name, size, h.hexdigest()), parts, keys)

    def _check_name(self, dest_name: str) -> tuple[list[str], list[str]]:
        """(path parts, case-folded keys of each prefix) of a new side file name, refusing
        (:class:`UsageError`) a bad name, a repeat, or a case-insensitive clash."""
        if not isinstance(dest_name, str):
            raise UsageError(f"side file name must be a string, not {dest_name!r}")
        try:
            check_side_file_name(dest_name, "dest_name")
            dest_name.encode("utf-8")
        except SchemaError as exc:
            raise UsageError(exc.message) from None
        except UnicodeEncodeError:
            raise UsageError(f"side file name {dest_name!r} is not encodable as UTF-8") from None
        if dest_name in self._side:
            raise UsageError(f"side file {dest_name!r} added twice")
        parts = dest_name.split("/")
        keys = [side_file_key("/".join(parts[: i + 1])) for i in range(len(parts))]
        for i, key in enumerate(keys):
            mine = "/".join(parts[: i + 1]) + ("" if i == len(parts) - 1 else "/")
            other = self._side_keys.get(key)
            if other is not None and other != mine:
                raise UsageError(
                    f"side file {dest_name!r}: {mine!r} and {other!r} would be the same name "
                    "on a case-insensitive file system"
                )
        return parts, keys

    def _record(self, info: SideFile, parts: list[str], keys: list[str]) -> SideFile:
        self._side[info.name] = info
        for i, key in enumerate(keys):
            self._side_keys[key] = "/".join(parts[: i + 1]) + ("" if i == len(parts) - 1 else "/")
        return info
