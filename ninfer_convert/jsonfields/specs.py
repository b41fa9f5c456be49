"""Field specs: what one JSON value of a schema class's field is, and everything done with it.

Contract: a :class:`Spec` is immutable once made and gives, for one JSON value,

* ``check(value, where, ctx)``: the checked decoder; validates ``value`` (raising
  :class:`~ninfer_convert.errors.SchemaError` at ``where``) and returns the Python value;
* ``fast(src, var)``: lines of the compiled decoder (a :class:`DecoderSource`) that validate
  the local ``var`` in place, without error paths, and ``return None`` on any doubt; it must
  accept exactly what ``check`` accepts and build the same value;
* ``encode(expr)``: a Python expression turning the field value ``expr`` into plain JSON;
* ``pairs(expr)``: the object members of that JSON, an ``int`` when constant, else source.

The specs: :class:`Str`, :class:`Bool`, :class:`Int`, :class:`Opt` (``null`` or the inner),
:class:`Seq` (an array, as a tuple), :class:`StrMap` (an object with free keys, as a dict),
:class:`Json` (free-form, an object or ``null``), :class:`Obj` (a nested schema class) and
:class:`OneOf` (one of several schema classes told apart by a constant tag key).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import SchemaError
from .values import (
    MAX_INT,
    check_int,
    check_list,
    check_str,
    json_value,
    kind_of,
)

__all__ = [
    "Bool",
    "CheckContext",
    "DecoderSource",
    "Int",
    "Json",
    "Obj",
    "OneOf",
    "Opt",
    "Seq",
    "Spec",
    "Str",
    "StrMap",
]


class DecoderSource:
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

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        raise NotImplementedError

    def fast(self, g: DecoderSource, var: str) -> None:
        raise NotImplementedError

    def encode(self, expr: str) -> str:
        return expr

    def pairs(self, expr: str) -> int | str:
        return 0


@dataclass
class CheckContext:
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

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        text = check_str(value, where, nonempty=self.nonempty)
        if self.pattern is not None and not self.pattern.fullmatch(text):
            assert self.mismatch is not None
            raise SchemaError(where, self.mismatch(text))
        return ctx.memo.setdefault(text, text) if self.intern else text

    def fast(self, g: DecoderSource, var: str) -> None:
        g.emit(f"if type({var}) is not str: return None")
        if self.nonempty:
            g.emit(f"if not {var}: return None")
        if self.pattern is not None:
            g.emit(f"if {g.name(self.pattern.fullmatch, 're')}({var}) is None: return None")
        if self.intern:
            g.emit(f"{var} = memo.setdefault({var}, {var})")


class Bool(Spec):
    """``true`` or ``false``."""

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        if not isinstance(value, bool):
            raise SchemaError(where, f"expected a boolean, got {kind_of(value)}")
        return value

    def fast(self, g: DecoderSource, var: str) -> None:
        g.emit(f"if type({var}) is not bool: return None")


class Int(Spec):
    """An integer in ``[lo, hi]``; ``hi`` may name a field decoded before (its value)."""

    def __init__(self, lo: int = 0, hi: int | str = MAX_INT) -> None:
        self.lo, self.hi = lo, hi

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        hi = ctx.done[self.hi] if isinstance(self.hi, str) else self.hi
        return check_int(value, where, self.lo, hi)

    def fast(self, g: DecoderSource, var: str) -> None:
        assert isinstance(self.hi, int), "a field-relative bound has no fast path"
        g.emit(f"if type({var}) is not int or not {self.lo} <= {var} <= {self.hi}: return None")


class Opt(Spec):
    """``null`` or the inner spec."""

    def __init__(self, inner: Spec) -> None:
        self.inner = inner
        self.uses_memo = inner.uses_memo

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        return None if value is None else self.inner.check(value, where, ctx)

    def fast(self, g: DecoderSource, var: str) -> None:
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

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        items = check_list(value, where)
        if isinstance(self.inner, (Obj, OneOf)):
            return self.inner.check_many(items, where, ctx)
        return tuple(self.inner.check(v, f"{where}[{i}]", ctx) for i, v in enumerate(items))

    def fast(self, g: DecoderSource, var: str) -> None:
        inner = self.inner
        item = g.local()
        if isinstance(inner, Int) and isinstance(inner.hi, int):
            # fast_ints inline (a call per shape was a measurable part of an entry's cost).
            g.emit(f"if type({var}) is not list and type({var}) is not tuple: return None")
            g.emit(f"for {item} in {var}:")
            g.emit(
                f"    if type({item}) is not int or not {inner.lo} <= {item} <= {inner.hi}: "
                "return None"
            )
            g.emit(f"{var} = tuple({var})")
            return
        acc = g.local()
        g.emit(f"if type({var}) is not list: return None")
        g.emit(f"if not {var}: {var} = ()")  # most lists of a header entry are empty
        g.emit("else:")
        g.depth += 1
        g.emit(f"{acc} = []")
        g.emit(f"for {item} in {var}:")
        g.depth += 1
        inner.fast(g, item)
        g.emit(f"{acc}.append({item})")
        g.depth -= 1
        g.emit(f"{var} = tuple({acc})")
        g.depth -= 1

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

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        if not isinstance(value, Mapping):
            raise SchemaError(where, f"expected an object, got {kind_of(value)}")
        for k in value:
            if type(k) is not str:
                check_str(k, where)
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

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        if value is not None and not isinstance(value, Mapping):
            raise SchemaError(where, f"expected an object or null, got {kind_of(value)}")
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

    def _fast_fn(self, ctx: CheckContext) -> Callable[..., Any] | None:
        return None if ctx.strict else self.cls._fast()

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        return self.cls._checked(value, where, ctx.memo, ctx.strict)

    def check_many(self, items: Sequence[Any], where: str, ctx: CheckContext) -> tuple[Any, ...]:
        # Header.tensors: each element tries the fast decoder first (unless strict).
        fast, cls, memo = self._fast_fn(ctx), self.cls, ctx.memo
        out = []
        for i, v in enumerate(items):
            got = None if fast is None else (fast(v, memo) if cls._FAST_MEMO else fast(v))
            out.append(
                got if got is not None else cls._checked(v, f"{where}[{i}]", memo, ctx.strict)
            )
        return tuple(out)

    def check_map(self, items: Mapping[str, Any], where: str, ctx: CheckContext) -> dict[str, Any]:
        # One entry per source tensor (100,000 in a large MoE): the paths for the error
        # messages are built only for an entry that fails.
        fast, cls, memo = self._fast_fn(ctx), self.cls, ctx.memo
        out: dict[str, Any] = {}
        for k, v in items.items():
            got = None if fast is None else (fast(v, memo) if cls._FAST_MEMO else fast(v))
            out[k] = got if got is not None else cls._checked(v, f"{where}.{k}", memo, ctx.strict)
        return out

    def fast(self, g: DecoderSource, var: str) -> None:
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

    def check(self, value: Any, where: str, ctx: CheckContext) -> Any:
        if isinstance(value, self.classes):
            return value
        if not isinstance(value, Mapping):
            raise SchemaError(where, f"expected an object, got {kind_of(value)}")
        tag = value.get(self.tag)
        cls = self.by_tag.get(tag) if isinstance(tag, str) else None
        if cls is None:
            allowed = ", ".join(self.by_tag)
            raise SchemaError(
                f"{where}.{self.tag}", f"unknown {self.what} {self.tag} {tag!r}; allowed: {allowed}"
            )
        return cls._checked(value, where, ctx.memo, ctx.strict)

    def check_many(self, items: Sequence[Any], where: str, ctx: CheckContext) -> tuple[Any, ...]:
        return tuple(self.check(v, f"{where}[{i}]", ctx) for i, v in enumerate(items))

    def fast(self, g: DecoderSource, var: str) -> None:
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
