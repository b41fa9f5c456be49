"""The .ninfer container: on-disk format, schema, writer, reader and shard index.

See docs/container.md for the normative contract.  Public entry points:
:class:`ArtifactWriter` (used by convert) and :func:`open_artifact` (used by verify, inspect and
any consumer).
"""

from __future__ import annotations

from .artifact import Artifact, PlaneInfo, TensorInfo
from .artifact_path import check_artifact_path
from .reader import open_artifact
from .schema import (
    ArtifactMeta,
    ConcatTransform,
    CopyQuantizedTransform,
    Header,
    IndexFile,
    IndexShard,
    PlaneEntry,
    Producer,
    Provenance,
    RecipeInfo,
    ReshapeTransform,
    RuleRef,
    SchemaError,
    ShardInfo,
    SideFile,
    SourceFile,
    SourceInfo,
    SourceRef,
    SourceRepo,
    SourceTensor,
    TensorEntry,
    Transform,
    TransposeTransform,
)
from .wire import DEFAULT_ALIGNMENT, INDEX_NAME, SINGLE_NAME, digest_hex, shard_name
from .writer import ArtifactWriter, WrittenTensor, check_writer_alignment

__all__ = [
    "DEFAULT_ALIGNMENT",
    "INDEX_NAME",
    "SINGLE_NAME",
    "Artifact",
    "ArtifactMeta",
    "ArtifactWriter",
    "ConcatTransform",
    "CopyQuantizedTransform",
    "Header",
    "IndexFile",
    "IndexShard",
    "PlaneEntry",
    "PlaneInfo",
    "Producer",
    "Provenance",
    "RecipeInfo",
    "ReshapeTransform",
    "RuleRef",
    "SchemaError",
    "ShardInfo",
    "SideFile",
    "SourceFile",
    "SourceInfo",
    "SourceRef",
    "SourceRepo",
    "SourceTensor",
    "TensorEntry",
    "TensorInfo",
    "Transform",
    "TransposeTransform",
    "WrittenTensor",
    "check_artifact_path",
    "check_writer_alignment",
    "digest_hex",
    "open_artifact",
    "shard_name",
]
