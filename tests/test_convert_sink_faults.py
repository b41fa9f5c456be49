"""Faults in the convert's sink (a ``pwrite`` into the reserved bytes, from worker threads):
short writes are continued, a write that makes no progress and a full disk are typed errors
(exit 7) that name the tensor, and neither leaves anything that looks finished."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
from test_convert_sink import RECIPE, _checkpoint, _files

from ninfer_convert.cli import main
from ninfer_convert.container import writer as writer_module
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import ResourceError

_REAL_PWRITE = os.pwrite


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    _checkpoint(src)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    return src, recipe


def _no_staging(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name not in ("src", "recipe.yaml"))


@pytest.mark.parametrize("jobs", [1, 2])
def test_short_pwrites_are_continued(
    tmp_path: Path, setup: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    src, recipe = setup
    convert_checkpoint(src, recipe, tmp_path / "normal", device="cpu", jobs=jobs)
    calls = []

    def short(fd: int, data: memoryview, offset: int) -> int:
        calls.append(len(data))
        return _REAL_PWRITE(fd, data[:4093], offset)  # an odd size: never block-aligned

    monkeypatch.setattr(writer_module.os, "pwrite", short)
    convert_checkpoint(src, recipe, tmp_path / "short", device="cpu", jobs=jobs)
    assert any(n > 4093 for n in calls)
    assert _files(tmp_path / "short") == _files(tmp_path / "normal")


def test_pwrite_without_progress_is_an_error_not_a_hang(
    tmp_path: Path, setup: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, recipe = setup
    calls = 0

    def stuck(fd: int, data: memoryview, offset: int) -> int:
        nonlocal calls
        calls += 1
        if calls > 10_000:  # the sink loops: stop it so the test fails instead of hanging
            raise RuntimeError("the sink retried a zero-byte pwrite 10,000 times")
        return 0

    monkeypatch.setattr(writer_module.os, "pwrite", stuck)
    with pytest.raises(ResourceError, match=r"writing tensor '(copy|half|q|q16)\.weight'"):
        convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", jobs=2)
    assert calls < 100
    assert _no_staging(tmp_path) == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_full_disk_in_the_sink_is_exit_7_naming_the_tensor(
    tmp_path: Path,
    setup: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    jobs: int,
) -> None:
    src, recipe = setup
    out = tmp_path / "out"

    calls = 0

    def full(fd: int, data: memoryview, offset: int) -> int:
        nonlocal calls
        calls += 1
        if calls > 2:  # the disk fills while the third tensor's bytes are stored
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _REAL_PWRITE(fd, data, offset)

    monkeypatch.setattr(writer_module.os, "pwrite", full)
    code = main(["convert", str(src), "--recipe", str(recipe), "--output", str(out),
                 "--jobs", str(jobs)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 7, err
    assert "Traceback" not in err
    assert re.search(r"writing tensor '(copy|half|q|q16)\.weight'", err), err
    assert _no_staging(tmp_path) == []
