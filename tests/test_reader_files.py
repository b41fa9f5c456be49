"""The reading side's file rules (docs/container.md sections 5 and 9): one directory snapshot,
regular files only, no symbolic links, no FIFOs or devices, bounded reads, shard identity,
stray container files, bounded JSON nesting, and exact I32 values.

The FIFO and symlink cases run in a subprocess with a timeout: on the old reader they block
forever (a FIFO opened for reading waits for a writer; /dev/zero never ends), and a hang must
fail the test, not the test run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from artifact_fixtures import META, make_logical, provenance, rewrite_header, write_small

from ninfer_convert.container import ArtifactWriter, open_artifact
from ninfer_convert.container.wire import INDEX_NAME, SINGLE_NAME
from ninfer_convert.dequant import dequantize_logical
from ninfer_convert.errors import ArtifactError, IntegrityError, UsageError
from ninfer_convert.logical import DirectWords

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["BF16", "Q4G64_F16S", "FP32"]
CONFIG = b'{"model_type": "tiny"}'

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")

# Runs each case in a fresh interpreter: the library's open + integrity, then the real CLI
# (verify --no-source --json, inspect --json); prints one JSON line per case.
_PROBE = r"""
import contextlib, io, json, sys
from ninfer_convert.cli import main
from ninfer_convert.container import open_artifact
from ninfer_convert.errors import NinferError
out = []
for path in sys.argv[1:]:
    case = {"path": path}
    try:
        with open_artifact(path) as art:
            case["open"] = "ok"
            case["integrity"] = [type(p).__name__ + ": " + str(p) for p in art.integrity_problems()]
    except NinferError as exc:
        case["open"] = type(exc).__name__ + ": " + str(exc)
    for cmd in (["verify", "--no-source", "--json", "-q"], ["inspect", "--json"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            code = main(cmd[:1] + [path] + cmd[1:])
        case[cmd[0]] = code
        rep = json.loads(buf.getvalue()) if buf.getvalue().startswith("{") else {}
        if cmd[0] == "verify" and rep.get("kind") == "ninfer-verify-report":
            case["verify_findings"] = [f["message"] for f in rep["checks"][0]["findings"]] + [
                f["message"] for f in rep["checks"][1]["findings"]]
    out.append(case)
print(json.dumps(out))
"""


def _probe(*paths: Path, timeout: float = 60) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, *map(str, paths)],
            capture_output=True, text=True, timeout=timeout, env=env, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {[p.name for p in paths]} hung for {timeout} s")
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _art(root: Path, name: str, **kw: Any) -> Path:
    return write_small(
        root / name, SMALL, side_files={"config.json": CONFIG}, tmp_src=root, **kw
    )


# ---------------------------------------------------------------------------------------------
# FIFOs, devices and symbolic links never hang and are typed errors


def test_fifos_devices_and_links_are_refused_without_hanging(tmp_path: Path) -> None:
    cases: dict[str, Path] = {}

    def case(label: str, **kw: Any) -> Path:
        d = _art(tmp_path, label, **kw)
        cases[label] = d
        return d

    d = case("container-fifo")
    (d / SINGLE_NAME).unlink()
    os.mkfifo(d / SINGLE_NAME)
    d = case("container-to-dev-zero")
    (d / SINGLE_NAME).unlink()
    os.symlink("/dev/zero", d / SINGLE_NAME)
    d = case("index-fifo", max_shard_size=200)
    (d / INDEX_NAME).unlink()
    os.mkfifo(d / INDEX_NAME)
    d = case("side-fifo")
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    d = case("side-to-dev-zero")
    (d / "config.json").unlink()
    os.symlink("/dev/zero", d / "config.json")
    # A link to a file with exactly the recorded bytes: still refused (links are never
    # followed, so nothing outside the directory is ever read).
    d = case("side-link-outside")
    outside = tmp_path / "outside.json"
    outside.write_bytes(CONFIG)
    (d / "config.json").unlink()
    os.symlink(outside, d / "config.json")
    fifo_arg = tmp_path / "plain-fifo"
    os.mkfifo(fifo_arg)

    started = time.monotonic()
    results = {Path(r["path"]).name: r for r in _probe(*cases.values(), fifo_arg)}
    assert time.monotonic() - started < 60

    for label in ("container-fifo", "container-to-dev-zero", "index-fifo"):
        r = results[label]
        assert r["open"].startswith("ArtifactError"), r
        assert r["verify"] == 6 and r["inspect"] == 6, r
    assert "FIFO" in results["container-fifo"]["open"]
    assert "symbolic link" in results["container-to-dev-zero"]["open"]
    assert "FIFO" in results["index-fifo"]["open"]
    for label, words in (
        ("side-fifo", "FIFO"),
        ("side-to-dev-zero", "symbolic link"),
        ("side-link-outside", "symbolic link"),
    ):
        r = results[label]
        assert r["open"] == "ok", r
        assert len(r["integrity"]) == 1 and words in r["integrity"][0], r
        assert r["integrity"][0].startswith("IntegrityError: ")
        assert "config.json" in r["integrity"][0]
        assert r["verify"] == 6, r
        assert any(words in m for m in r["verify_findings"]), r
        assert r["inspect"] == 0  # inspect reads only the header
    # A FIFO given as ARTIFACT is not an artifact: a usage error, not a blocked open.
    assert results["plain-fifo"]["verify"] == 2 and results["plain-fifo"]["inspect"] == 2


def test_a_linked_folder_in_a_side_file_path_is_refused(tmp_path: Path) -> None:
    from ninfer_convert.container.dir_snapshot import open_in_directory

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.json").write_text("{}")
    os.symlink(tmp_path / "real", tmp_path / "linked")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got, st = open_in_directory(fd, "real/x.json", "real/x.json")
        os.close(got)
        assert st.st_size == 2
        with pytest.raises(ArtifactError, match="symbolic link"):
            open_in_directory(fd, "linked/x.json", "linked/x.json")
        for bad in ("../x.json", "real/../real/x.json", "", "real//x.json"):
            with pytest.raises(ArtifactError, match="plain names"):
                open_in_directory(fd, bad, bad)
    finally:
        os.close(fd)


def test_a_side_file_of_another_size_is_refused_before_it_is_read(tmp_path: Path) -> None:
    out = _art(tmp_path, "m")
    (out / "config.json").write_bytes(CONFIG + b" " * (10 << 20))
    with open_artifact(out) as art:
        [problem] = art.integrity_problems()
        assert isinstance(problem, IntegrityError)
        assert f"recorded {len(CONFIG)} bytes" in str(problem)
        with pytest.raises(IntegrityError, match=r"config\.json"):
            art.read_side_file("config.json")


def test_read_side_file_returns_the_checked_bytes(tmp_path: Path) -> None:
    out = _art(tmp_path, "m")
    with open_artifact(out) as art:
        assert art.read_side_file("config.json") == CONFIG
        with pytest.raises(UsageError, match=r"no side file 'tokenizer\.json'"):
            art.read_side_file("tokenizer.json")
        (out / "config.json").write_bytes(CONFIG.replace(b"tiny", b"tinY"))
        with pytest.raises(IntegrityError, match="digest"):
            art.read_side_file("config.json")


# ---------------------------------------------------------------------------------------------
# Shard identity


def test_a_single_file_must_say_shard_1_of_1(tmp_path: Path) -> None:
    out = _art(tmp_path, "m")

    def forge(h: dict[str, Any]) -> None:
        h["shard"] = {"index": 2, "count": 3}

    rewrite_header(out / SINGLE_NAME, forge)
    for target in (out, out / SINGLE_NAME):
        with pytest.raises(ArtifactError, match=r"shard 2 of 3.*single-file artifact") as info:
            open_artifact(target)
        assert SINGLE_NAME in str(info.value)
    # The same forged file under any other plain name is refused too.
    shutil.copy(out / SINGLE_NAME, tmp_path / "renamed.ninfer")
    with pytest.raises(ArtifactError, match="single-file artifact"):
        open_artifact(tmp_path / "renamed.ninfer")


def test_a_shard_must_match_the_name_it_is_opened_under(tmp_path: Path, capsys: Any) -> None:
    from ninfer_convert.cli import main

    out = _art(tmp_path, "m", max_shard_size=200)
    one, two = out / "model-00001-of-00003.ninfer", out / "model-00002-of-00003.ninfer"
    with open_artifact(two) as art:  # a shard alone, under its own name: fine
        assert art.files == (two,)
    assert main(["inspect", str(two)]) == 0
    assert "1 of 3 shards (opened alone)" in capsys.readouterr().out
    shutil.copy(two, one)
    with pytest.raises(ArtifactError, match="shard 2 of 3, its file name says 1 of 3"):
        open_artifact(one)
    # A shard copied out under a plain name claims to be part of a set: refused.
    shutil.copy(two, tmp_path / "lone.ninfer")
    with pytest.raises(ArtifactError, match="single-file artifact"):
        open_artifact(tmp_path / "lone.ninfer")


def test_inspect_refuses_a_forged_single_file(tmp_path: Path, capsys: Any) -> None:
    from ninfer_convert.cli import main

    out = _art(tmp_path, "m")
    rewrite_header(out / SINGLE_NAME, lambda h: h.update(shard={"index": 2, "count": 3}))
    assert main(["inspect", str(out)]) == 6
    assert "single-file artifact" in capsys.readouterr().err
    assert main(["verify", "--no-source", "-q", "--json", str(out)]) == 6
    report = json.loads(capsys.readouterr().out)
    assert report["checks"][0]["status"] == "fail"
    assert "single-file artifact" in report["checks"][0]["findings"][0]["message"]


# ---------------------------------------------------------------------------------------------
# Stray container files


def test_stray_container_files_are_listed(tmp_path: Path, capsys: Any) -> None:
    from ninfer_convert.cli import main

    single = _art(tmp_path, "single")
    sharded = _art(tmp_path, "sharded", max_shard_size=200)
    with open_artifact(single) as art:
        assert art.stray_files == ()
    with open_artifact(sharded) as art:
        assert art.stray_files == ()
    shutil.copy(sharded / "model-00001-of-00003.ninfer", single / "model-00001-of-00002.ninfer")
    (single / "old.ninfer").write_bytes(b"")
    (single / "notes.txt").write_text("not container-like")
    with open_artifact(single) as art:
        assert art.stray_files == ("model-00001-of-00002.ninfer", "old.ninfer")
    with open_artifact(single / SINGLE_NAME) as art:
        assert art.stray_files == ("model-00001-of-00002.ninfer", "old.ninfer")
    assert main(["inspect", str(single)]) == 0
    assert "Stray      model-00001-of-00002.ninfer, old.ninfer" in capsys.readouterr().out
    assert main(["inspect", "--json", str(single)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["artifact"]["stray_files"] == ["model-00001-of-00002.ninfer", "old.ninfer"]
    shutil.copy(single / SINGLE_NAME, sharded / "model-00004-of-00004.ninfer")
    with open_artifact(sharded) as art:
        assert art.stray_files == ("model-00004-of-00004.ninfer",)
    with open_artifact(sharded / "model-00002-of-00003.ninfer") as art:
        assert art.stray_files == ()  # one shard opened alone: its siblings are not strays


# ---------------------------------------------------------------------------------------------
# JSON nesting


def _nested_config(depth: int) -> dict[str, Any]:
    value: Any = 0
    for _ in range(depth):
        value = {"a": value}
    meta = json.loads(json.dumps(META))
    meta["source"]["config"] = value
    return meta


def test_the_deepest_config_a_writer_accepts_is_read_back(tmp_path: Path) -> None:
    deepest = _nested_config(64)  # jsonfields.values.json_value's bound: 64 levels below the config
    with ArtifactWriter(tmp_path / "deep", metadata=deepest, alignment=64) as w:
        w.add("w", "BF16", make_logical("BF16", (2, 3)), role="w",
              provenance=provenance("BF16", shape=(2, 3)))  # fmt: skip
    with open_artifact(tmp_path / "deep") as art:
        assert art.meta.source.config == deepest["source"]["config"]


def test_deeply_nested_header_and_index_are_typed_errors(tmp_path: Path) -> None:
    out = _art(tmp_path, "m")
    deep = '"config":' + "[" * 2000 + "]" * 2000 + ',"x":'
    rewrite_header(out / SINGLE_NAME, lambda h: json.dumps(h).replace('"config":', deep).encode())
    with pytest.raises(ArtifactError, match="nested too deeply: deeper than 68 levels") as info:
        open_artifact(out)
    assert SINGLE_NAME in str(info.value)
    sharded = _art(tmp_path, "s", max_shard_size=200)
    (sharded / INDEX_NAME).write_bytes(b"[" * 5000 + b"]" * 5000)
    with pytest.raises(ArtifactError, match="index JSON is nested too deeply: deeper than 8"):
        open_artifact(sharded)


# ---------------------------------------------------------------------------------------------
# I32 values are exact


def test_i32_dequantize_is_exact(tmp_path: Path) -> None:
    words = np.array([16777217, -16777217, 2**31 - 1, -(2**31), 0, 1], dtype=np.int32)
    with ArtifactWriter(tmp_path / "i", metadata=META, alignment=64) as w:
        w.add("ids", "I32", DirectWords(words), role="index",
              provenance=provenance("I32", shape=(6,)))  # fmt: skip
    with open_artifact(tmp_path / "i") as art:
        got = art.dequantize("ids")
    assert got.dtype == np.int32
    assert np.array_equal(got, words) and got.tolist() == words.tolist()
    with pytest.raises(UsageError, match="I32 values are integers"):
        dequantize_logical("I32", DirectWords(words))


# ---------------------------------------------------------------------------------------------
# One snapshot while convert --force replaces the directory


def _two_sources(root: Path) -> tuple[Path, Path, Path]:
    from st_helpers import write_safetensors

    recipe = root / "recipe.yaml"
    recipe.write_text(
        "ninfer_recipe: 1\nname: snap\nversion: '1'\ndescription: snapshot test\n"
        "source:\n  tensor_count: 1\nrules:\n  - match: w\n    format: FP32\n    role: w\n"
    )
    made = []
    for tag, value in (("A", 1.0), ("B", 2.0)):
        src = root / f"src{tag}"
        src.mkdir()
        # Sizes differ too, so a mixed pair shows as a size mismatch without reading.
        pad = "x" * (10 if tag == "A" else 400)
        (src / "config.json").write_text(json.dumps({"version": tag, "pad": pad}))
        write_safetensors(
            src / "model.safetensors", {"w": ("F32", np.full((64, 64), value, np.float32))}
        )
        made.append(src)
    return made[0], made[1], recipe


def test_readers_see_one_version_while_force_replaces_it(tmp_path: Path) -> None:
    from ninfer_convert.convert import convert_checkpoint

    src_a, src_b, recipe = _two_sources(tmp_path)
    out = tmp_path / "out"
    convert_checkpoint(src_a, recipe, out, device="cpu", jobs=1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(40):
                if stop.is_set():
                    break
                convert_checkpoint(
                    src_b if i % 2 == 0 else src_a, recipe, out, device="cpu", jobs=1, force=True
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    consistent = absent = 0
    mixed: list[str] = []
    deadline = time.monotonic() + 20
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                art = open_artifact(out)
            except ArtifactError as exc:
                # Between the two renames of the current writer the name may be briefly
                # absent; that is the publisher's concern, never a mixed artifact.
                assert "no such file" in str(exc) or "no artifact here" in str(exc), exc
                absent += 1
                continue
            with art:
                problems = [str(p) for p in art.integrity_problems()]
                if problems:
                    mixed += problems
                    continue
                config = json.loads(art.read_side_file("config.json"))
                value = float(art.dequantize("w")[0, 0])
                if {"A": 1.0, "B": 2.0}[config["version"]] != value:
                    mixed.append(f"config {config['version']} with weights {value}")
                consistent += 1
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not errors, errors
    assert not mixed, mixed[:3]
    assert consistent >= 10, (consistent, absent)
