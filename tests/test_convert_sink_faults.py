"""Faults in the convert's sink (a ``pwrite`` into the reserved bytes, from worker threads):
short writes are continued, a write that makes no progress and a full disk are typed errors
(exit 7) that name the tensor, and neither leaves anything that looks finished."""

from __future__ import annotations

import errno
import os
import re
import threading
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


@pytest.mark.parametrize("jobs", [1, 2])
def test_full_disk_at_a_later_reservation_while_workers_write_is_exit_7(
    tmp_path: Path,
    setup: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    jobs: int,
) -> None:
    # The writer aborts itself inside reserve (the space comes back at once) while earlier
    # reservations may still be filled by workers through their own descriptors.
    src, recipe = setup
    out = tmp_path / "out"
    real = os.posix_fallocate
    calls = 0

    def fallocate(fd: int, offset: int, length: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, offset, length)

    monkeypatch.setattr(writer_module.os, "posix_fallocate", fallocate)
    code = main(["convert", str(src), "--recipe", str(recipe), "--output", str(out),
                 "--jobs", str(jobs)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 7, err
    assert "Traceback" not in err
    assert calls == 3
    assert _no_staging(tmp_path) == []


def test_abort_while_a_worker_writes_never_lets_its_bytes_reach_another_file(
    tmp_path: Path, setup: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer aborts itself inside reserve (a full disk) while a worker is inside its
    # sink's pwrite.  Closing the sink's descriptor then would let the kernel give its number
    # to the next file opened, and the worker's pwrite would land in that file.
    src, recipe = setup
    real_fallocate = os.posix_fallocate
    real_abort = writer_module.ArtifactWriter.abort
    in_pwrite = threading.Event()
    aborted = threading.Event()
    victims: list[Path] = []
    falloc = 0

    def fallocate(fd: int, offset: int, length: int) -> None:
        nonlocal falloc
        falloc += 1
        if falloc == 3:
            assert in_pwrite.wait(30)  # a worker holds the first tensor's descriptor
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fallocate(fd, offset, length)

    def abort(self: writer_module.ArtifactWriter) -> None:
        real_abort(self)
        if not aborted.is_set():
            for i in range(8):  # files opened right after: they get the lowest free numbers
                victim = tmp_path / f"victim-{i}"
                victim.write_bytes(b"")
                victims.append(victim)
                fd = os.open(victim, os.O_RDWR)
                victims_fds.append(fd)
            aborted.set()

    victims_fds: list[int] = []
    first = threading.Lock()
    held = [False]

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if not threading.current_thread().name.startswith("ninfer-encode"):
            return _REAL_PWRITE(fd, data, offset)  # the writer's own writes
        with first:
            mine = not held[0]
            held[0] = True
        if mine:
            in_pwrite.set()
            assert aborted.wait(30)
        return _REAL_PWRITE(fd, data, offset)

    monkeypatch.setattr(writer_module.os, "posix_fallocate", fallocate)
    monkeypatch.setattr(writer_module.os, "pwrite", pwrite)
    monkeypatch.setattr(writer_module.ArtifactWriter, "abort", abort)
    try:
        with pytest.raises(ResourceError):
            convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", jobs=2)
    finally:
        for fd in victims_fds:
            os.close(fd)
    assert aborted.is_set()
    assert [v.stat().st_size for v in victims] == [0] * len(victims)
    assert _no_staging(tmp_path) == [v.name for v in victims]
