"""Opening a source: a model directory, a single ``.safetensors`` file or a cached repo id.

Contract (the module contract of :mod:`.checkpoint`): a local path always wins over a repo id
of the same spelling; opening reads only metadata: config.json (:mod:`.json_files`), the shard
index (:mod:`.shard_index`) or the single file's header, the side files
(:mod:`.side_files`), and refuses tensor names that are equal after NFKC normalisation.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from pathlib import Path

from ..errors import SourceError
from ..jsonfields import paused_gc
from ..jsonfields.makers import instance_maker
from .checkpoint import SourceCheckpoint, SourceTensorInfo
from .header import parse_header_as
from .hf_cache import looks_like_repo_id, resolve_cached_repo
from .json_files import _read_json
from .shard_index import _check_index
from .side_files import scan_side_files

__all__ = ["INDEX_NAME", "SINGLE_NAME", "open_source"]

INDEX_NAME = "model.safetensors.index.json"


SINGLE_NAME = "model.safetensors"


def open_source(
    spec: str | os.PathLike[str], *, cache_dir: str | Path | None = None
) -> SourceCheckpoint:
    """Open a model directory, a ``.safetensors`` file or a cached repo id (see module doc).

    ``cache_dir`` overrides the Hugging Face cache used for repo ids (default: the hub
    library's own setting, ``HF_HUB_CACHE``).
    """
    # One object per tensor, none cyclic: the collector's passes over a 100,000-tensor
    # header would cost more than reading it (see paused_gc).
    with paused_gc():
        return _open_source(os.fspath(spec), cache_dir)


def _open_source(text: str, cache_dir: str | Path | None) -> SourceCheckpoint:
    p = Path(text).expanduser()
    try:
        found = p.exists()
    except OSError as exc:  # a name the file system cannot hold, a permission problem
        raise SourceError(f"cannot look it up: {exc.strerror or exc}", path=text) from exc
    if found:
        if p.is_dir():
            # A snapshot folder of the Hugging Face cache given as a path (what
            # snapshot_download returns) is bounded like a repo id.
            real = Path(os.path.realpath(p))
            cached = real.parent.name == "snapshots" and (real.parent.parent / "blobs").is_dir()
            return _open_dir(p, bound=_cache_bound(real) if cached else None)
        if p.is_file():
            if p.suffix != ".safetensors":
                raise SourceError(
                    "not a .safetensors file or a model directory",
                    path=str(p),
                    hint="pass the model directory, or a file ending in .safetensors",
                )
            return _open_file(p)
        raise SourceError("neither a file nor a directory", path=str(p))
    if looks_like_repo_id(text):
        snapshot = resolve_cached_repo(text, cache_dir=cache_dir)
        return _open_dir(snapshot, shown=text, bound=_cache_bound(snapshot))
    raise SourceError(
        "no such file or directory",
        path=str(p),
        hint="pass a model directory, a .safetensors file, or a cached org/name",
    )


def _cache_bound(snapshot: Path) -> Path:
    """What bounds a cache snapshot's symlinks: they point to ../../blobs/, so the repo's
    cache folder (the snapshot itself when it is not under ``snapshots/``)."""
    return snapshot.parent.parent if snapshot.parent.name == "snapshots" else snapshot


def _check_twins(tensors: Mapping[str, SourceTensorInfo], where: str) -> None:
    """Refuse distinct tensor names that are equal after NFKC normalisation."""
    if all(map(str.isascii, tensors)):
        return  # NFKC leaves ASCII text unchanged: distinct ASCII names stay distinct
    seen: dict[str, str] = {}
    twins: list[str] = []
    for name in sorted(tensors):
        key = unicodedata.normalize("NFKC", name)
        other = seen.setdefault(key, name)
        if other != name:
            twins.append(f"{other!r} ({tensors[other].file}) and {name!r} ({tensors[name].file})")
    if twins:
        raise SourceError(
            f"{len(twins)} pair(s) of tensor names differ only in Unicode normalisation "
            "(equal after NFKC): " + "; ".join(twins[:20]) + (" ..." if len(twins) > 20 else ""),
            path=where,
            hint="rename one of each pair in the checkpoint; tools that normalise names would "
            "merge them",
        )


# SourceTensorInfo(name, dtype, shape, file, nbytes, offset), built per tensor by the header
# reader (checkpoint._info's mapping of a TensorEntry, without the TensorEntry).
_make_info = instance_maker(SourceTensorInfo)


def _open_file(p: Path) -> SourceCheckpoint:
    file_size, tensors = parse_header_as(p, p.name, _make_info)
    _check_twins(tensors, str(p))
    return SourceCheckpoint(
        path=p,
        kind="safetensors-file",
        config=None,
        tensors=tensors,
        files=((p.name, file_size),),
        side_files=(),
        root=p.parent,
    )


def _open_dir(
    root: Path, *, shown: str | None = None, bound: Path | None = None
) -> SourceCheckpoint:
    where = shown or str(root)
    config: dict[str, object] | None = None
    cfg_path = root / "config.json"
    if cfg_path.exists():
        cfg = _read_json(cfg_path)
        if not isinstance(cfg, dict):
            raise SourceError("config.json is not a JSON object", path=str(cfg_path))
        config = cfg
    index_path = root / INDEX_NAME
    if index_path.exists():
        tensors, files = _check_index(root, index_path)
    elif (root / SINGLE_NAME).exists():  # parse_header refuses what is not a regular file
        file_size, tensors = parse_header_as(root / SINGLE_NAME, SINGLE_NAME, _make_info)
        files = ((SINGLE_NAME, file_size),)
    else:
        found = sorted(q.name for q in root.glob("*.safetensors"))
        raise SourceError(
            f"no {SINGLE_NAME} and no {INDEX_NAME}",
            path=where,
            hint=("found " + ", ".join(found) + "; pass one file directly")
            if found
            else "this is not a Hugging Face safetensors model directory",
        )
    _check_twins(tensors, where)
    return SourceCheckpoint(
        path=root if shown is None else Path(shown),
        kind="hf-dir",
        config=config,
        tensors=tensors,
        files=files,
        side_files=scan_side_files(root, bound=bound),
        root=root,
    )
