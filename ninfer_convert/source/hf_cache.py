"""Offline resolution of a Hugging Face repo id to a snapshot folder in the local cache.

Contract: :func:`resolve_cached_repo` asks huggingface_hub's own cache lookup
(``snapshot_download(..., local_files_only=True)``) and never builds a cache path by hand and
never touches the network.  A repo id that is not cached (or whose cached snapshot the hub
library reports as incomplete) is a :class:`~ninfer_convert.errors.SourceError` saying so.

:func:`cached_identity` says which snapshot a repo-id source is: the repo id, the revision
asked for (``None``: the hub's default branch) and the resolved snapshot commit, which the hub
cache uses as the snapshot folder's name (40 lowercase hex digits).  ``convert`` records it
(docs/container.md section 4.3, ``source.repo``) and ``verify`` resolves ``id@commit`` through
the same cache lookup, so it compares against exactly the snapshot that was converted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import SourceError

__all__ = [
    "CachedRepo",
    "cached_identity",
    "looks_like_repo_id",
    "repo_json",
    "resolve_cached_repo",
]

# org/name with an optional @revision; the hub's own validator runs again inside the lookup.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[^\s/]+)?")


_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class CachedRepo:
    """The identity of a cached repo snapshot (see the module contract)."""

    repo_id: str
    revision: str | None
    """The revision asked for (``org/name@revision``), ``None`` for the default branch."""
    commit: str
    """The resolved snapshot commit (40 lowercase hex digits)."""
    folder: Path

    @property
    def pinned(self) -> str:
        """``org/name@commit``: the spec that resolves to exactly this snapshot."""
        return f"{self.repo_id}@{self.commit}"


def looks_like_repo_id(spec: str) -> bool:
    """True when ``spec`` has the shape ``org/name`` or ``org/name@revision``."""
    return _REPO_ID.fullmatch(spec) is not None


def resolve_cached_repo(spec: str, *, cache_dir: str | Path | None = None) -> Path:
    """Snapshot folder of the cached repo ``org/name[@revision]`` (offline, hub-library lookup)."""
    repo_id, _, revision = spec.partition("@")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
        raise SourceError(
            f"{spec!r} is not a local path, and huggingface_hub is not importable to look it "
            "up in the Hugging Face cache",
            hint="pass a local model directory or .safetensors file",
        ) from exc
    import huggingface_hub.errors as hub_errors

    not_cached: tuple[type[BaseException], ...] = (LocalEntryNotFoundError,)
    incomplete = getattr(hub_errors, "IncompleteSnapshotError", None)
    if isinstance(incomplete, type) and issubclass(incomplete, BaseException):
        not_cached += (incomplete,)
    where = "the default Hugging Face cache" if cache_dir is None else f"cache {cache_dir}"
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision or None,
            cache_dir=cache_dir,
            local_files_only=True,
        )
    except not_cached as exc:
        raise SourceError(
            f"{spec!r} is not a local path and is not (completely) present in {where}",
            hint="download it first, e.g. `hf download " + repo_id + "`, or pass a local "
            "directory; the converter never downloads",
        ) from exc
    except ValueError as exc:  # HFValidationError: not a valid repo id
        raise SourceError(f"{spec!r} is neither a local path nor a valid repo id: {exc}") from exc
    return Path(str(folder))


def cached_identity(spec: str, root: Path) -> CachedRepo | None:
    """The snapshot identity of a source opened from ``spec`` and read from the folder
    ``root``, or ``None`` when ``spec`` is a local path (a local path always wins, as in
    :func:`~.checkpoint.open_source`) or not a repo id.

    The commit is the name of the snapshot folder that was read (so it is the snapshot
    actually converted, whatever the cache holds by now); a folder not named by a commit is a
    :class:`SourceError`."""
    if Path(spec).expanduser().exists() or not looks_like_repo_id(spec):
        return None
    if not _COMMIT.fullmatch(root.name):
        raise SourceError(
            f"the cached snapshot folder of {spec!r} is not named by a commit hash",
            path=str(root),
            hint="the hub cache names snapshot folders by their 40-digit commit",
        )
    repo_id, _, revision = spec.partition("@")
    return CachedRepo(repo_id, revision or None, root.name, root)


def repo_json(repo: CachedRepo) -> dict[str, str | None]:
    """The ``source.repo`` object convert records (docs/container.md section 4.3)."""
    return {"id": repo.repo_id, "revision": repo.revision, "commit": repo.commit}
