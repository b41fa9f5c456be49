"""Ray is optional: only ninfer_convert/cluster/_ray.py imports it (static, every import
statement, as tests/test_package_imports.py walks them), and without it ``--ray`` is a
UsageError naming the extra, raised before the source is read."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from cluster_fixtures import EXAMPLE, QWEN_RECIPE

import ninfer_convert
from ninfer_convert.cli import main
from ninfer_convert.cluster import RAY_EXTRA, RayCluster
from ninfer_convert.errors import UsageError

ROOT = Path(ninfer_convert.__file__).parent
ALLOWED = ROOT / "cluster" / "_ray.py"


def _ray_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                  if n == "ray" or n.startswith("ray.")]  # fmt: skip
    return found


def test_only_the_cluster_ray_module_imports_ray() -> None:
    assert _ray_imports(ALLOWED)  # the walk sees the imports it guards
    others = [hit for p in sorted(ROOT.rglob("*.py")) if p != ALLOWED for hit in _ray_imports(p)]
    assert others == []


def test_without_ray_a_cluster_is_a_usage_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(UsageError, match="needs the Ray package") as info:
        RayCluster("auto")
    assert f"ninfer-convert[{RAY_EXTRA}]" in (info.value.hint or "")
    assert info.value.exit_code == 2


@pytest.mark.parametrize("command", ["convert", "verify"])
def test_cli_ray_without_ray_exits_2_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "ray", None)
    out = tmp_path / "o"
    if command == "convert":
        args = ["convert", str(EXAMPLE), "--recipe", str(QWEN_RECIPE), "--output", str(out),
                "--max-shard-size", "1MB", "--ray"]  # fmt: skip
    else:
        args = ["verify", str(tmp_path / "missing"), "--ray", "auto"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"ninfer-convert[{RAY_EXTRA}]" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_cli_convert_ray_needs_max_shard_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dry_run: bool
) -> None:
    # A dry run answers "would this run?": it refuses what the run refuses.
    args = ["convert", str(EXAMPLE), "--recipe", str(QWEN_RECIPE), "--output",
            str(tmp_path / "o"), "--ray"] + (["--dry-run"] if dry_run else [])  # fmt: skip
    assert main(args) == 2
    assert "--max-shard-size" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
