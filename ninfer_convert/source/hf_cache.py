"""Offline resolution of a Hugging Face repo id to a snapshot folder in the local cache.

Contract: :func:`resolve_cached_repo` asks huggingface_hub's own cache lookup
(``snapshot_download(..., local_files_only=True)``) and never builds a cache path by hand and
never touches the network.  A repo id that is not cached (or whose cached snapshot the hub
library reports as incomplete) is a :class:`~ninfer_convert.errors.SourceError` saying so.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import SourceError

__all__ = ["looks_like_repo_id", "resolve_cached_repo"]

# org/name with an optional @revision; the hub's own validator runs again inside the lookup.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[^\s/]+)?")


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
