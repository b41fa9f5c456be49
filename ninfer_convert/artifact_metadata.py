"""The artifact-level metadata ``ninfer convert`` records (docs/container.md 4.2 and 4.3).

Contract: :func:`artifact_metadata` is a pure function of the plan, the opened source, the
source tensors' digests and the alignment: the producer (:data:`PRODUCER_NAME` and the package
version), the recipe (name, full text, digest, cited evidence) and the source's identity (kind,
absolute path or Hugging Face cache repo id, config.json, files, and each digested tensor's
dtype, shape and digest, sorted by name).  Convert builds it three times with the same inputs
but the digests: with none to open the writer and with the real ones, known once every tensor
is read, last.  :func:`planned_metadata_size` is the length of the canonical JSON the header
holds of the metadata listing the given tensors with digests of the final length (the size
plan's), without building that map: the metadata without tensors, checked as the writer checks
it, and the map's length (:func:`~.container.metadata_json.source_tensors_size`).
"""

from __future__ import annotations

import os
from typing import Any

from ._version import __version__
from .container.metadata_json import metadata_json, source_tensors_size
from .container.schema import ArtifactMeta
from .recipe import Plan
from .source import SourceCheckpoint
from .source.hf_cache import cached_identity, repo_json

__all__ = ["PRODUCER_NAME", "artifact_metadata", "planned_metadata_size"]

PRODUCER_NAME = "ninfer-convert"


def artifact_metadata(
    plan: Plan, source: SourceCheckpoint, digests: dict[str, str], alignment: int
) -> dict[str, Any]:
    """The header's ``artifact`` object for ``plan``; ``digests`` (tensor name -> digest)
    selects which source tensors are listed."""
    recipe = plan.recipe
    evidence = [
        f"{e.id}: {e.citation}" + (f" <{e.url}>" if e.url else "") + f" - {e.summary}"
        for e in recipe.evidence
    ]
    tensors = {
        name: {"dtype": info.dtype, "shape": list(info.shape), "digest": digests[name]}
        for name, info in sorted(source.tensors.items())
        if name in digests
    }
    source_meta: dict[str, Any] = {
        "kind": plan.source_kind,
        # Absolute, so `ninfer verify` finds the source from any working directory.
        "path": os.path.abspath(plan.source_path),
        "config": source.config,
        "files": [{"name": n, "size": s} for n, s in plan.source_files],
        "tensors": tensors,
    }
    root = source.file_path(source.files[0][0]).parent if source.files else None
    repo = None if root is None else cached_identity(plan.source_path, root)
    if repo is not None:  # a cached repo id: record which snapshot, not a local path
        source_meta.update(kind="hf-cache", path=repo.repo_id, repo=repo_json(repo))
    return {
        "producer": {"name": PRODUCER_NAME, "version": __version__},
        "recipe": {
            "name": recipe.name,
            "text": recipe.text,
            "digest": recipe.digest,
            "evidence": evidence,
        },
        "source": source_meta,
        "alignment": alignment,
    }


def planned_metadata_size(
    plan: Plan, source: SourceCheckpoint, digested: set[str], digest: str, alignment: int
) -> int:
    """``len(canonical_json(ArtifactMeta.from_json(m).to_json()))`` for the metadata ``m`` of
    ``artifact_metadata(plan, source, {name: digest for name in digested}, alignment)``."""
    bare = artifact_metadata(plan, source, {}, alignment)
    # Checked as the size plan always checked it (its errors are those of a bad metadata).
    meta = ArtifactMeta.from_json({**bare, "alignment": alignment}, "metadata")
    without = metadata_json(meta.to_json())
    listed = [(n, info.dtype, info.shape) for n, info in source.tensors.items() if n in digested]
    # "tensors":{} holds the map: its two bytes become the map's JSON.
    return len(without) - 2 + source_tensors_size(listed, digest)
