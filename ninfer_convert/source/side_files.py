"""Side files: the non-weight files of a model directory that the converter copies.

Contract (docs/cli.md, "Side files"): :func:`scan_side_files` walks the source directory and
its subfolders (kept with their relative path, ``1_Pooling/config.json``) and leaves out what
:data:`SIDE_FILE_LEFT_OUT` names; it accepts regular files only, and symlinks only when they
resolve inside the source directory (for a cached repo id, or a path to a cache snapshot
folder: inside that repo's cache folder, where the snapshot's symlinks point).  FIFOs,
devices, sockets, symlinked folders, names that are not UTF-8 or that the container cannot
store, names that collide on a case-insensitive or normalising file system, and more than
:data:`MAX_SIDE_FILES` files are a SourceError listing every offender.  Nothing is opened.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError
from ..names import MAX_SIDE_FILE_DEPTH, side_file_key, side_file_path_problem

__all__ = ["MAX_SIDE_FILES", "SIDE_FILE_LEFT_OUT", "SideFileSource", "scan_side_files"]

MAX_SIDE_FILES = 10_000
"""Most side files one model directory may have (real ones have a few dozen)."""


SIDE_FILE_LEFT_OUT: tuple[tuple[str, str], ...] = (
    # (pattern on the case-folded name of a file or folder, at any depth; why it is left out)
    (".*", "hidden file or folder (.git/, .gitattributes, .DS_Store, .cache/)"),
    ("*.safetensors", "safetensors weights: the artifact holds them converted"),
    ("*.safetensors.index.json", "the safetensors shard index: the artifact has its own"),
    ("*.bin", "weights in another format (PyTorch pickle)"),
    ("*.bin.index.json", "shard index of weights in another format"),
    ("*.pt", "weights in another format (PyTorch pickle)"),
    ("*.pt.index.json", "shard index of weights in another format"),
    ("*.pth", "weights in another format (PyTorch pickle)"),
    ("*.pth.index.json", "shard index of weights in another format"),
    ("*.ckpt", "weights in another format (checkpoint)"),
    ("*.gguf", "weights in another format (GGUF)"),
    ("*.onnx", "weights in another format (ONNX)"),
    ("*.onnx_data", "weights in another format (ONNX external data)"),
    ("*.msgpack", "weights in another format (Flax)"),
    ("*.msgpack.index.json", "shard index of weights in another format"),
    ("*.h5", "weights in another format (Keras/TensorFlow)"),
    ("*.h5.index.json", "shard index of weights in another format"),
    ("*.ot", "weights in another format (rust-bert)"),
    ("*.ninfer", "a .ninfer container: the output's own file names"),
    ("*.ninfer.index.json", "a .ninfer shard index: the output's own file names"),
    ("shard-*.partial", "the converter's temporary shard file names"),
    ("desktop.ini", "operating-system junk (Windows)"),
    ("thumbs.db", "operating-system junk (Windows)"),
    ("ehthumbs.db", "operating-system junk (Windows)"),
    ("__macosx", "operating-system junk (macOS archive folder)"),
    ("icon\r", "operating-system junk (macOS folder icon)"),
)
"""What :func:`scan_side_files` does not copy: the one table (docs/cli.md, "Side files").
Everything else that is a regular file under the source directory is copied."""


@dataclass(frozen=True)
class SideFileSource:
    """One side file to copy: its relative name in the output and where it is read from.

    It is path-like (``os.fspath`` and ``str`` give :attr:`path`), so it can be opened
    directly; :attr:`name` is the relative name, as ``Path.name`` is for a top-level file."""

    name: str
    """Relative path with ``/`` separators, the name it gets in the output (``a/b.json``)."""
    path: Path
    """Absolute path in the source (may be a symlink that resolves inside the source)."""
    size: int
    """Size in bytes when the source was opened."""

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:  # where it is read from, as for a Path
        return str(self.path)


def _left_out(name: str) -> bool:
    folded = name.casefold()
    return any(fnmatch.fnmatchcase(folded, pattern) for pattern, _why in SIDE_FILE_LEFT_OUT)


def scan_side_files(root: Path, *, bound: Path | None = None) -> tuple[SideFileSource, ...]:
    """The side files of the model directory ``root``, sorted by relative name.

    Walks ``root`` and its subfolders (at most ``MAX_SIDE_FILE_DEPTH`` path components),
    leaves out what :data:`SIDE_FILE_LEFT_OUT` names, and refuses, in one SourceError listing
    them all: FIFOs, devices and sockets; symlinks that resolve outside ``bound`` (default:
    ``root``), dangling ones and symlinked folders; names that are not UTF-8 or that the
    container cannot store; names that collide case-insensitively or after Unicode NFC
    normalisation; more than :data:`MAX_SIDE_FILES` files.  Nothing is opened (no FIFO can
    block the scan); the copy itself re-checks each file's type on the opened descriptor."""
    found, problems = _walk(root, os.path.realpath(bound if bound is not None else root))
    found.sort(key=lambda f: f.name)
    if len(found) > MAX_SIDE_FILES:
        problems.append(f"more than {MAX_SIDE_FILES} side files (the cap)")
    problems += _collisions(found)
    if problems:
        unique = sorted(set(problems))
        raise SourceError(
            f"{len(unique)} side file problem{'s' if len(unique) != 1 else ''} "
            "(non-weight files copied to the output):\n  "
            + "\n  ".join(unique[:50])
            + (f"\n  ... and {len(unique) - 50} more" if len(unique) > 50 else ""),
            path=str(root),
            hint="remove or rename these files, or replace links with copies "
            "(docs/cli.md, 'Side files')",
        )
    return tuple(found)


def _walk(root: Path, fence: str) -> tuple[list[SideFileSource], list[str]]:
    """The side files under ``root`` (unsorted) and the problems of what the walk met; stops
    once more than :data:`MAX_SIDE_FILES` are found (the count alone refuses)."""
    found: list[SideFileSource] = []
    problems: list[str] = []
    stack: list[tuple[Path, tuple[str, ...]]] = [(root, ())]
    while stack and len(found) <= MAX_SIDE_FILES:  # stop early: the count alone refuses
        folder, parts = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"{'/'.join(parts) or '.'}/: cannot list: {exc.strerror or exc}")
            continue
        for entry in entries:
            name = entry.name
            if _left_out(name):
                continue
            rel_parts = (*parts, name)
            rel = "/".join(rel_parts)
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                problems.append(f"{rel!r}: the name is not valid UTF-8")
                continue
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if os.path.commonpath([fence, target]) != fence:
                        problems.append(f"{rel}: a symlink to {target}, outside the source")
                        continue
                st = os.stat(entry.path)  # follows a symlink; never opens, never blocks
            except (OSError, ValueError) as exc:
                problems.append(f"{rel}: cannot stat: {getattr(exc, 'strerror', None) or exc}")
                continue
            if stat.S_ISDIR(st.st_mode):
                if entry.is_symlink():
                    problems.append(f"{rel}/: a symlinked folder (copy it in instead)")
                elif len(rel_parts) >= MAX_SIDE_FILE_DEPTH:
                    problems.append(f"{rel}/: nested deeper than {MAX_SIDE_FILE_DEPTH} levels")
                else:
                    stack.append((Path(entry.path), rel_parts))
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{rel}: not a regular file (a FIFO, device or socket)")
                continue
            bad_name = side_file_path_problem(rel)
            if bad_name is not None:
                problems.append(f"{rel!r}: {bad_name}")
                continue
            found.append(SideFileSource(rel, Path(entry.path), st.st_size))
    return found, problems


def _collisions(found: list[SideFileSource]) -> list[str]:
    """Names (files and the folders above them) that are one name on a case-insensitive or
    normalising file system."""
    problems: list[str] = []
    owners: dict[str, str] = {}
    for f in found:
        names = f.name.split("/")
        # A file and a folder collide too: "A" (file) against "a/b.json".
        for i in range(1, len(names) + 1):
            rel = "/".join(names[:i])
            key = side_file_key(rel)
            other = owners.setdefault(key, rel)
            if other != rel:
                problems.append(
                    f"{other!r} and {rel!r} are the same name on a case-insensitive or "
                    "normalising file system"
                )
    return problems
