"""The encoder package's modules import each other without a cycle (issue 13, point 7:
``staging`` and ``torch_backend`` used to import each other), counting every import: top
level, inside functions and under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

import ninfer_convert.encoder as encoder_package

PACKAGE = Path(encoder_package.__file__).parent


def _imports(path: Path) -> set[str]:
    """Sibling modules of the encoder package that ``path`` imports."""
    siblings = {p.stem for p in PACKAGE.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module is None:  # from . import x
                found.update(a.name for a in node.names if a.name in siblings)
            elif node.level == 1 and node.module is not None:
                found.add(node.module.split(".")[0])
            elif node.level == 0 and (node.module or "").startswith("ninfer_convert.encoder."):
                found.add((node.module or "").split(".")[2])
    return found & siblings


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_encoder_modules_import_each_other_without_a_cycle() -> None:
    graph = {p.stem: _imports(p) - {p.stem} for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert "torch_backend" in graph["staging"] or "staging" in graph["torch_backend"]  # linked
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
