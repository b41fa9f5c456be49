"""Signals, kills and the output lock, with real `ninfer convert` processes (docs/cli.md,
"Signals, locking and stale staging folders").  Each process pauses at a named step
(NINFER_TEST_PAUSE_AT, ninfer_convert/_startup.py) and is signalled there; afterwards the test
looks at what is at the output and beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ninfer_convert import open_artifact
from ninfer_convert.container.renames import _renameat2
from ninfer_convert.convert import convert_checkpoint

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-qwen3.5"
QWEN_RECIPE = ROOT / "recipes" / "qwen3.6-27b.yaml"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir())


def _script(tmp_path: Path) -> Path:
    """A stand-in for the installed console script (same name, same two lines)."""
    script = tmp_path / "bin" / "ninfer"
    if not script.exists():
        script.parent.mkdir()
        script.write_text("import sys\nfrom ninfer_convert.cli import main\nsys.exit(main())\n")
    return script


def _env(pause_at: str | None, marker: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NINFER_TEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if pause_at is not None:
        env["NINFER_TEST_PAUSE_AT"] = pause_at
        env["NINFER_TEST_PAUSE_FILE"] = str(marker)
    env.update(extra)
    return env


def _args(tmp_path: Path, out: Path, *more: str) -> list[str]:
    return [sys.executable, str(_script(tmp_path)), "convert", str(EXAMPLE), "--recipe",
            str(QWEN_RECIPE), "--output", str(out), "--device", "cpu", "--json", *more]  # fmt: skip


def start(
    tmp_path: Path, out: Path, pause_at: str, *more: str, **env: str
) -> tuple[subprocess.Popen[str], Path]:
    marker = tmp_path / f"paused-{pause_at}"
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen(
        _args(tmp_path, out, *more),
        env=_env(pause_at, marker, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"never reached {pause_at!r}: rc={proc.returncode} {err}")
        time.sleep(0.01)
    return proc, marker


def run(tmp_path: Path, out: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _args(tmp_path, out, *more),
        env=_env(None, tmp_path / "unused"),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def old(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """An existing artifact at the output, different from what the runs write (alignment)."""
    out = tmp_path / "models" / "out"
    convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu", alignment=64)
    return out, tree(out)


def _new_files(tmp_path: Path) -> dict[str, bytes]:
    ref = tmp_path / "ref" / "out"
    convert_checkpoint(EXAMPLE, QWEN_RECIPE, ref, device="cpu")
    return tree(ref)


SLOW = pytest.mark.slow  # the rest of the matrix: about 1.5 s per process


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGTERM,
        pytest.param(signal.SIGHUP, marks=SLOW),
        pytest.param(signal.SIGINT, marks=SLOW),
    ],
)
def test_signal_while_writing_removes_staging_and_exits_128_plus_signal(
    tmp_path: Path, old: tuple[Path, dict[str, bytes]], sig: signal.Signals
) -> None:
    out, before = old
    proc, _ = start(tmp_path, out, "staging", "--force")
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig
    assert stderr == f"Interrupted ({sig.name}); nothing was written.\n"
    assert stdout == ""
    assert tree(out) == before
    assert siblings(out) == ["out"]  # no staging folder, no lock file


def test_sigterm_during_publish_lets_the_publish_finish_and_says_so(
    tmp_path: Path, old: tuple[Path, dict[str, bytes]]
) -> None:
    out, before = old
    proc, marker = start(tmp_path, out, "published", "--force")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    marker.unlink()  # let it go on: the signal waits until the publish is done
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert stderr == f"Interrupted (SIGTERM) after the new artifact was published at {out}.\n"
    assert tree(out) == _new_files(tmp_path) != before
    assert siblings(out) == ["out"]


# (pause point, exchange available, what is at the output after SIGKILL, what a later run says)
KILLS = [
    pytest.param("staging", True, "old", "removed", marks=SLOW),
    pytest.param("commit", True, "old", "removed", marks=SLOW),
    pytest.param("publish", True, "old", "removed", marks=SLOW),
    ("published", True, "new", "removed"),
    ("moved-aside", False, "none", "restored"),
    pytest.param("published", False, "new", "removed", marks=SLOW),
]


@pytest.mark.parametrize(("point", "exchange", "after_kill", "recovery"), KILLS)
def test_sigkill_at_each_step_keeps_an_artifact_and_the_next_run_recovers(
    tmp_path: Path,
    old: tuple[Path, dict[str, bytes]],
    point: str,
    exchange: bool,
    after_kill: str,
    recovery: str,
) -> None:
    if exchange and _renameat2() is None:
        pytest.skip("renameat2 is not reachable here")
    out, before = old
    new = _new_files(tmp_path)
    env = {} if exchange else {"NINFER_TEST_NO_EXCHANGE": "1"}
    proc, _ = start(tmp_path, out, point, "--force", **env)
    proc.kill()
    proc.communicate(timeout=60)
    if after_kill == "old":
        assert tree(out) == before
    elif after_kill == "new":
        assert tree(out) == new
        with open_artifact(out) as art:
            assert art.integrity_problems() == []
    else:
        assert not out.exists()
    stale = [n for n in siblings(out) if ".ninfer-staging-" in n]
    assert len(stale) == 1
    # The next run (with --force, as the user would rerun it) says what it did and finishes.
    done = run(tmp_path, out, "--force")
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(f"note: {recovery} ")
    assert stale[0] in notes[0]
    assert tree(out) == new
    assert siblings(out) == ["out"]


@SLOW
def test_restored_output_is_refused_without_force_after_recovery(
    tmp_path: Path, old: tuple[Path, dict[str, bytes]]
) -> None:
    out, before = old
    proc, _ = start(tmp_path, out, "moved-aside", "--force", NINFER_TEST_NO_EXCHANGE="1")
    proc.kill()
    proc.communicate(timeout=60)
    assert not out.exists()
    done = run(tmp_path, out)
    assert done.returncode == 2 and "already exists" in done.stderr
    assert "note: restored" in done.stderr
    assert tree(out) == before and siblings(out) == ["out"]


def test_second_convert_to_the_same_output_is_refused_naming_the_holder(
    tmp_path: Path, old: tuple[Path, dict[str, bytes]]
) -> None:
    out, before = old
    proc, _ = start(tmp_path, out, "staging", "--force")
    try:
        second = run(tmp_path, out, "--force")
        assert second.returncode == 7
        assert f"being written by another ninfer convert (pid {proc.pid})" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert tree(out) == before and siblings(out) == ["out"]


def test_ctrl_c_during_start_up_prints_no_traceback(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc, _ = start(tmp_path, out, "startup")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr == "Interrupted (SIGINT) while starting; nothing was written.\n"
    assert not out.exists()


@SLOW
def test_sigterm_during_start_up_of_python_dash_m(tmp_path: Path) -> None:
    marker = tmp_path / "paused"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ninfer_convert.cli", "formats"],
        env=_env("startup", marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for _ in range(6000):
        if marker.exists() or proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert stderr == "Interrupted (SIGTERM) while starting; nothing was written.\n"
