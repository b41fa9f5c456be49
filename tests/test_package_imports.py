"""The package's import graph has the target shape of issue 13: ``convert`` and ``verify`` are two
drivers over ``derive`` that never import each other, ``derive`` imports neither, ``inspect``
reads through ``container`` only, and no two modules import each other (directly or round a
longer loop).  Static: every import statement counts, top level, inside functions and under
``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

import ninfer_convert

ROOT = Path(ninfer_convert.__file__).parent
PACKAGE = ROOT.name


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that ``path`` (module ``name``) imports: ``from pkg import sub``
    counts as importing the submodule ``pkg.sub`` when there is one, else ``pkg``."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _offending(importers: str, imported: str) -> list[str]:
    return sorted(
        f"{m} imports {t}"
        for m, targets in GRAPH.items()
        if _under(m, f"{PACKAGE}.{importers}")
        for t in targets
        if _under(t, f"{PACKAGE}.{imported}")
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_graph_sees_the_imports_it_guards() -> None:
    # The walk resolves relative imports: verify does use derive, convert's tensor loop does use
    # scheduler.
    assert f"{PACKAGE}.derive.entry" in GRAPH[f"{PACKAGE}.verify.tensor_checks"]
    assert f"{PACKAGE}.scheduler" in GRAPH[f"{PACKAGE}.convert_tensors"]
    assert f"{PACKAGE}.container" in GRAPH[f"{PACKAGE}.inspect"]


def test_verify_never_imports_convert() -> None:
    assert _offending("verify", "convert") == []


def test_convert_never_imports_verify() -> None:
    assert _offending("convert", "verify") == []


def test_derive_imports_neither_driver() -> None:
    assert _offending("derive", "convert") + _offending("derive", "verify") == []


def test_inspect_reads_through_container_and_not_verify() -> None:
    assert _offending("inspect", "verify") + _offending("inspect", "convert") == []


def test_no_import_cycle_in_the_package() -> None:
    assert _cycles(GRAPH) == []


def test_cycle_finder_finds_cycles_and_only_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
