"""YAML to line-annotated values, strictly: no duplicate keys, no aliases, no merge keys.

Contract: :func:`load_nodes` parses one YAML document into :class:`YNode` values whose
``value`` is a ``dict[str, YNode]``, a ``list[YNode]`` or a plain scalar (str, int, float, bool,
None), and whose ``line`` is the 1-based line where the node starts.  It returns the tree with
every problem it could recover from (duplicate mapping keys: the first value is kept; non-string
keys, merge keys (``<<``), tags other than the core ones, dates, and strings holding a lone
UTF-16 surrogate (a ``"\\ud800"`` escape): the entry is dropped).
Syntax errors, aliases and multiple documents cannot be recovered from and raise
:class:`YamlProblem`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

__all__ = ["Scalar", "YNode", "YamlProblem", "load_nodes"]

Scalar = str | int | float | bool | None

_CORE_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}


class YamlProblem(Exception):
    """A YAML-level problem at a 1-based line (``None`` when the position is unknown)."""

    def __init__(self, line: int | None, message: str) -> None:
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line else message)


@dataclass(frozen=True, eq=False)
class YNode:
    value: Any
    """``dict[str, YNode]``, ``list[YNode]`` or a scalar."""
    line: int

    @property
    def kind(self) -> str:
        if isinstance(self.value, dict):
            return "mapping"
        if isinstance(self.value, list):
            return "list"
        return "scalar"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (and so anchors' reuse) while composing."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise YamlProblem(event.start_mark.line + 1, "YAML aliases (*name) are not allowed")
        return super().compose_node(parent, index)


def load_nodes(text: str) -> tuple[YNode, list[YamlProblem]]:
    """Parse ``text`` (one document) into line-annotated nodes plus recoverable problems."""
    problems: list[YamlProblem] = []
    try:
        loader = _StrictLoader(text)  # the reader checks characters here
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise YamlProblem(line, f"YAML: character {exc.character!r} is not allowed") from exc
    try:
        try:
            root = loader.get_single_node()
        except yaml.reader.ReaderError as exc:
            line = text.count("\n", 0, exc.position) + 1
            raise YamlProblem(line, f"YAML: character {exc.character!r} is not allowed") from exc
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = mark.line + 1 if mark is not None else None
            raise YamlProblem(where, f"YAML syntax: {exc.problem or exc}") from exc
        except yaml.YAMLError as exc:
            raise YamlProblem(None, f"YAML: {exc}") from exc
        if root is None:
            raise YamlProblem(1, "the recipe is empty")
        node = _convert(loader, root, problems)
        if node is None:
            raise problems.pop()
        return node, problems
    finally:
        loader.dispose()


def _convert(loader: _StrictLoader, node: yaml.Node, problems: list[YamlProblem]) -> YNode | None:
    """Convert one node; ``None`` (with a problem recorded) drops it."""
    line = node.start_mark.line + 1
    if node.tag not in _CORE_TAGS:
        problems.append(YamlProblem(line, f"YAML tag {node.tag!r} is not allowed"))
        return None
    if isinstance(node, yaml.MappingNode):
        out: dict[str, YNode] = {}
        for key_node, value_node in node.value:
            kline = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                problems.append(YamlProblem(kline, "YAML merge keys (<<) are not allowed"))
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                problems.append(YamlProblem(kline, "mapping keys must be plain strings"))
                continue
            key = key_node.value
            if _lone_surrogate(key):
                problems.append(YamlProblem(kline, f"mapping key {key!a} {_SURROGATE}"))
                continue
            if key in out:
                problems.append(
                    YamlProblem(kline, f"duplicate key {key!r} (first at line {out[key].line})")
                )
                continue
            value = _convert(loader, value_node, problems)
            if value is not None:
                out[key] = value
        return YNode(out, line)
    if isinstance(node, yaml.SequenceNode):
        items = [_convert(loader, item, problems) for item in node.value]
        return YNode([i for i in items if i is not None], line)
    try:
        scalar = loader.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        problems.append(YamlProblem(line, f"invalid YAML value {node.value!r}: {exc}"))
        return None
    if not isinstance(scalar, (str, int, float, bool)) and scalar is not None:
        problems.append(YamlProblem(line, f"unsupported YAML value {node.value!r}"))
        return None
    if isinstance(scalar, str) and _lone_surrogate(scalar):
        problems.append(YamlProblem(line, f"the string {scalar!a} {_SURROGATE}"))
        return None
    return YNode(scalar, line)


_SURROGATE = "holds a lone UTF-16 surrogate (a \\u escape that is not a character)"


def _lone_surrogate(text: str) -> bool:
    # A double-quoted "\ud800" gives a string no UTF-8 encoder can write (or print).
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
