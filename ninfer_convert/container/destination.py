"""What may be at the output, and what ``--force`` may delete (docs/container.md section 8,
docs/cli.md "What --force touches").

:func:`check_destination` decides what may be at the output: nothing, an empty directory, or
(with ``force``) a complete ``.ninfer`` model directory recognised from its own header/index,
holding nothing but the files that artifact names (shards, index, recorded side files) and the
caller's companion files (the signature ``model.sig``).  Anything else is a
:class:`UsageError` that lists what is there.  An output that is, contains or lies inside the
source is refused whatever ``force`` says.  The answer, a :class:`Destination`, lists the old
artifact's files: the only ones a publish over it deletes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import NinferError, UsageError
from .reader import open_artifact
from .resources import resource_error
from .wire import INDEX_NAME, SINGLE_NAME

__all__ = ["Destination", "check_destination", "check_source_relation"]

_MAX_LISTED = 12
_MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class Destination:
    """What is at the output now and what publishing over it would delete."""

    path: Path
    kind: Literal["absent", "empty", "artifact"]
    files: tuple[str, ...] = ()
    """Relative paths of the old artifact's files (shards, index, side files)."""
    nbytes: int = 0

    def describe(self) -> str:
        if self.kind == "absent":
            return f"creates {self.path}"
        if self.kind == "empty":
            return f"replaces the empty directory {self.path}"
        return (
            f"replaces the .ninfer model directory {self.path}, removing its "
            f"{len(self.files)} file(s) ({self.nbytes} bytes): {_listing(self.files)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "removes": list(self.files),
            "removes_bytes": self.nbytes,
        }


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    more = len(names) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def check_source_relation(out: Path, sources: Sequence[Path]) -> None:
    """Refuse an output that is, contains, or lies inside a source path."""
    real_out = _real(out)
    for src in sources:
        real_src = _real(src)
        if real_out == real_src:
            raise UsageError(
                f"the output is the source {src}",
                path=str(out),
                hint="choose an --output outside the source checkpoint",
            )
        if real_src.is_relative_to(real_out):
            raise UsageError(
                f"the output contains the source {src}",
                path=str(out),
                hint="choose an --output outside the source checkpoint",
            )
        if real_src.is_dir() and real_out.is_relative_to(real_src):
            raise UsageError(
                f"the output lies inside the source directory {src}",
                path=str(out),
                hint="choose an --output outside the source checkpoint",
            )


def _entries(root: Path) -> dict[str, os.stat_result]:
    """Every entry under ``root`` by relative path (lstat: symlinks are not followed)."""
    found: dict[str, os.stat_result] = {}
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                rel = Path(e.path).relative_to(root).as_posix()
                found[rel] = st
                if len(found) > _MAX_ENTRIES:
                    raise UsageError(
                        f"the output holds more than {_MAX_ENTRIES} entries; it is not a "
                        ".ninfer model directory, --force does not replace it",
                        path=str(root),
                    )
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
    return found


def _artifact_files(
    out: Path, entries: dict[str, os.stat_result], companions: Sequence[str]
) -> tuple[str, ...]:
    """The relative paths a complete artifact at ``out`` names (plus those of ``companions``
    that are there), or a UsageError."""
    refuse = "--force replaces only an empty directory or a complete .ninfer model directory"
    names = sorted(entries)
    odd = [
        n
        for n in names
        if not (stat.S_ISREG(entries[n].st_mode) or stat.S_ISDIR(entries[n].st_mode))
    ]
    if odd:
        raise UsageError(
            f"the output holds entries that are not regular files or folders "
            f"({_listing(odd)}); {refuse}",
            path=str(out),
            hint="move them away or choose another --output",
        )
    if SINGLE_NAME not in entries and INDEX_NAME not in entries:
        raise UsageError(
            f"the output is not a .ninfer model directory (no {SINGLE_NAME} or {INDEX_NAME}); "
            f"it holds {_listing(names)}; {refuse}",
            kind="output_exists",
            path=str(out),
            hint="choose another --output, or move these files away yourself",
        )
    try:
        with open_artifact(out) as art:
            named = {p.name for p in art.files} | set(art.side_files)
            if art.index_path is not None:
                named.add(art.index_path.name)
        named.update(c for c in companions if c in entries)
    except NinferError as exc:
        raise UsageError(
            f"the output holds an artifact that is not complete or not valid ({exc}); {refuse}",
            path=str(out),
            hint="remove it yourself if you do not need it, or choose another --output",
        ) from None
    folders = {str(Path(n).parent.as_posix()) for n in named if "/" in n}
    for f in list(folders):
        parts = Path(f).parts
        folders.update(Path(*parts[:i]).as_posix() for i in range(1, len(parts)))
    extra = [n for n in names if n not in named and n not in folders]
    if extra:
        raise UsageError(
            f"the output holds files the artifact there does not name ({_listing(extra)}); "
            "--force never deletes files the tool did not make",
            path=str(out),
            hint="move them away or choose another --output",
        )
    return tuple(sorted(named))


def check_destination(
    out: Path, *, force: bool, sources: Sequence[Path] = (), companions: Sequence[str] = ()
) -> Destination:
    """What is at ``out`` and whether it may be replaced; see the module contract.
    ``companions`` are files the caller makes beside an artifact that its header does not list
    (convert: the signature ``model.sig``); they are replaced with it."""
    check_source_relation(out, sources)
    if not os.path.lexists(out):
        return Destination(out, "absent")
    if out.is_symlink() or not out.is_dir():
        raise UsageError(
            "the output exists and is not a directory",
            path=str(out),
            hint="choose another --output",
        )
    try:
        entries = _entries(out)
    except OSError as exc:
        raise resource_error(exc, out, doing="listing the existing output") from None
    if not entries:
        return Destination(out, "empty")
    if not force:
        raise UsageError(
            "the output directory already exists and is not empty",
            kind="output_exists",
            path=str(out),
            hint="pass --force to replace it (only a .ninfer model directory is replaced)",
        )
    files = _artifact_files(out, entries, companions)
    return Destination(out, "artifact", files, sum(entries[f].st_size for f in files))
