"""The one schema of the container header and the shard index (docs/container.md).

Contract: each JSON object of the header is a frozen dataclass here whose fields carry a field
spec (``Str``, ``Int``, ``Seq``, ``Obj``, ``OneOf``, ``Map``, ``Json``, ``Opt``); the
:func:`schema` decorator generates from those specs, once at import, everything else the class
does with JSON:

* ``to_json()`` returns plain JSON values, ready for
  :func:`~ninfer_convert.container.wire.canonical_json` (constant keys such as a transform's
  ``op`` first, then the fields in declaration order; a field declared ``omit_none`` is left out
  when it is ``None``);
* ``from_json(value, where)`` validates strictly and raises :class:`SchemaError`; it also
  accepts an instance of the class, which it returns unchanged;
* ``checked_from_json(value, where)`` is the field-by-field validation that names the failing
  field.  Classes declared with ``fast=NAME`` also get a decoder compiled from the specs (bound
  to the module global ``NAME``) that checks a plain parsed dict without building error paths
  and returns ``None`` on any doubt; ``from_json`` tries it first and falls back to the checked
  path, which finds the same problem and names it.  The fast decoder accepts exactly what the
  checked path accepts and builds the same value (tests/test_schema_fast_path.py);
* ``json_pairs()`` is the number of object members of ``to_json()``'s value, all levels
  included, without building it (the reader compares it with the members in the text to find
  duplicate keys without a per-object hook).

The writer validates what it is given and the reader validates what it reads with the same
functions, so a file the writer produces always passes the reader, and nothing else does.

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
import dataclasses
import gc
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
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
    "json_pairs",
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
# Primitive checks (the checked path's vocabulary and its messages)


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
    """The checks of ``Seq(Int(lo, hi))`` for a list of plain ints, without building error
    paths; ``None`` when anything is unusual (the caller then runs the checked path)."""
    if type(value) is not list and type(value) is not tuple:
        return None
    for v in value:
        if type(v) is not int or not lo <= v <= hi:
            return None
    return tuple(value)


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


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


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


def json_pairs(value: object) -> int:
    """Object members in a free-form JSON value, all levels included."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return count


# ---------------------------------------------------------------------------------------------
# Field specs: what one JSON value is, how it is checked, compiled, encoded and counted.
#
# Each spec has a checked decoder (``check``), a compiled one (``fast``: lines of Python that
# validate the local ``var`` in place and ``return None`` on any doubt), an encoder expression
# (``encode``) and a member-count expression (``pairs``: an int when constant, else source).


class _Gen:
    """Source of one compiled decoder, and the names it refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.env: dict[str, Any] = {}
        self.depth = 1
        self._n = 0

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def name(self, value: Any, hint: str = "k") -> str:
        for key, known in self.env.items():
            if known is value:
                return key
        self._n += 1
        key = f"_{hint}{self._n}"
        self.env[key] = value
        return key

    def local(self) -> str:
        self._n += 1
        return f"v{self._n}"


class Spec:
    """One JSON value's type and rules."""

    uses_memo = False

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        raise NotImplementedError

    def fast(self, g: _Gen, var: str) -> None:
        raise NotImplementedError

    def encode(self, expr: str) -> str:
        return expr

    def pairs(self, expr: str) -> int | str:
        return 0


@dataclass
class _Ctx:
    """Checked decoding state: the per-header memo, the fields decoded so far, and whether
    nested objects must take the checked path too (below a class that has a fast decoder the
    checked path is that decoder's reference, so it stays checked all the way down)."""

    memo: dict[Any, Any]
    strict: bool
    done: dict[str, Any] = field(default_factory=dict)


class Str(Spec):
    """A string; ``nonempty``; ``pattern`` with the message for a mismatch; ``intern`` shares
    equal strings between the entries of one header (memory, not meaning)."""

    def __init__(
        self,
        *,
        nonempty: bool = False,
        pattern: re.Pattern[str] | None = None,
        mismatch: Callable[[str], str] | None = None,
        intern: bool = False,
    ) -> None:
        self.nonempty, self.pattern, self.mismatch, self.intern = (
            nonempty,
            pattern,
            mismatch,
            intern,
        )
        self.uses_memo = intern

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        text = _str(value, where, nonempty=self.nonempty)
        if self.pattern is not None and not self.pattern.fullmatch(text):
            assert self.mismatch is not None
            raise SchemaError(where, self.mismatch(text))
        return ctx.memo.setdefault(text, text) if self.intern else text

    def fast(self, g: _Gen, var: str) -> None:
        g.emit(f"if type({var}) is not str: return None")
        if self.nonempty:
            g.emit(f"if not {var}: return None")
        if self.pattern is not None:
            g.emit(f"if {g.name(self.pattern.fullmatch, 're')}({var}) is None: return None")
        if self.intern:
            g.emit(f"{var} = memo.setdefault({var}, {var})")


class Int(Spec):
    """An integer in ``[lo, hi]``; ``hi`` may name a field decoded before (its value)."""

    def __init__(self, lo: int = 0, hi: int | str = MAX_INT) -> None:
        self.lo, self.hi = lo, hi

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        hi = ctx.done[self.hi] if isinstance(self.hi, str) else self.hi
        return _int(value, where, self.lo, hi)

    def fast(self, g: _Gen, var: str) -> None:
        assert isinstance(self.hi, int), "a field-relative bound has no fast path"
        g.emit(f"if type({var}) is not int or not {self.lo} <= {var} <= {self.hi}: return None")


class Opt(Spec):
    """``null`` or the inner spec."""

    def __init__(self, inner: Spec) -> None:
        self.inner = inner
        self.uses_memo = inner.uses_memo

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        return None if value is None else self.inner.check(value, where, ctx)

    def fast(self, g: _Gen, var: str) -> None:
        g.emit(f"if {var} is not None:")
        g.depth += 1
        self.inner.fast(g, var)
        g.depth -= 1

    def encode(self, expr: str) -> str:
        inner = self.inner.encode(expr)
        return expr if inner == expr else f"(None if {expr} is None else {inner})"

    def pairs(self, expr: str) -> int | str:
        inner = self.inner.pairs(expr)
        return 0 if inner == 0 else f"(0 if {expr} is None else {inner})"


class Seq(Spec):
    """A JSON array, as a tuple of the inner spec's values."""

    def __init__(self, inner: Spec) -> None:
        self.inner = inner
        self.uses_memo = inner.uses_memo

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        items = _list(value, where)
        if isinstance(self.inner, (Obj, OneOf)):
            return self.inner.check_many(items, where, ctx)
        return tuple(self.inner.check(v, f"{where}[{i}]", ctx) for i, v in enumerate(items))

    def fast(self, g: _Gen, var: str) -> None:
        inner = self.inner
        if isinstance(inner, Int):
            fn = g.name(_fast_ints, "ints")
            g.emit(f"{var} = {fn}({var}, {inner.lo}, {inner.hi})")
            g.emit(f"if {var} is None: return None")
            return
        item, acc = g.local(), g.local()
        g.emit(f"if type({var}) is not list: return None")
        g.emit(f"{acc} = []")
        g.emit(f"for {item} in {var}:")
        g.depth += 1
        inner.fast(g, item)
        g.emit(f"{acc}.append({item})")
        g.depth -= 1
        g.emit(f"{var} = tuple({acc})")

    def encode(self, expr: str) -> str:
        inner = self.inner.encode("x")
        return f"list({expr})" if inner == "x" else f"[{inner} for x in {expr}]"

    def pairs(self, expr: str) -> int | str:
        inner = self.inner.pairs("x")
        if inner == 0:
            return 0
        if isinstance(inner, int):
            return f"{inner} * len({expr})"
        return f"sum([{inner} for x in {expr}])"


class StrMap(Spec):
    """A JSON object with free keys, as a dict of the inner spec's values (``where.key``)."""

    def __init__(self, inner: Spec) -> None:
        self.inner = inner

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        if not isinstance(value, Mapping):
            raise SchemaError(where, f"expected an object, got {_kind(value)}")
        for k in value:
            if type(k) is not str:
                _str(k, where)
        if isinstance(self.inner, Obj):
            return self.inner.check_map(value, where, ctx)
        return {k: self.inner.check(v, f"{where}.{k}", ctx) for k, v in value.items()}

    def encode(self, expr: str) -> str:
        inner = self.inner.encode("x")
        return f"dict({expr})" if inner == "x" else f"{{k: {inner} for k, x in {expr}.items()}}"

    def pairs(self, expr: str) -> int | str:
        inner = self.inner.pairs("x")
        if isinstance(inner, int):
            return f"{1 + inner} * len({expr})"
        return f"len({expr}) + sum([{inner} for x in {expr}.values()])"


class Json(Spec):
    """Free-form JSON: an object or ``null`` (validated and copied by :func:`json_value`)."""

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        if value is not None and not isinstance(value, Mapping):
            raise SchemaError(where, f"expected an object or null, got {_kind(value)}")
        return None if value is None else json_value(value, where)

    def encode(self, expr: str) -> str:
        return f"(None if {expr} is None else _json_value({expr}, 'config'))"

    def pairs(self, expr: str) -> int | str:
        return f"_json_pairs({expr})"


class Obj(Spec):
    """A nested schema object (a class made by :func:`schema`)."""

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.uses_memo = cls._FAST_MEMO

    def _fast_fn(self, ctx: _Ctx) -> Callable[..., Any] | None:
        return None if ctx.strict else self.cls._fast()

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        return self.cls._checked(value, where, ctx.memo, ctx.strict)

    def check_many(self, items: Sequence[Any], where: str, ctx: _Ctx) -> tuple[Any, ...]:
        # Header.tensors: each element tries the fast decoder first (unless strict).
        fast, cls, memo = self._fast_fn(ctx), self.cls, ctx.memo
        out = []
        for i, v in enumerate(items):
            got = None if fast is None else (fast(v, memo) if cls._FAST_MEMO else fast(v))
            out.append(
                got if got is not None else cls._checked(v, f"{where}[{i}]", memo, ctx.strict)
            )
        return tuple(out)

    def check_map(self, items: Mapping[str, Any], where: str, ctx: _Ctx) -> dict[str, Any]:
        # One entry per source tensor (100,000 in a large MoE): the paths for the error
        # messages are built only for an entry that fails.
        fast, cls, memo = self._fast_fn(ctx), self.cls, ctx.memo
        out: dict[str, Any] = {}
        for k, v in items.items():
            got = None if fast is None else (fast(v, memo) if cls._FAST_MEMO else fast(v))
            out[k] = got if got is not None else cls._checked(v, f"{where}.{k}", memo, ctx.strict)
        return out

    def fast(self, g: _Gen, var: str) -> None:
        fn = g.name(self.cls._compiled, self.cls.__name__)
        g.emit(f"{var} = {fn}({var}, memo)" if self.cls._FAST_MEMO else f"{var} = {fn}({var})")
        g.emit(f"if {var} is None: return None")

    def encode(self, expr: str) -> str:
        return f"{expr}.to_json()"

    def pairs(self, expr: str) -> int | str:
        const: int | None = self.cls._PAIRS
        return const if const is not None else f"{expr}.json_pairs()"


class OneOf(Spec):
    """One of several schema classes, told apart by the constant of their ``tag`` key."""

    def __init__(self, what: str, tag: str, classes: Sequence[type[Any]]) -> None:
        self.what, self.tag, self.classes = what, tag, tuple(classes)
        self.by_tag = {c._CONSTS[tag]: c for c in classes}
        self.uses_memo = any(c._FAST_MEMO for c in classes)

    def check(self, value: Any, where: str, ctx: _Ctx) -> Any:
        if isinstance(value, self.classes):
            return value
        if not isinstance(value, Mapping):
            raise SchemaError(where, f"expected an object, got {_kind(value)}")
        tag = value.get(self.tag)
        cls = self.by_tag.get(tag) if isinstance(tag, str) else None
        if cls is None:
            allowed = ", ".join(self.by_tag)
            raise SchemaError(
                f"{where}.{self.tag}", f"unknown {self.what} {self.tag} {tag!r}; allowed: {allowed}"
            )
        return cls._checked(value, where, ctx.memo, ctx.strict)

    def check_many(self, items: Sequence[Any], where: str, ctx: _Ctx) -> tuple[Any, ...]:
        return tuple(self.check(v, f"{where}[{i}]", ctx) for i, v in enumerate(items))

    def fast(self, g: _Gen, var: str) -> None:
        tag = g.local()
        g.emit(f"if type({var}) is not dict: return None")
        g.emit(f"{tag} = {var}.get({self.tag!r})")
        first = True
        for value, cls in self.by_tag.items():
            fn = g.name(cls._compiled, cls.__name__)
            call = f"{fn}({var}, memo)" if cls._FAST_MEMO else f"{fn}({var})"
            g.emit(f"{'if' if first else 'elif'} {tag} == {value!r}: {var} = {call}")
            first = False
        g.emit("else: return None")
        g.emit(f"if {var} is None: return None")

    def encode(self, expr: str) -> str:
        return f"{expr}.to_json()"

    def pairs(self, expr: str) -> int | str:
        return f"{expr}.json_pairs()"


def js(spec: Spec, *, key: str | None = None, omit_none: bool = False) -> dict[str, Any]:
    """A dataclass field's metadata: its JSON spec; ``key`` (default: the field name);
    ``omit_none``: the key is left out when the value is ``None`` (and may be absent)."""
    return {"spec": spec, "key": key, "omit_none": omit_none}


@dataclass(frozen=True)
class _Field:
    name: str
    key: str
    spec: Spec
    omit_none: bool


_S = TypeVar("_S", bound="SchemaObject")


class SchemaObject:
    """Base of the schema classes; :func:`schema` fills in the class attributes and replaces
    ``to_json``, ``json_pairs`` and the compiled decoder by generated functions.  The classes
    are slotted (no ``__dict__``): a 100,000-tensor header builds about 600,000 of them."""

    __slots__ = ()

    WHERE: ClassVar[str] = ""
    KEYS: ClassVar[frozenset[str]] = frozenset()
    """The keys always present (constants and fields)."""
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    """Keys present only when their field is not ``None``."""
    _FIELDS: ClassVar[tuple[_Field, ...]] = ()
    _ORDER: ClassVar[tuple[_Field, ...]] = ()
    _CONSTS: ClassVar[dict[str, str]] = {}
    _PAIRS: ClassVar[int | None] = None
    _FAST_NAME: ClassVar[str | None] = None
    _FAST_MEMO: ClassVar[bool] = False
    _SHARED: ClassVar[bool] = False

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError  # pragma: no cover - generated by schema()

    def json_pairs(self) -> int:
        """Object members of :meth:`to_json`'s value, all levels included."""
        raise NotImplementedError  # pragma: no cover - generated by schema()

    @staticmethod
    def _compiled(value: object, memo: dict[Any, Any] | None = None) -> Any:
        return None  # pragma: no cover - generated by schema()

    @classmethod
    def _fast(cls) -> Callable[..., Any] | None:
        # Looked up by name on every call so that a test can switch a fast path off.
        return None if cls._FAST_NAME is None else globals()[cls._FAST_NAME]  # type: ignore[no-any-return]

    @classmethod
    def from_json(
        cls: type[_S], value: object, where: str | None = None, memo: dict[Any, Any] | None = None
    ) -> _S:
        """Validate ``value`` (or return it if it already is an instance).  ``memo`` (one dict
        per header) shares equal strings and rule references between entries, which keeps a
        100,000-tensor header small in memory."""
        if isinstance(value, cls):
            return value
        memo = {} if memo is None else memo
        fast = cls._fast()
        if fast is not None:
            got: _S | None = fast(value, memo) if cls._FAST_MEMO else fast(value)
            if got is not None:
                return got
        return cls._checked(value, cls.WHERE if where is None else where, memo, False)

    @classmethod
    def checked_from_json(
        cls: type[_S], value: object, where: str | None = None, memo: dict[Any, Any] | None = None
    ) -> _S:
        """The field-by-field validation that names the failing field (the fast decoder's
        fallback, and its reference in the tests)."""
        where = cls.WHERE if where is None else where
        return cls._checked(value, where, {} if memo is None else memo, True)

    @classmethod
    def _checked(
        cls: type[_S], value: object, where: str, memo: dict[Any, Any], strict: bool
    ) -> _S:
        if isinstance(value, cls):
            return value
        present = cls.OPTIONAL & set(value) if isinstance(value, Mapping) else frozenset()
        obj = _obj(value, where, cls.KEYS | present)
        for key, const in cls._CONSTS.items():
            if obj[key] != const:
                raise SchemaError(_join(where, key), f"expected {const!r}, got {obj[key]!r}")
        ctx = _Ctx(memo, strict or cls._FAST_NAME is not None)
        for fld in cls._ORDER:
            if fld.key in obj:
                ctx.done[fld.name] = fld.spec.check(obj[fld.key], _join(where, fld.key), ctx)
            else:
                ctx.done[fld.name] = None  # an omit_none field left out
        if cls._SHARED:
            shared: _S = memo.setdefault((cls, *ctx.done.values()), cls(**ctx.done))
            return shared
        return cls(**ctx.done)


def schema(
    where: str, *, fast: str | None = None, consts: Mapping[str, str] | None = None,
    shared: bool = False,
) -> Callable[[type[_S]], type[_S]]:  # fmt: skip
    """Make a frozen dataclass (fields declared with :func:`f`) a schema class.

    ``where`` is the default location in messages; ``fast`` the module global that holds the
    compiled decoder; ``consts`` keys whose value is fixed (a transform's ``op``, the index's
    ``format``); ``shared``: equal values share one instance per header (rule references)."""

    def make(cls: type[_S]) -> type[_S]:
        cls.WHERE = where
        cls._CONSTS = dict(consts or {})
        cls._SHARED = shared
        fields = tuple(
            _Field(d.name, d.metadata["key"] or d.name, d.metadata["spec"], d.metadata["omit_none"])
            for d in dataclasses.fields(cls)  # type: ignore[arg-type]
        )
        cls._FIELDS = fields
        # A field whose bound names another field is decoded after it.
        cls._ORDER = tuple(
            sorted(fields, key=lambda d: isinstance(getattr(d.spec, "hi", None), str))
        )
        cls.KEYS = frozenset(cls._CONSTS) | frozenset(d.key for d in fields if not d.omit_none)
        cls.OPTIONAL = frozenset(d.key for d in fields if d.omit_none)
        cls._FAST_MEMO = shared or any(d.spec.uses_memo for d in fields)
        _generate_encoders(cls)
        if fast is not None:
            cls._FAST_NAME = fast
            cls._compiled = _compile_decoder(cls)  # type: ignore[assignment]
            globals()[fast] = cls._compiled
        return cls

    return make


def _generate_encoders(cls: type[SchemaObject]) -> None:
    env: dict[str, Any] = {"_json_value": json_value, "_json_pairs": json_pairs}
    items = [f"{k!r}: {v!r}" for k, v in cls._CONSTS.items()]
    items += [
        f"{d.key!r}: {d.spec.encode('self.' + d.name)}" for d in cls._FIELDS if not d.omit_none
    ]
    enc = ["def to_json(self):", f"    out = {{{', '.join(items)}}}"]
    for d in cls._FIELDS:
        if d.omit_none:
            enc.append(f"    if self.{d.name} is not None:")
            enc.append(f"        out[{d.key!r}] = {d.spec.encode('self.' + d.name)}")
    enc.append("    return out")
    const = len(cls._CONSTS) + sum(1 for d in cls._FIELDS if not d.omit_none)
    terms: list[str] = []
    for d in cls._FIELDS:
        term = d.spec.pairs("self." + d.name)
        if d.omit_none:
            inner = "" if term == 0 else f" + {term}"
            terms.append(f"(0 if self.{d.name} is None else 1{inner})")
        elif isinstance(term, int):
            const += term
        else:
            terms.append(term)
    cls._PAIRS = None if terms else const
    pairs = ["def json_pairs(self):", f"    return {' + '.join([str(const), *terms])}"]
    exec("\n".join(enc) + "\n" + "\n".join(pairs), env)  # our own generated source
    env["to_json"].__qualname__ = f"{cls.__name__}.to_json"
    env["json_pairs"].__qualname__ = f"{cls.__name__}.json_pairs"
    env["to_json"].__doc__ = "The JSON form (plain values, generated from the field specs)."
    env["json_pairs"].__doc__ = SchemaObject.json_pairs.__doc__
    cls.to_json = env["to_json"]  # type: ignore[method-assign]
    cls.json_pairs = env["json_pairs"]  # type: ignore[method-assign]


def _compile_decoder(cls: type[SchemaObject]) -> Callable[..., Any]:
    """The fast decoder of ``cls``: Python source generated from the specs, compiled once."""
    g = _Gen()
    keys = g.name(cls.KEYS, "keys")
    g.emit(f"if type(value) is not dict or value.keys() != {keys}: return None")
    for key, const in cls._CONSTS.items():
        g.emit(f"if value[{key!r}] != {const!r}: return None")
    args = []
    for d in cls._FIELDS:
        if d.omit_none:
            # The key check above admits only dicts without the optional key: one that has it
            # takes the checked path.
            args.append("None")
            continue
        var = g.local()
        g.emit(f"{var} = value[{d.key!r}]")
        d.spec.fast(g, var)
        args.append(var)
    ctor = g.name(cls, "cls")
    if cls._SHARED:
        g.emit(f"key = ({ctor}, {', '.join(args)})")
        g.emit("got = memo.get(key)")
        g.emit(f"if got is None: got = memo[key] = {ctor}({', '.join(args)})")
        g.emit("return got")
    else:
        g.emit(f"return {ctor}({', '.join(args)})")
    params = "value, memo" if cls._FAST_MEMO else "value"
    source = f"def decode({params}):\n" + "\n".join(g.lines) + "\n"
    exec(source, g.env)  # our own generated source
    decode: Callable[..., Any] = g.env["decode"]
    decode.__qualname__ = f"{cls.__name__} fast decoder"
    decode.__doc__ = f"{cls.__name__}'s checks for a plain parsed dict, or ``None``.\n\n{source}"
    return decode


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
    got: Transform = _TRANSFORM.check(value, where, _Ctx({}, False))
    return got


@schema("rule", fast="_fast_rule", shared=True)
@dataclass(frozen=True, slots=True)
class RuleRef(SchemaObject):
    """The recipe rule that selected this tensor: its 0-based index, line, and pattern."""

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

_fast_tensor: Callable[[object, dict[Any, Any]], TensorEntry | None] = globals()["_fast_tensor"]
_fast_provenance: Callable[[object, dict[Any, Any]], Provenance | None] = globals()[
    "_fast_provenance"
]
_fast_source_tensor: Callable[[object], SourceTensor | None] = globals()["_fast_source_tensor"]
