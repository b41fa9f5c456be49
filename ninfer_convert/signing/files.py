"""The model directory a signature covers, and its files.

Contract: :func:`model_directory` accepts only a directory holding a ``.ninfer`` artifact
(:class:`~ninfer_convert.errors.UsageError` otherwise) and resolves a linked one to what it
links to; :func:`walk` lists every regular file under it by relative POSIX name, and separately
every link and special file (which signing refuses and verifying reports as added); the
signature file is skipped only while it is a regular file.  :func:`sha256_hex` hashes a file in
bounded memory (8 MiB chunks).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ..container.wire import INDEX_NAME, SINGLE_NAME
from ..errors import UsageError

__all__ = [
    "SIGNATURE_NAME",
    "inside",
    "is_utf8",
    "model_directory",
    "sha256_hex",
    "signature_path",
    "walk",
]

SIGNATURE_NAME = "model.sig"
"""Default signature file, inside the model directory and excluded from its own manifest."""

_CHUNK = 8 << 20


def inside(root: Path, path: Path) -> str | None:
    """``path`` relative to ``root`` (POSIX spelling), or None when it is outside."""
    # Links resolved (but the last component: a linked signature is refused), so that
    # LINK/model.sig of a linked model directory is inside the directory the link resolves to.
    try:
        rel = (path.parent.resolve() / path.name).relative_to(root.resolve())
    except ValueError:
        return None
    return PurePosixPath(rel).as_posix()


def model_directory(artifact: str | os.PathLike[str]) -> Path:
    p = Path(artifact)
    if not p.exists():
        raise UsageError("no such file or directory", path=str(p), hint="check the artifact path")
    if not p.is_dir():
        raise UsageError(
            "a signature covers a whole model directory, and this is a single file",
            path=str(p),
            hint=f"pass the directory that holds it ({p.absolute().parent})",
        )
    if not (p / SINGLE_NAME).exists() and not (p / INDEX_NAME).exists():
        raise UsageError(
            f"not a .ninfer artifact: the directory has no {SINGLE_NAME} or {INDEX_NAME}",
            kind="not_an_artifact",
            path=str(p),
        )
    # The library refuses a linked model directory; what it links to is the directory signed.
    return p.resolve() if p.is_symlink() else p.absolute()


def signature_path(root: Path, signature: str | os.PathLike[str] | None) -> Path:
    return root / SIGNATURE_NAME if signature is None else Path(signature).absolute()


def walk(root: Path, ignored: Iterable[str]) -> tuple[dict[str, Path], list[str]]:
    """(regular files by relative name, relative names of links and special files) under
    ``root``, skipping the ``ignored`` relative paths that are regular files (a directory
    there is walked: the signature is a file, and must not hide others)."""
    skip = [PurePosixPath(i) for i in ignored]
    files: dict[str, Path] = {}
    odd: list[str] = []
    stack = [root]
    while stack:
        here = stack.pop()
        with os.scandir(here) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            path = Path(entry.path)
            rel = PurePosixPath(path.relative_to(root))
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISREG(mode) and rel in skip:
                continue
            if stat.S_ISDIR(mode):
                stack.append(path)
            elif stat.S_ISREG(mode):
                files[rel.as_posix()] = path
            else:
                odd.append(rel.as_posix())
    return dict(sorted(files.items())), sorted(odd)


def is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.fsdecode's surrogate escapes of undecodable bytes
        return False
    return True


def sha256_hex(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
