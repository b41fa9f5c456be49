"""Fast constructors of frozen dataclasses, for the objects built once per tensor.

Contract: :func:`instance_maker` returns a callable that takes a dataclass's fields
positionally, in declaration order, and returns an instance equal to (and indistinguishable
from) ``cls(*values)``: every field holding the very object passed, nothing else set.  It is
the C module's slot filler for a slotted class, its ``__dict__`` filler for a plain one, and
the class itself when neither applies (no C module, an ``__init__`` that does more than store
its fields: a ``__post_init__``, a custom ``__init__``, an ``InitVar``).  A frozen
``__init__`` stores each field with ``object.__setattr__`` (about 1 us for six fields); the
fillers skip that.  Each filler is checked once, when it is made, against ``__init__`` with
sentinel values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..native import optional_module

__all__ = ["instance_maker"]

_native = optional_module("_jsonfast")


def instance_maker(cls: type[Any]) -> Callable[..., Any]:
    """A positional constructor of the dataclass ``cls`` (see the module contract)."""
    if _native is None or not dataclasses.is_dataclass(cls):
        return cls
    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields)
    if (
        any(not f.init for f in fields)
        or hasattr(cls, "__post_init__")
        or "__init__" not in cls.__dict__
        or any(isinstance(v, dataclasses.InitVar) for v in cls.__annotations__.values())
    ):
        return cls
    slots = cls.__dict__.get("__slots__")
    try:
        if slots is not None:
            if tuple(slots) != names or "__dict__" in dir(cls):
                return cls
            maker: Callable[..., Any] = _native.slot_maker(cls, names)
        else:
            maker = _native.dict_maker(cls, names)
        probe = tuple(object() for _ in names)
        via_init, via_maker = cls(*probe), maker(*probe)
    except TypeError:
        return cls
    if slots is None and vars(via_maker) != vars(via_init):
        return cls
    for name, value in zip(names, probe, strict=True):
        if getattr(via_init, name) is not value or getattr(via_maker, name) is not value:
            return cls
    return maker
