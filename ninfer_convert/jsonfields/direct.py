"""The direct reader: a whole document parsed straight into schema objects by the C module.

Contract: :func:`decode` returns the typed value of ``raw`` (UTF-8 JSON bytes, already checked
to be valid UTF-8) for a schema class, building the instances while the text is parsed (no
intermediate dicts), or ``None``.  ``None`` is "declined", never "invalid": the caller then runs
the reference reader (``json.loads`` and ``from_json``; container/typed_json.py), which gives
the same typed value or refuses the document with its own message, in its documented order.
The C side (``_jsonfast.decode``, ninfer_convert/_jsondecode.c) declines everything it cannot
decide exactly as the reference does, and everything the reference refuses, so accepting is
the only answer it must get right (tests/test_direct_reader.py holds it to the reference).

The plan is the field specs translated once per class into nested tuples that the C side
interprets; a spec kind it does not know makes :func:`plan_of` raise ``TypeError`` (a test
plans every document class).  :data:`ENABLED` switches the reader off (tests).
"""

from __future__ import annotations

import re
import struct
from typing import Any

from ..jsonlimits import MAX_JSON_DEPTH
from ..native import optional_module
from .objects import SchemaObject, _maker
from .specs import Bool, Int, Json, Obj, OneOf, Opt, Seq, Spec, Str, StrMap

__all__ = ["ENABLED", "decode", "plan_of"]

_native = optional_module("_jsonfast")
ENABLED = _native is not None
"""Whether :func:`decode` tries the C reader (off without the C module, or in a test)."""

# Node kinds, as _jsondecode.c numbers them.
_STR, _INT, _BOOL, _OPT, _SEQ, _MAP, _JSON, _OBJ = range(8)
_MAX_KEYS = 64
_HEX = re.compile(r"\[0-9a-f\]\{([1-9][0-9]*)\}")

_plans: dict[tuple[type[SchemaObject], ...], tuple[Any, ...]] = {}


def decode(cls: type[SchemaObject], raw: bytes, limit: int) -> Any:
    """``cls``'s value of ``raw`` when the C reader accepts it, else ``None``; ``limit`` is the
    bracket nesting bound of the document (the reference's nesting scan)."""
    if not ENABLED or _native is None:
        return None
    return _native.decode(raw, plan_of(cls), {}, limit, MAX_JSON_DEPTH)


def plan_of(cls: type[SchemaObject]) -> tuple[Any, ...]:
    """The C reader's plan for documents of ``cls`` (made once per class)."""
    return _object((cls,))


def _spec(spec: Spec) -> tuple[Any, ...]:
    if isinstance(spec, Str):
        return _str(spec)
    if isinstance(spec, Int):
        # A bound naming another field is the object's (its variant's ``bounds``).
        hi = spec.hi if isinstance(spec.hi, int) else (1 << 63) - 1
        return (_INT, spec.lo, hi, struct.pack("=qq", spec.lo, hi))
    if isinstance(spec, Bool):
        return (_BOOL,)
    if isinstance(spec, Opt):
        return (_OPT, _spec(spec.inner))
    if isinstance(spec, Seq):
        return (_SEQ, _spec(spec.inner))
    if isinstance(spec, StrMap):
        return (_MAP, _spec(spec.inner))
    if isinstance(spec, Json):
        return (_JSON,)
    if isinstance(spec, Obj):
        return _object((spec.cls,))
    if isinstance(spec, OneOf):
        return _object(spec.classes)
    raise TypeError(f"the direct reader has no plan for {type(spec).__name__}")


def _str(spec: Str) -> tuple[Any, ...]:
    hexlen, match = 0, None
    if spec.pattern is not None:
        hexes = _HEX.fullmatch(spec.pattern.pattern)
        if hexes is not None and spec.pattern.flags == re.UNICODE:
            hexlen = int(hexes.group(1))  # checked in C: that many of 0-9a-f
        else:
            match = spec.pattern.fullmatch
    return (_STR, int(spec.nonempty), int(spec.intern), hexlen, match)


def _object(classes: tuple[type[SchemaObject], ...]) -> tuple[Any, ...]:
    """An object that is one of ``classes`` (told apart by their constants): the union of
    their keys, each with one spec, and a variant per class."""
    got = _plans.get(classes)
    if got is not None:
        return got
    keys: list[str] = []
    specs: list[tuple[Any, ...]] = []

    def index(key: str, node: tuple[Any, ...]) -> int:
        if key in keys:
            i = keys.index(key)
            if specs[i] != node:
                raise TypeError(f"key {key!r} has two specs in {[c.__name__ for c in classes]}")
            return i
        keys.append(key)
        specs.append(node)
        return len(keys) - 1

    variants = []
    for cls in classes:
        if len(classes) > 1 and not cls._CONSTS:
            raise TypeError(f"{cls.__name__}: a variant needs a constant to be told apart")
        consts = tuple((index(k, (_STR, 0, 0, 0, None)), v) for k, v in cls._CONSTS.items())
        fields = [(d, index(d.key, _spec(d.spec))) for d in cls._FIELDS]
        allowed = required = 0
        for i, _ in consts:
            allowed |= 1 << i
            required |= 1 << i
        for d, i in fields:
            allowed |= 1 << i
            required |= 0 if d.omit_none else 1 << i
        by_name = {d.name: i for d, i in fields}
        bounds = tuple(
            (i, by_name[d.spec.hi])
            for d, i in fields
            if isinstance(d.spec, Int) and isinstance(d.spec.hi, str)
        )
        if cls._SHARED and bounds:
            raise TypeError(f"{cls.__name__}: a shared class with a relative bound")
        args = tuple((i, d.default) for d, i in fields)
        check = cls._CHECK
        flags = struct.pack("=QQQ", int(cls._SHARED), allowed, required)  # read as C words
        variants.append(
            (_builder(cls), cls, int(cls._SHARED), check, consts, args, allowed, required, bounds,
             flags)
        )  # fmt: skip
    if len(keys) > _MAX_KEYS:
        raise TypeError(f"{[c.__name__ for c in classes]}: over {_MAX_KEYS} keys")
    plan = (_OBJ, tuple(k.encode("utf-8") for k in keys), tuple(specs), tuple(variants))
    _plans[classes] = plan
    return plan


def _builder(cls: type[SchemaObject]) -> Any:
    """What makes an instance from its JSON fields' values, in field order: the compiled
    decoders' slot filler, or the class's ``__init__`` by keyword (as the checked path calls
    it, so a field that is not JSON takes its default)."""
    maker = _maker(cls)
    if maker is not cls:
        return maker
    names = tuple(d.name for d in cls._FIELDS)

    def build(*values: Any) -> Any:
        return cls(**dict(zip(names, values, strict=True)))

    return build
