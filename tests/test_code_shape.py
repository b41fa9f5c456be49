"""Issue 13's shape rules for the package: no module over 500 lines, no function over 80 lines
unless the line above its ``def`` (or its first decorator) is a ``# long:`` comment saying why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ninfer_convert"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MODULES = sorted(PACKAGE.rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
        if length <= MAX_FUNCTION_LINES:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        above = lines[first - 2].strip() if first >= 2 else ""
        if not above.startswith("# long:"):
            found.append(f"{node.name} ({length} lines, line {node.lineno})")
    return found


def test_the_package_has_modules_to_check() -> None:
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_at_most_500_lines(path: Path) -> None:
    count = len(path.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_MODULE_LINES, (
        f"{path.relative_to(PACKAGE)} has {count} lines; split it by job"
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_functions_are_at_most_80_lines_or_say_why(path: Path) -> None:
    assert _long_functions(path) == [], (
        f"{path.relative_to(PACKAGE)}: split these, or put a '# long: <reason>' comment above them"
    )
