"""Reading recipe YAML nodes with problem collection, shared by the recipe parsers.

Contract: :class:`NodeReader` reads typed values (text, integers, booleans, lists, shapes)
from :mod:`.yamlnodes` nodes and records one :class:`~.model.Problem` with the node's line for
each value of the wrong kind, returning None, so :mod:`.parse` and :mod:`.parse_rule` report
every problem of a recipe at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .model import Problem
from .yamlnodes import YNode

__all__ = ["NodeReader", "optional_key", "shape_value"]

T = TypeVar("T")


class NodeReader:
    """Typed reads of YAML nodes that record a :class:`~.model.Problem` (with its line) for
    every value of the wrong kind, instead of raising: a recipe's problems are all reported."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def err(self, line: int | None, message: str) -> None:
        self.problems.append(Problem(line, message))

    def keys(self, node: YNode, where: str, required: set[str], allowed: set[str]) -> bool:
        """Report missing and unknown keys of a mapping node; True when it is a mapping."""
        if not isinstance(node.value, dict):
            self.err(node.line, f"{where} must be a mapping, not a {node.kind}")
            return False
        for key in sorted(set(node.value) - allowed):
            self.err(
                node.value[key].line,
                f"{where}: unknown key {key!r} (allowed: " + ", ".join(sorted(allowed)) + ")",
            )
        for key in sorted(required - set(node.value)):
            self.err(node.line, f"{where}: missing required key {key!r}")
        return True

    def text(self, node: YNode, where: str) -> str | None:
        if not isinstance(node.value, str) or not node.value.strip():
            self.err(node.line, f"{where} must be a non-empty string, not {node.value!r}")
            return None
        return node.value

    def integer(self, node: YNode, where: str, minimum: int | None = None) -> int | None:
        v = node.value
        if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and v < minimum):
            bound = f" >= {minimum}" if minimum is not None else ""
            self.err(node.line, f"{where} must be an integer{bound}, not {v!r}")
            return None
        return v

    def boolean(self, node: YNode, where: str) -> bool | None:
        if not isinstance(node.value, bool):
            self.err(node.line, f"{where} must be true or false, not {node.value!r}")
            return None
        return node.value

    def text_list(self, node: YNode, where: str, *, single_ok: bool) -> tuple[str, ...] | None:
        if single_ok and isinstance(node.value, str):
            items = [node]
        elif isinstance(node.value, list) and node.value:
            items = node.value
        else:
            shape = (
                "a string or a non-empty list of strings"
                if single_ok
                else "a non-empty list of strings"
            )
            self.err(node.line, f"{where} must be {shape}")
            return None
        out: list[str] = []
        for item in items:
            t = self.text(item, f"{where} entry")
            if t is None:
                return None
            out.append(t)
        return tuple(out)

    def json_value(self, node: YNode, where: str) -> object:
        if isinstance(node.value, dict):
            return {k: self.json_value(v, where) for k, v in node.value.items()}
        if isinstance(node.value, list):
            return [self.json_value(v, where) for v in node.value]
        return node.value


def optional_key(node: dict[str, YNode], key: str, fn: Callable[[YNode], T | None]) -> T | None:
    """``fn`` of ``node[key]`` when the key is present, else None."""
    return fn(node[key]) if key in node else None


def shape_value(
    ctx: NodeReader, node: YNode, where: str, *, allow_minus_one: bool
) -> tuple[int, ...] | None:
    v = node.value
    ok = isinstance(v, list) and all(
        isinstance(d.value, int)
        and not isinstance(d.value, bool)
        and (d.value >= 0 or (allow_minus_one and d.value == -1))
        for d in v
    )
    if not ok:
        what = "non-negative integers or -1" if allow_minus_one else "non-negative integers"
        ctx.err(node.line, f"{where} must be a list of {what}")
        return None
    return tuple(int(d.value) for d in v)
