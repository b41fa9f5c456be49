"""The one schema of the container header and the shard index (docs/container.md).

Contract: each JSON object of the header is a frozen, slotted schema class here whose JSON form
is generated from its fields' specs by :mod:`ninfer_convert.jsonfields` (``to_json``,
``from_json``, ``checked_from_json``, ``json_pairs``; the contract is there).  The classes a
large header holds many of (tensors, planes, provenance, source references, transforms, rule
references, source tensors) have compiled fast decoders, bound here as ``_fast_*`` (a test
switches them off here).

The writer validates what it is given and the reader validates what it reads with the same
functions, so a file the writer produces always passes the reader, and nothing else does.

Strictness: every object has a fixed key set (unknown or missing keys are errors), every value
has one JSON type (a bool is never an int, a float is never an int), integers lie in
``[0, MAX_INT]`` unless stated, and digests are 32 lowercase hex digits.  Semantic checks that
need the registries or the file (format names, geometry, offsets) live in the reader and
writer, not here.

:class:`SchemaError` carries a JSON-pointer-like location (``tensors[3].planes[0].offset``); the
reader turns it into :class:`~ninfer_convert.errors.ArtifactError` and the writer into
:class:`~ninfer_convert.errors.UsageError`.  ``MAX_JSON_DEPTH`` (the nesting bound of the
free-form ``config``), ``json_pairs`` and ``paused_gc`` are the container modules' names for
the shared ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import SchemaError
from ..jsonfields import Int, Json, Obj, OneOf, Opt, SchemaObject, Seq, Str, StrMap, js, schema
from ..jsonfields.objects import _maker
from ..jsonfields.specs import CheckContext
from ..jsonfields.values import json_pairs, paused_gc
from ..jsonlimits import MAX_JSON_DEPTH
from .wire import DIGEST_HEX_RE

__all__ = [
    "MAX_JSON_DEPTH",
    "SCHEMA_CLASSES",
    "ArtifactMeta",
    "ConcatTransform",
    "CopyQuantizedTransform",
    "Header",
    "IndexFile",
    "IndexShard",
    "PlaneEntry",
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
    "Transform",
    "TransposeTransform",
    "json_pairs",
    "make_plane_entry",
    "make_tensor_entry",
    "paused_gc",
    "transform_from_json",
]


def _digest_mismatch(text: str) -> str:
    return f"digest {text[:80]!r} is not 32 lowercase hex digits"


def _commit_mismatch(text: str) -> str:
    return f"{text[:80]!r} is not 40 lowercase hex digits"


_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_AXIS_LIMIT = 64
_INTERNED = Str(intern=True)
_INTS = Seq(Int())
_DIGEST = Str(pattern=DIGEST_HEX_RE, mismatch=_digest_mismatch)


# ---------------------------------------------------------------------------------------------
# Provenance (per tensor)


@schema("source", fast="_fast_source_ref")
@dataclass(frozen=True, slots=True)
class SourceRef(SchemaObject):
    """One source tensor a stored tensor was made from."""

    name: str = field(metadata=js(Str(nonempty=True)))
    dtype: str = field(metadata=js(_INTERNED))
    shape: tuple[int, ...] = field(metadata=js(_INTS))
    file: str = field(metadata=js(_INTERNED))


@schema("transform", fast="_fast_concat", consts={"op": "concat"})
@dataclass(frozen=True, slots=True)
class ConcatTransform(SchemaObject):
    """Concatenation of the sources along ``axis``."""

    axis: int = field(metadata=js(Int(-_AXIS_LIMIT, _AXIS_LIMIT)))
    op: ClassVar[str] = "concat"


@schema("transform", fast="_fast_transpose", consts={"op": "transpose"})
@dataclass(frozen=True, slots=True)
class TransposeTransform(SchemaObject):
    """A rank-two transpose."""

    op: ClassVar[str] = "transpose"


@schema("transform", fast="_fast_reshape", consts={"op": "reshape"})
@dataclass(frozen=True, slots=True)
class ReshapeTransform(SchemaObject):
    """A reshape to ``shape``."""

    shape: tuple[int, ...] = field(metadata=js(_INTS))
    op: ClassVar[str] = "reshape"


@schema("transform", fast="_fast_copy_quantized", consts={"op": "copy-quantized"})
@dataclass(frozen=True, slots=True)
class CopyQuantizedTransform(SchemaObject):
    """Already-quantized words copied from a source quantization ``scheme``."""

    scheme: str = field(metadata=js(Str(nonempty=True)))
    op: ClassVar[str] = "copy-quantized"


Transform = ConcatTransform | TransposeTransform | ReshapeTransform | CopyQuantizedTransform
_TRANSFORM = OneOf(
    "transform",
    "op",
    [ConcatTransform, TransposeTransform, ReshapeTransform, CopyQuantizedTransform],
)


def transform_from_json(value: object, where: str = "transform") -> Transform:
    """Validate one transform object; the keys allowed depend on its ``op``."""
    got: Transform = _TRANSFORM.check(value, where, CheckContext({}, False))
    return got


@schema("rule", fast="_fast_rule", shared=True)
@dataclass(frozen=True, slots=True)
class RuleRef(SchemaObject):
    """The recipe rule that selected this tensor: its 0-based index, line, and pattern.

    The stored contract (docs/container.md, frozen with the format); the plan's
    :class:`~ninfer_convert.recipe.RuleRef` is the plan report's and also names the rule's
    ``kind``, which provenance leaves out."""

    index: int = field(metadata=js(Int()))
    line: int = field(metadata=js(Int()))
    pattern: str = field(metadata=js(Str()))


@schema("provenance", fast="_fast_provenance")
@dataclass(frozen=True, slots=True)
class Provenance(SchemaObject):
    """How a stored tensor was derived (spec Section 10)."""

    sources: tuple[SourceRef, ...] = field(metadata=js(Seq(Obj(SourceRef))))
    conversion: str | None = field(metadata=js(Opt(_INTERNED)))
    transforms: tuple[Transform, ...] = field(metadata=js(Seq(_TRANSFORM)))
    encoder_profile: str | None = field(metadata=js(Opt(_INTERNED)))
    rule: RuleRef = field(metadata=js(Obj(RuleRef)))
    constraints: tuple[str, ...] = field(default=(), metadata=js(Seq(_INTERNED)))
    importance: str | None = field(default=None, metadata=js(_DIGEST, omit_none=True))
    """Digest of the tensor's importance vector in the importance side file (only present
    for an encoder profile that takes one; docs/container.md section 4.8); absent otherwise,
    so older artifacts stay byte-identical."""
    factor: str | None = field(default=None, metadata=js(_DIGEST, omit_none=True))
    """Digest of the tensor's compensation factor in the factor side file (only present for
    an encoder profile that takes one, GPTQ_F16_SEARCH_IW_V1; docs/container.md section 4.8)."""
    factor_block: int | None = field(default=None, metadata=js(Int(1), omit_none=True))
    """The factor's block width B (its second dimension), present exactly with ``factor``."""


# ---------------------------------------------------------------------------------------------
# Artifact metadata


@schema("producer")
@dataclass(frozen=True, slots=True)
class Producer(SchemaObject):
    name: str = field(metadata=js(Str(nonempty=True)))
    version: str = field(metadata=js(Str()))


@schema("recipe")
@dataclass(frozen=True, slots=True)
class RecipeInfo(SchemaObject):
    """The full recipe text, its digest and its cited quality evidence."""

    name: str = field(metadata=js(Str()))
    text: str = field(metadata=js(Str()))
    digest: str = field(metadata=js(Str()))
    evidence: tuple[str, ...] = field(default=(), metadata=js(Seq(Str())))


@schema("file")
@dataclass(frozen=True, slots=True)
class SourceFile(SchemaObject):
    name: str = field(metadata=js(Str(nonempty=True)))
    size: int = field(metadata=js(Int()))


@schema("tensor", fast="_fast_source_tensor")
@dataclass(frozen=True, slots=True)
class SourceTensor(SchemaObject):
    dtype: str = field(metadata=js(Str()))
    shape: tuple[int, ...] = field(metadata=js(_INTS))
    digest: str = field(metadata=js(Str()))


@schema("repo")
@dataclass(frozen=True, slots=True)
class SourceRepo(SchemaObject):
    """Which cached Hugging Face snapshot a repo-id source was: id, revision asked, commit."""

    id: str = field(metadata=js(Str(nonempty=True)))
    revision: str | None = field(metadata=js(Opt(Str(nonempty=True))))
    commit: str = field(metadata=js(Str(pattern=_COMMIT_RE, mismatch=_commit_mismatch)))


@schema("source")
@dataclass(frozen=True, slots=True)
class SourceInfo(SchemaObject):
    """Identity of the source checkpoint: kind, path, config, files and per-tensor digests;
    ``repo`` (only for a cached repo-id source, and only then present in the JSON) names the
    snapshot."""

    kind: str = field(metadata=js(Str()))
    path: str = field(metadata=js(Str()))
    config: Mapping[str, Any] | None = field(metadata=js(Json()))
    files: tuple[SourceFile, ...] = field(metadata=js(Seq(Obj(SourceFile))))
    tensors: Mapping[str, SourceTensor] = field(
        default_factory=dict, metadata=js(StrMap(Obj(SourceTensor)))
    )
    repo: SourceRepo | None = field(default=None, metadata=js(Obj(SourceRepo), omit_none=True))


@schema("artifact")
@dataclass(frozen=True, slots=True)
class ArtifactMeta(SchemaObject):
    """Artifact-level metadata, identical in every shard's header."""

    producer: Producer = field(metadata=js(Obj(Producer)))
    recipe: RecipeInfo = field(metadata=js(Obj(RecipeInfo)))
    source: SourceInfo = field(metadata=js(Obj(SourceInfo)))
    alignment: int = field(metadata=js(Int()))


# ---------------------------------------------------------------------------------------------
# Header


@schema("plane", fast="_fast_plane")
@dataclass(frozen=True, slots=True)
class PlaneEntry(SchemaObject):
    """One stored plane: name, absolute byte offset in its file, size, and xxh3-128 hex digest."""

    name: str = field(metadata=js(Str(nonempty=True, intern=True)))
    offset: int = field(metadata=js(Int()))
    nbytes: int = field(metadata=js(Int()))
    digest: str = field(metadata=js(_DIGEST))


@schema("tensor", fast="_fast_tensor")
@dataclass(frozen=True, slots=True)
class TensorEntry(SchemaObject):
    name: str = field(metadata=js(Str(nonempty=True)))
    format: str = field(metadata=js(_INTERNED))
    layout: str = field(metadata=js(_INTERNED))
    shape: tuple[int, ...] = field(metadata=js(_INTS))
    physical: tuple[int, ...] = field(metadata=js(_INTS))
    planes: tuple[PlaneEntry, ...] = field(metadata=js(Seq(Obj(PlaneEntry))))
    role: str = field(metadata=js(_INTERNED))
    provenance: Provenance = field(metadata=js(Obj(Provenance)))


@schema("file")
@dataclass(frozen=True, slots=True)
class SideFile(SchemaObject):
    """A non-weight file of the model directory (config.json, tokenizer files)."""

    name: str = field(metadata=js(Str(nonempty=True)))
    size: int = field(metadata=js(Int()))
    digest: str = field(metadata=js(_DIGEST))


@schema("shard")
@dataclass(frozen=True, slots=True)
class ShardInfo(SchemaObject):
    """1-based ``index`` of this file among ``count`` shards (1 of 1 for a single file)."""

    index: int = field(metadata=js(Int(1, "count")))
    count: int = field(metadata=js(Int(1, 99_999_999)))


@schema("")
@dataclass(frozen=True, slots=True)
class Header(SchemaObject):
    """The whole header JSON of one container file."""

    artifact: ArtifactMeta = field(metadata=js(Obj(ArtifactMeta)))
    files: tuple[SideFile, ...] = field(metadata=js(Seq(Obj(SideFile))))
    shard: ShardInfo = field(metadata=js(Obj(ShardInfo)))
    tensors: tuple[TensorEntry, ...] = field(metadata=js(Seq(Obj(TensorEntry))))


# ---------------------------------------------------------------------------------------------
# Shard index (model.ninfer.index.json)


@schema("shard")
@dataclass(frozen=True, slots=True)
class IndexShard(SchemaObject):
    """One shard: its file name, its exact size, and its header digest (hex)."""

    file: str = field(metadata=js(Str(nonempty=True)))
    size: int = field(metadata=js(Int()))
    digest: str = field(metadata=js(_DIGEST))


INDEX_FORMAT = "ninfer-index"


@schema("", consts={"format": INDEX_FORMAT})
@dataclass(frozen=True, slots=True)
class IndexFile(SchemaObject):
    """``model.ninfer.index.json``: format tag and version, total size, shards, weight map."""

    version: int = field(metadata=js(Int()))
    total_size: int = field(metadata=js(Int()))
    shards: tuple[IndexShard, ...] = field(metadata=js(Seq(Obj(IndexShard))))
    weight_map: Mapping[str, str] = field(metadata=js(StrMap(Str(nonempty=True))))


SCHEMA_CLASSES: tuple[type[SchemaObject], ...] = (
    SourceRef, ConcatTransform, TransposeTransform, ReshapeTransform, CopyQuantizedTransform,
    RuleRef, Provenance, Producer, RecipeInfo, SourceFile, SourceTensor, SourceRepo, SourceInfo,
    ArtifactMeta, PlaneEntry, TensorEntry, SideFile, ShardInfo, Header, IndexShard, IndexFile,
)  # fmt: skip
"""Every schema class (the round-trip tests walk them all)."""

# Positional constructors that give what the class's own __init__ gives (checked once per class
# by _maker) without the frozen __init__'s object.__setattr__ per field: the writer builds an
# entry and a plane entry per tensor (about 3 us of a one-element tensor's cost with __init__).
make_plane_entry: Callable[[str, int, int, str], PlaneEntry] = _maker(PlaneEntry)
make_tensor_entry: Callable[
    [str, str, str, tuple[int, ...], tuple[int, ...], tuple[PlaneEntry, ...], str, Provenance],
    TensorEntry,
] = _maker(TensorEntry)

_fast_tensor: Callable[[object, dict[Any, Any]], TensorEntry | None] = globals()["_fast_tensor"]
_fast_provenance: Callable[[object, dict[Any, Any]], Provenance | None] = globals()[
    "_fast_provenance"
]
_fast_source_tensor: Callable[[object], SourceTensor | None] = globals()["_fast_source_tensor"]
