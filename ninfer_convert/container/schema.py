"""The one schema of the container header and the shard index (docs/container.md).

Contract: each JSON object of the header is a frozen dataclass here with ``to_json()`` (returns
plain JSON values, ready for :func:`~ninfer_convert.container.wire.canonical_json`) and
``from_json(value, where)`` (validates strictly and raises :class:`SchemaError`).  The writer
validates what it is given and the reader validates what it reads with the same functions, so
a file the writer produces always passes the reader, and nothing else does.

Strictness: every object has a fixed key set (unknown or missing keys are errors), every value
has one JSON type (a bool is never an int, a float is never an int), integers lie in a stated
range, and digests are 32 lowercase hex digits.  Semantic checks that need the registries or the
file (format names, geometry, offsets) live in the reader and writer, not here.

:class:`SchemaError` carries a JSON-pointer-like location (``tensors[3].planes[0].offset``); the
reader turns it into :class:`~ninfer_convert.errors.ArtifactError` and the writer into
:class:`~ninfer_convert.errors.UsageError`.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ..errors import SchemaError
from .wire import DIGEST_HEX_RE, MAX_INT

__all__ = [
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
    "paused_gc",
    "transform_from_json",
]

MAX_JSON_DEPTH = 64
"""Nesting limit for free-form JSON (the source ``config``)."""


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Run a block without the cyclic garbage collector.  Parsing or building a header makes
    a few dozen objects per tensor, none of them cyclic; with 100,000 tensors the collector's
    passes over the growing heap cost more than the parsing.  Reference counting still frees
    everything; the collector resumes (if it was on) when the block ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ---------------------------------------------------------------------------------------------
# Primitive checks


def _obj(value: object, where: str, keys: frozenset[str]) -> Mapping[str, Any]:
    # Fast path for what JSON parsing gives: a dict with exactly the allowed keys (all of
    # them strings) passes every check below.
    if type(value) is dict and value.keys() == keys:
        return value
    if not isinstance(value, Mapping):
        raise SchemaError(where, f"expected an object, got {_kind(value)}")
    for key in value:
        if not isinstance(key, str):
            raise SchemaError(where, f"object key {key!r} is not a string")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise SchemaError(where, f"unknown key(s) {unknown}; allowed keys are {sorted(keys)}")
    missing = sorted(keys - set(value))
    if missing:
        raise SchemaError(where, f"missing key(s) {missing}")
    return value


def _str(value: object, where: str, *, nonempty: bool = False) -> str:
    if not isinstance(value, str):
        raise SchemaError(where, f"expected a string, got {_kind(value)}")
    if nonempty and not value:
        raise SchemaError(where, "must not be empty")
    return value


def _opt_str(value: object, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _int(value: object, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    # bool is an int subclass in Python; JSON true is not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(where, f"expected an integer, got {_kind(value)}")
    if not lo <= value <= hi:
        raise SchemaError(where, f"integer {value} outside [{lo}, {hi}]")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise SchemaError(where, f"expected an array, got {_kind(value)}")
    return value


def _fast_ints(value: object, lo: int = 0, hi: int = MAX_INT) -> tuple[int, ...] | None:
    """The checks of :func:`_ints` for a list of plain ints, without building error paths;
    ``None`` when anything is unusual (the caller then runs the checked path)."""
    if type(value) is not list and type(value) is not tuple:
        return None
    for v in value:
        if type(v) is not int or not lo <= v <= hi:
            return None
    return tuple(value)


def _ints(value: object, where: str, lo: int = 0, hi: int = MAX_INT) -> tuple[int, ...]:
    return tuple(_int(v, f"{where}[{i}]", lo, hi) for i, v in enumerate(_list(value, where)))


def _strs(value: object, where: str) -> tuple[str, ...]:
    return tuple(_str(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where)))


def _digest(value: object, where: str) -> str:
    text = _str(value, where)
    if not DIGEST_HEX_RE.fullmatch(text):
        raise SchemaError(where, f"digest {text[:80]!r} is not 32 lowercase hex digits")
    return text


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return type(value).__name__


def json_value(value: object, where: str, depth: int = 0) -> Any:
    """Validate and copy free-form JSON (object keys strings, finite numbers, bounded depth)."""
    if depth > MAX_JSON_DEPTH:
        raise SchemaError(where, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SchemaError(where, f"non-finite number {value!r} is not JSON")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SchemaError(where, f"object key {k!r} is not a string")
            out[k] = json_value(v, f"{where}.{k}", depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [json_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise SchemaError(where, f"{type(value).__name__} is not a JSON value")


_T = TypeVar("_T")


def _coerce(cls: type[_T], value: object, where: str) -> _T:
    """Accept either an instance of the dataclass or its JSON form."""
    if isinstance(value, cls):
        return value
    return cls.from_json(value, where)  # type: ignore[attr-defined, no-any-return]


# ---------------------------------------------------------------------------------------------
# Provenance (per tensor)


@dataclass(frozen=True)
class SourceRef:
    """One source tensor a stored tensor was made from."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "dtype", "shape", "file"})

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "file": self.file,
        }

    @classmethod
    def from_json(cls, value: object, where: str = "source") -> SourceRef:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            name=_str(obj["name"], f"{where}.name", nonempty=True),
            dtype=_str(obj["dtype"], f"{where}.dtype"),
            shape=_ints(obj["shape"], f"{where}.shape"),
            file=_str(obj["file"], f"{where}.file"),
        )


@dataclass(frozen=True)
class ConcatTransform:
    """Concatenation of the sources along ``axis``."""

    axis: int
    op: ClassVar[str] = "concat"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "axis": self.axis}


@dataclass(frozen=True)
class TransposeTransform:
    """A rank-two transpose."""

    op: ClassVar[str] = "transpose"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op}


@dataclass(frozen=True)
class ReshapeTransform:
    """A reshape to ``shape``."""

    shape: tuple[int, ...]
    op: ClassVar[str] = "reshape"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "shape": list(self.shape)}


@dataclass(frozen=True)
class CopyQuantizedTransform:
    """Already-quantized words copied from a source quantization ``scheme``."""

    scheme: str
    op: ClassVar[str] = "copy-quantized"

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "scheme": self.scheme}


Transform = ConcatTransform | TransposeTransform | ReshapeTransform | CopyQuantizedTransform

_AXIS_LIMIT = 64


def transform_from_json(value: object, where: str = "transform") -> Transform:
    """Validate one transform object; the keys allowed depend on its ``op``."""
    if isinstance(
        value, (ConcatTransform, TransposeTransform, ReshapeTransform, CopyQuantizedTransform)
    ):
        return value
    if not isinstance(value, Mapping):
        raise SchemaError(where, f"expected an object, got {_kind(value)}")
    op = value.get("op")
    if op == "concat":
        obj = _obj(value, where, frozenset({"op", "axis"}))
        return ConcatTransform(_int(obj["axis"], f"{where}.axis", -_AXIS_LIMIT, _AXIS_LIMIT))
    if op == "transpose":
        _obj(value, where, frozenset({"op"}))
        return TransposeTransform()
    if op == "reshape":
        obj = _obj(value, where, frozenset({"op", "shape"}))
        return ReshapeTransform(_ints(obj["shape"], f"{where}.shape"))
    if op == "copy-quantized":
        obj = _obj(value, where, frozenset({"op", "scheme"}))
        return CopyQuantizedTransform(_str(obj["scheme"], f"{where}.scheme", nonempty=True))
    raise SchemaError(
        f"{where}.op",
        f"unknown transform op {op!r}; allowed: concat, transpose, reshape, copy-quantized",
    )


@dataclass(frozen=True)
class RuleRef:
    """The recipe rule that selected this tensor: its 0-based index, line, and pattern."""

    index: int
    line: int
    pattern: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"index", "line", "pattern"})

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "line": self.line, "pattern": self.pattern}

    @classmethod
    def from_json(cls, value: object, where: str = "rule") -> RuleRef:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            index=_int(obj["index"], f"{where}.index"),
            line=_int(obj["line"], f"{where}.line"),
            pattern=_str(obj["pattern"], f"{where}.pattern"),
        )


@dataclass(frozen=True)
class Provenance:
    """How a stored tensor was derived (spec Section 10)."""

    sources: tuple[SourceRef, ...]
    conversion: str | None
    transforms: tuple[Transform, ...]
    encoder_profile: str | None
    rule: RuleRef
    constraints: tuple[str, ...] = ()

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"sources", "conversion", "transforms", "encoder_profile", "rule", "constraints"}
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "sources": [s.to_json() for s in self.sources],
            "conversion": self.conversion,
            "transforms": [t.to_json() for t in self.transforms],
            "encoder_profile": self.encoder_profile,
            "rule": self.rule.to_json(),
            "constraints": list(self.constraints),
        }

    @classmethod
    def from_json(cls, value: object, where: str = "provenance") -> Provenance:
        if isinstance(value, cls):
            return value
        fast = _fast_provenance(value, {})
        return fast if fast is not None else cls.checked_from_json(value, where)

    @classmethod
    def checked_from_json(cls, value: object, where: str = "provenance") -> Provenance:
        """The field-by-field validation that names the failing field."""
        if isinstance(value, cls):
            return value
        obj = _obj(value, where, cls.KEYS)
        return cls(
            sources=tuple(
                _coerce(SourceRef, v, f"{where}.sources[{i}]")
                for i, v in enumerate(_list(obj["sources"], f"{where}.sources"))
            ),
            conversion=_opt_str(obj["conversion"], f"{where}.conversion"),
            transforms=tuple(
                transform_from_json(v, f"{where}.transforms[{i}]")
                for i, v in enumerate(_list(obj["transforms"], f"{where}.transforms"))
            ),
            encoder_profile=_opt_str(obj["encoder_profile"], f"{where}.encoder_profile"),
            rule=_coerce(RuleRef, obj["rule"], f"{where}.rule"),
            constraints=_strs(obj["constraints"], f"{where}.constraints"),
        )


# ---------------------------------------------------------------------------------------------
# Artifact metadata


@dataclass(frozen=True)
class Producer:
    name: str
    version: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "version"})

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}

    @classmethod
    def from_json(cls, value: object, where: str = "producer") -> Producer:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            _str(obj["name"], f"{where}.name", nonempty=True),
            _str(obj["version"], f"{where}.version"),
        )


@dataclass(frozen=True)
class RecipeInfo:
    """The full recipe text, its digest and its cited quality evidence."""

    name: str
    text: str
    digest: str
    evidence: tuple[str, ...] = ()

    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "text", "digest", "evidence"})

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "text": self.text,
            "digest": self.digest,
            "evidence": list(self.evidence),
        }

    @classmethod
    def from_json(cls, value: object, where: str = "recipe") -> RecipeInfo:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            name=_str(obj["name"], f"{where}.name"),
            text=_str(obj["text"], f"{where}.text"),
            digest=_str(obj["digest"], f"{where}.digest"),
            evidence=_strs(obj["evidence"], f"{where}.evidence"),
        )


@dataclass(frozen=True)
class SourceFile:
    name: str
    size: int

    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "size"})

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size}

    @classmethod
    def from_json(cls, value: object, where: str = "file") -> SourceFile:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            _str(obj["name"], f"{where}.name", nonempty=True), _int(obj["size"], f"{where}.size")
        )


@dataclass(frozen=True)
class SourceTensor:
    dtype: str
    shape: tuple[int, ...]
    digest: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"dtype", "shape", "digest"})

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "digest": self.digest}

    @classmethod
    def from_json(cls, value: object, where: str = "tensor") -> SourceTensor:
        fast = _fast_source_tensor(value)
        if fast is not None:
            return fast
        obj = _obj(value, where, cls.KEYS)
        return cls(
            dtype=_str(obj["dtype"], f"{where}.dtype"),
            shape=_ints(obj["shape"], f"{where}.shape"),
            digest=_str(obj["digest"], f"{where}.digest"),
        )


def _source_tensors(tensors: Mapping[Any, Any], where: str) -> dict[str, SourceTensor]:
    # One entry per source tensor (100,000 in a large MoE): the paths for the error messages
    # are built only for an entry that fails.
    out: dict[str, SourceTensor] = {}
    for k, v in tensors.items():
        if type(k) is not str:
            _str(k, where)
        fast = v if isinstance(v, SourceTensor) else _fast_source_tensor(v)
        out[k] = fast if fast is not None else SourceTensor.from_json(v, f"{where}.{k}")
    return out


def _fast_source_tensor(value: object) -> SourceTensor | None:
    """:meth:`SourceTensor.from_json`'s checks for a plain parsed dict, or ``None``."""
    if type(value) is dict and value.keys() == SourceTensor.KEYS:
        dtype, shape, digest = value["dtype"], _fast_ints(value["shape"]), value["digest"]
        if type(dtype) is str and shape is not None and type(digest) is str:
            return SourceTensor(dtype, shape, digest)
    return None


@dataclass(frozen=True)
class SourceRepo:
    """Which cached Hugging Face snapshot a repo-id source was: id, revision asked, commit."""

    id: str
    revision: str | None
    commit: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"id", "revision", "commit"})

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "revision": self.revision, "commit": self.commit}

    @classmethod
    def from_json(cls, value: object, where: str = "repo") -> SourceRepo:
        obj = _obj(value, where, cls.KEYS)
        commit = _str(obj["commit"], f"{where}.commit")
        if not _COMMIT_RE.fullmatch(commit):
            raise SchemaError(f"{where}.commit", f"{commit[:80]!r} is not 40 lowercase hex digits")
        revision = obj["revision"]
        return cls(
            id=_str(obj["id"], f"{where}.id", nonempty=True),
            revision=None
            if revision is None
            else _str(revision, f"{where}.revision", nonempty=True),
            commit=commit,
        )


_COMMIT_RE = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class SourceInfo:
    """Identity of the source checkpoint: kind, path, config, files and per-tensor digests;
    ``repo`` (only for a cached repo-id source, and only then present in the JSON) names the
    snapshot."""

    kind: str
    path: str
    config: Mapping[str, Any] | None
    files: tuple[SourceFile, ...]
    tensors: Mapping[str, SourceTensor] = field(default_factory=dict)
    repo: SourceRepo | None = None

    KEYS: ClassVar[frozenset[str]] = frozenset({"kind", "path", "config", "files", "tensors"})
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"repo"})

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "path": self.path,
            "config": None if self.config is None else json_value(self.config, "config"),
            "files": [f.to_json() for f in self.files],
            "tensors": {k: v.to_json() for k, v in self.tensors.items()},
        }
        if self.repo is not None:
            out["repo"] = self.repo.to_json()
        return out

    @classmethod
    def from_json(cls, value: object, where: str = "source") -> SourceInfo:
        present = cls.OPTIONAL & set(value) if isinstance(value, Mapping) else frozenset()
        obj = _obj(value, where, cls.KEYS | present)
        config = obj["config"]
        if config is not None and not isinstance(config, Mapping):
            raise SchemaError(f"{where}.config", f"expected an object or null, got {_kind(config)}")
        tensors = obj["tensors"]
        if not isinstance(tensors, Mapping):
            raise SchemaError(f"{where}.tensors", f"expected an object, got {_kind(tensors)}")
        return cls(
            kind=_str(obj["kind"], f"{where}.kind"),
            path=_str(obj["path"], f"{where}.path"),
            config=None if config is None else json_value(config, f"{where}.config"),
            files=tuple(
                _coerce(SourceFile, v, f"{where}.files[{i}]")
                for i, v in enumerate(_list(obj["files"], f"{where}.files"))
            ),
            tensors=_source_tensors(tensors, f"{where}.tensors"),
            repo=_coerce(SourceRepo, obj["repo"], f"{where}.repo") if "repo" in obj else None,
        )


@dataclass(frozen=True)
class ArtifactMeta:
    """Artifact-level metadata, identical in every shard's header."""

    producer: Producer
    recipe: RecipeInfo
    source: SourceInfo
    alignment: int

    KEYS: ClassVar[frozenset[str]] = frozenset({"producer", "recipe", "source", "alignment"})

    def to_json(self) -> dict[str, Any]:
        return {
            "producer": self.producer.to_json(),
            "recipe": self.recipe.to_json(),
            "source": self.source.to_json(),
            "alignment": self.alignment,
        }

    @classmethod
    def from_json(cls, value: object, where: str = "artifact") -> ArtifactMeta:
        if isinstance(value, cls):
            return value
        obj = _obj(value, where, cls.KEYS)
        return cls(
            producer=_coerce(Producer, obj["producer"], f"{where}.producer"),
            recipe=_coerce(RecipeInfo, obj["recipe"], f"{where}.recipe"),
            source=_coerce(SourceInfo, obj["source"], f"{where}.source"),
            alignment=_int(obj["alignment"], f"{where}.alignment"),
        )


# ---------------------------------------------------------------------------------------------
# Header


@dataclass(frozen=True)
class PlaneEntry:
    name: str
    offset: int
    nbytes: int
    digest: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "offset", "nbytes", "digest"})

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "offset": self.offset,
            "nbytes": self.nbytes,
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, value: object, where: str = "plane") -> PlaneEntry:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            name=_str(obj["name"], f"{where}.name", nonempty=True),
            offset=_int(obj["offset"], f"{where}.offset"),
            nbytes=_int(obj["nbytes"], f"{where}.nbytes"),
            digest=_digest(obj["digest"], f"{where}.digest"),
        )


@dataclass(frozen=True)
class TensorEntry:
    name: str
    format: str
    layout: str
    shape: tuple[int, ...]
    physical: tuple[int, ...]
    planes: tuple[PlaneEntry, ...]
    role: str
    provenance: Provenance

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"name", "format", "layout", "shape", "physical", "planes", "role", "provenance"}
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "layout": self.layout,
            "shape": list(self.shape),
            "physical": list(self.physical),
            "planes": [p.to_json() for p in self.planes],
            "role": self.role,
            "provenance": self.provenance.to_json(),
        }

    @classmethod
    def from_json(
        cls, value: object, where: str = "tensor", memo: dict[Any, Any] | None = None
    ) -> TensorEntry:
        """Validate one header entry.  ``memo`` (one dict per header) shares equal strings and
        rule references between entries, which keeps a 100,000-tensor header small in memory."""
        fast = _fast_tensor(value, {} if memo is None else memo)
        return fast if fast is not None else cls.checked_from_json(value, where)

    @classmethod
    def checked_from_json(cls, value: object, where: str = "tensor") -> TensorEntry:
        """The field-by-field validation that names the failing field (the fast path's
        fallback, and its reference in the tests)."""
        obj = _obj(value, where, cls.KEYS)
        return cls(
            name=_str(obj["name"], f"{where}.name", nonempty=True),
            format=_str(obj["format"], f"{where}.format"),
            layout=_str(obj["layout"], f"{where}.layout"),
            shape=_ints(obj["shape"], f"{where}.shape"),
            physical=_ints(obj["physical"], f"{where}.physical"),
            planes=tuple(
                PlaneEntry.from_json(v, f"{where}.planes[{i}]")
                for i, v in enumerate(_list(obj["planes"], f"{where}.planes"))
            ),
            role=_str(obj["role"], f"{where}.role"),
            provenance=Provenance.checked_from_json(obj["provenance"], f"{where}.provenance"),
        )


def _intern(memo: dict[Any, Any], text: str) -> str:
    shared: str = memo.setdefault(text, text)
    return shared


def _fast_str(value: object, memo: dict[Any, Any]) -> str | None:
    return memo.setdefault(value, value) if type(value) is str else None  # type: ignore[no-any-return]


def _fast_provenance(value: object, memo: dict[Any, Any]) -> Provenance | None:
    """:meth:`Provenance.from_json`'s checks for a plain parsed dict, or ``None``."""
    if type(value) is not dict or value.keys() != Provenance.KEYS:
        return None
    sources_v = value["sources"]
    if type(sources_v) is not list:
        return None
    sources = []
    for v in sources_v:
        if type(v) is not dict or v.keys() != SourceRef.KEYS:
            return None
        name, dtype, file = v["name"], _fast_str(v["dtype"], memo), _fast_str(v["file"], memo)
        shape = _fast_ints(v["shape"])
        if type(name) is not str or not name or dtype is None or file is None or shape is None:
            return None
        sources.append(SourceRef(name, dtype, shape, file))
    conversion = value["conversion"]
    profile = value["encoder_profile"]
    if conversion is not None and type(conversion) is not str:
        return None
    if profile is not None and type(profile) is not str:
        return None
    transforms_v, constraints_v = value["transforms"], value["constraints"]
    if type(transforms_v) is not list or type(constraints_v) is not list:
        return None
    if any(type(c) is not str for c in constraints_v):
        return None
    rule_v = value["rule"]
    if type(rule_v) is not dict or rule_v.keys() != RuleRef.KEYS:
        return None
    index, line, pattern = rule_v["index"], rule_v["line"], rule_v["pattern"]
    if type(index) is not int or type(line) is not int or type(pattern) is not str:
        return None
    if not 0 <= index <= MAX_INT or not 0 <= line <= MAX_INT:
        return None
    rule_key = ("rule", index, line, pattern)
    rule = memo.get(rule_key)
    if rule is None:
        rule = memo[rule_key] = RuleRef(index, line, pattern)
    try:  # transforms are few and rare; their own validator is cheap enough
        transforms = tuple(transform_from_json(v, "") for v in transforms_v)
    except SchemaError:
        return None
    return Provenance(
        sources=tuple(sources),
        conversion=None if conversion is None else _intern(memo, conversion),
        transforms=transforms,
        encoder_profile=None if profile is None else _intern(memo, profile),
        rule=rule,
        constraints=tuple(_intern(memo, c) for c in constraints_v),
    )


def _fast_tensor(value: object, memo: dict[Any, Any]) -> TensorEntry | None:
    """:meth:`TensorEntry.from_json`'s checks without building an error path per field, for
    a plain parsed dict; ``None`` when any check fails, and the caller then runs the checked
    path, which finds the same problem and names it.  It accepts nothing the checked path
    refuses (tests/test_schema_fast_path.py compares the two)."""
    if type(value) is not dict or value.keys() != TensorEntry.KEYS:
        return None
    name = value["name"]
    fmt, layout = _fast_str(value["format"], memo), _fast_str(value["layout"], memo)
    role = _fast_str(value["role"], memo)
    if type(name) is not str or not name or fmt is None or layout is None or role is None:
        return None
    shape, physical = _fast_ints(value["shape"]), _fast_ints(value["physical"])
    planes_v = value["planes"]
    if shape is None or physical is None or type(planes_v) is not list:
        return None
    planes = []
    for p in planes_v:
        if type(p) is not dict or p.keys() != PlaneEntry.KEYS:
            return None
        p_name, offset, nbytes, digest = p["name"], p["offset"], p["nbytes"], p["digest"]
        if type(p_name) is not str or not p_name or type(digest) is not str:
            return None
        if type(offset) is not int or type(nbytes) is not int:
            return None
        if not 0 <= offset <= MAX_INT or not 0 <= nbytes <= MAX_INT:
            return None
        if DIGEST_HEX_RE.fullmatch(digest) is None:
            return None
        planes.append(PlaneEntry(_intern(memo, p_name), offset, nbytes, digest))
    provenance = _fast_provenance(value["provenance"], memo)
    if provenance is None:
        return None
    return TensorEntry(name, fmt, layout, shape, physical, tuple(planes), role, provenance)


@dataclass(frozen=True)
class SideFile:
    """A non-weight file of the model directory (config.json, tokenizer files)."""

    name: str
    size: int
    digest: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"name", "size", "digest"})

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "digest": self.digest}

    @classmethod
    def from_json(cls, value: object, where: str = "file") -> SideFile:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            name=_str(obj["name"], f"{where}.name", nonempty=True),
            size=_int(obj["size"], f"{where}.size"),
            digest=_digest(obj["digest"], f"{where}.digest"),
        )


@dataclass(frozen=True)
class ShardInfo:
    """1-based ``index`` of this file among ``count`` shards (1 of 1 for a single file)."""

    index: int
    count: int

    KEYS: ClassVar[frozenset[str]] = frozenset({"index", "count"})

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "count": self.count}

    @classmethod
    def from_json(cls, value: object, where: str = "shard") -> ShardInfo:
        obj = _obj(value, where, cls.KEYS)
        count = _int(obj["count"], f"{where}.count", 1, 99_999_999)
        return cls(_int(obj["index"], f"{where}.index", 1, count), count)


@dataclass(frozen=True)
class Header:
    """The whole header JSON of one container file."""

    artifact: ArtifactMeta
    files: tuple[SideFile, ...]
    shard: ShardInfo
    tensors: tuple[TensorEntry, ...]

    KEYS: ClassVar[frozenset[str]] = frozenset({"artifact", "files", "shard", "tensors"})

    def to_json(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact.to_json(),
            "files": [f.to_json() for f in self.files],
            "shard": self.shard.to_json(),
            "tensors": [t.to_json() for t in self.tensors],
        }

    @classmethod
    def from_json(cls, value: object, where: str = "") -> Header:
        obj = _obj(value, where, cls.KEYS)
        pre = f"{where}." if where else ""
        memo: dict[Any, Any] = {}
        return cls(
            artifact=ArtifactMeta.from_json(obj["artifact"], f"{pre}artifact"),
            files=tuple(
                SideFile.from_json(v, f"{pre}files[{i}]")
                for i, v in enumerate(_list(obj["files"], f"{pre}files"))
            ),
            shard=ShardInfo.from_json(obj["shard"], f"{pre}shard"),
            tensors=tuple(
                TensorEntry.from_json(v, f"{pre}tensors[{i}]", memo)
                for i, v in enumerate(_list(obj["tensors"], f"{pre}tensors"))
            ),
        )


# ---------------------------------------------------------------------------------------------
# Shard index (model.ninfer.index.json)


@dataclass(frozen=True)
class IndexShard:
    """One shard: its file name, its exact size, and its header digest (hex)."""

    file: str
    size: int
    digest: str

    KEYS: ClassVar[frozenset[str]] = frozenset({"file", "size", "digest"})

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "size": self.size, "digest": self.digest}

    @classmethod
    def from_json(cls, value: object, where: str = "shard") -> IndexShard:
        obj = _obj(value, where, cls.KEYS)
        return cls(
            file=_str(obj["file"], f"{where}.file", nonempty=True),
            size=_int(obj["size"], f"{where}.size"),
            digest=_digest(obj["digest"], f"{where}.digest"),
        )


INDEX_FORMAT = "ninfer-index"


@dataclass(frozen=True)
class IndexFile:
    """``model.ninfer.index.json``: format tag and version, total size, shards, weight map."""

    version: int
    total_size: int
    shards: tuple[IndexShard, ...]
    weight_map: Mapping[str, str]

    KEYS: ClassVar[frozenset[str]] = frozenset(
        {"format", "version", "total_size", "shards", "weight_map"}
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": INDEX_FORMAT,
            "version": self.version,
            "total_size": self.total_size,
            "shards": [s.to_json() for s in self.shards],
            "weight_map": dict(self.weight_map),
        }

    @classmethod
    def from_json(cls, value: object, where: str = "") -> IndexFile:
        obj = _obj(value, where, cls.KEYS)
        pre = f"{where}." if where else ""
        if obj["format"] != INDEX_FORMAT:
            raise SchemaError(f"{pre}format", f"expected {INDEX_FORMAT!r}, got {obj['format']!r}")
        wm = obj["weight_map"]
        if not isinstance(wm, Mapping):
            raise SchemaError(f"{pre}weight_map", f"expected an object, got {_kind(wm)}")
        return cls(
            version=_int(obj["version"], f"{pre}version"),
            total_size=_int(obj["total_size"], f"{pre}total_size"),
            shards=tuple(
                IndexShard.from_json(v, f"{pre}shards[{i}]")
                for i, v in enumerate(_list(obj["shards"], f"{pre}shards"))
            ),
            weight_map={
                _str(k, f"{pre}weight_map"): _str(v, f"{pre}weight_map.{k}", nonempty=True)
                for k, v in wm.items()
            },
        )
