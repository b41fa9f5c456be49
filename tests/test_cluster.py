"""``convert --ray`` and ``verify --ray`` on a local Ray cluster of 2 worker processes: the
bytes and the report equal a local run's, a worker killed half-way through a shard task is
retried to the same bytes, and a user error inside a task is the local error and exit code
with nothing under the output name.  Skipped without Ray (the ``ray`` extra); marked ``ray``
(.ci/run runs them explicitly)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import (
    EXAMPLE,
    EXAMPLE_NVFP4,
    GENERIC_RECIPE,
    QWEN_RECIPE,
    dense_checkpoint,
    files_of,
)

from ninfer_convert.cli import main
from ninfer_convert.cluster import RayCluster
from ninfer_convert.cluster.tasks import FAULT_DIR_ENV
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import EncodeError
from ninfer_convert.verify import verify_artifact

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

NVFP4_RECIPE = QWEN_RECIPE.parent / "qwen3.6-27b-nvfp4.yaml"


@pytest.fixture(scope="module")
def faults() -> Iterator[Path]:
    """The fault-trigger folder the workers see (set before the cluster starts)."""
    folder = Path(tempfile.mkdtemp(prefix="ninfer-faults-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(faults: Path) -> Iterator[RayCluster]:
    """One local cluster of 2 worker processes for every Ray test (they are all in this
    module: it is shut down after them, not at the end of the session); its session folder is
    removed afterwards."""
    temp = tempfile.mkdtemp(prefix="ninfer-ray-", dir="/tmp")  # short: Ray's socket paths
    old = os.environ.get(FAULT_DIR_ENV)
    os.environ[FAULT_DIR_ENV] = str(faults)
    try:
        # A small object store: the tasks pass only plan entries and results through it, and
        # the machine is shared.
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp,
                 configure_logging=False, object_store_memory=200 << 20)  # fmt: skip
        yield RayCluster()
    finally:
        ray.shutdown()
        if old is None:
            os.environ.pop(FAULT_DIR_ENV, None)
        else:
            os.environ[FAULT_DIR_ENV] = old
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize(
    ("source", "recipe", "shard"),
    [(EXAMPLE, QWEN_RECIPE, "150KB"), (EXAMPLE_NVFP4, NVFP4_RECIPE, "200KB")],
)
def test_cli_convert_on_ray_writes_the_bytes_of_a_local_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    cluster: RayCluster,
    source: Path,
    recipe: Path,
    shard: str,
) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    base = ["convert", str(source), "--recipe", str(recipe), "--max-shard-size", shard]
    assert main([*base, "--output", str(local), "--json"]) == 0
    capsys.readouterr()
    assert main([*base, "--output", str(remote), "--json", "--ray"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert files_of(remote) == files_of(local)
    shards = len(list(local.glob("*.ninfer")))
    assert shards > 1 and summary["runner"]["ray"]["shard_tasks"] == shards
    (node,) = summary["runner"]["ray"]["nodes"].values()
    assert node["tensors"] == summary["tensors"] and node["source_bytes"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "remote"]  # no staging left


def test_convert_on_ray_of_a_multi_file_checkpoint_equals_local(
    tmp_path: Path, cluster: RayCluster
) -> None:
    src = dense_checkpoint(tmp_path / "src", layers=6)
    local, remote = tmp_path / "local", tmp_path / "remote"
    convert_checkpoint(src, GENERIC_RECIPE, local, device="cpu", max_shard_size=100_000)
    events: list[Any] = []
    report = convert_checkpoint(src, GENERIC_RECIPE, remote, device="cpu",
                                max_shard_size=100_000, runner=cluster.convert_runner(),
                                progress=events.append)  # fmt: skip
    assert files_of(remote) == files_of(local) and len(list(local.glob("*.ninfer"))) > 3
    # Progress as a local run's: every tensor once, in plan order, bytes up to the total.
    assert [e.tensor for e in events[1:]] == [e.output for e in report.plan.entries]
    assert events[-1].source_bytes_done == events[-1].source_bytes_total == report.source_bytes


def test_a_worker_killed_mid_shard_is_retried_to_the_same_bytes(
    tmp_path: Path, cluster: RayCluster, faults: Path
) -> None:
    src = dense_checkpoint(tmp_path / "src", layers=6)
    local, remote = tmp_path / "local", tmp_path / "remote"
    convert_checkpoint(src, GENERIC_RECIPE, local, device="cpu", max_shard_size=100_000)
    trigger = faults / "kill-shard-00002"
    trigger.touch()
    convert_checkpoint(src, GENERIC_RECIPE, remote, device="cpu", max_shard_size=100_000,
                       runner=cluster.convert_runner())  # fmt: skip
    assert not trigger.exists()  # the first attempt claimed it and killed itself
    assert files_of(remote) == files_of(local)  # no half-written attempt in the artifact


def test_a_user_error_in_a_task_is_the_local_exit_code_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: RayCluster
) -> None:
    src = dense_checkpoint(tmp_path / "src", layers=6, poison=True)
    base = ["convert", str(src), "--recipe", str(GENERIC_RECIPE), "--max-shard-size", "100KB"]
    assert main([*base, "--output", str(tmp_path / "a")]) == EncodeError.exit_code == 5
    local = capsys.readouterr().err
    assert main([*base, "--output", str(tmp_path / "b"), "--ray"]) == 5
    remote = capsys.readouterr().err
    assert "row 200" in remote and "Traceback" not in remote
    assert remote.splitlines()[-3:] == local.splitlines()[-3:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no output, no staging


def _report(doc: dict[str, Any]) -> dict[str, Any]:
    """A verify report without its clock readings."""
    doc = {k: v for k, v in doc.items() if k not in ("seconds", "timings")}
    doc["totals"] = {k: v for k, v in doc["totals"].items()
                     if k not in ("seconds", "bytes_per_second", "timings")}  # fmt: skip
    return doc


def test_verify_on_ray_gives_the_local_report_for_a_good_and_a_corrupt_artifact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: RayCluster
) -> None:
    out = tmp_path / "art"
    convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu", max_shard_size=150_000)
    for corrupt in (False, True):
        if corrupt:  # one plane byte of the second shard: integrity and source-words fail
            shard = sorted(out.glob("*.ninfer"))[1]
            data = bytearray(shard.read_bytes())
            data[8192] ^= 0x40
            shard.write_bytes(bytes(data))
        codes, docs = [], []
        for extra in ([], ["--ray"]):
            codes.append(main(["verify", str(out), "--json", "-q", *extra]))
            docs.append(_report(json.loads(capsys.readouterr().out)))
        assert codes[0] == codes[1] == (6 if corrupt else 0)
        assert docs[0] == docs[1]
        assert (docs[0]["findings_total"] > 0) == corrupt


def test_verify_on_ray_library_report_equals_local(tmp_path: Path, cluster: RayCluster) -> None:
    src = dense_checkpoint(tmp_path / "src")
    out = tmp_path / "art"
    convert_checkpoint(src, GENERIC_RECIPE, out, device="cpu")
    local = verify_artifact(out, jobs=2)
    remote = verify_artifact(out, tensor_checks=cluster.verify_runner())
    assert _report(remote.to_json()) == _report(local.to_json())
