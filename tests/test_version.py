"""The version is written once (ninfer_convert/_version.py) and imported from there."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ninfer_convert
from ninfer_convert import _version

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ninfer_convert"


def test_pyproject_reads_the_version_from_the_version_module() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "ninfer_convert._version.__version__"}
    assert ninfer_convert.__version__ == _version.__version__


def test_no_module_imports_the_version_from_the_package_root() -> None:
    # `from . import __version__` works only while __init__.py assigns it before the import
    # that reaches the module: the import order would be part of the contract.
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            if node.module in (None, "") and any(a.name == "__version__" for a in node.names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
