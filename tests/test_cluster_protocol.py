"""The shard-task protocol of ``convert --ray`` without Ray: tasks run in this process, the
writer adopts their payloads, and the bytes equal a local run; the pre-flight rules on crafted
probe results; the writer's checks of an adopted shard."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from artifact_fixtures import META, provenance
from cluster_fixtures import (
    EXAMPLE,
    EXAMPLE_NVFP4,
    GENERIC_RECIPE,
    QWEN_RECIPE,
    dense_checkpoint,
    files_of,
)

from ninfer_convert import __version__, open_artifact
from ninfer_convert.cluster import _ray, shard_ranges
from ninfer_convert.cluster.driver import RayCluster, _gather, _split
from ninfer_convert.cluster.tasks import (
    FAULT_DIR_ENV,
    ProbeResult,
    ShardTask,
    fingerprint,
    payload_name,
    write_shard,
)
from ninfer_convert.container import ArtifactWriter
from ninfer_convert.container.placement import place_tensors
from ninfer_convert.container.schema import PlaneEntry
from ninfer_convert.convert import RunnerResult, convert_checkpoint, plan_conversion
from ninfer_convert.errors import EncodeError, ResourceError, SourceError, UsageError
from ninfer_convert.recipe import Plan, PlanEntry
from ninfer_convert.source import SourceCheckpoint

NVFP4_RECIPE = QWEN_RECIPE.parent / "qwen3.6-27b-nvfp4.yaml"


def in_process_runner(
    writer: ArtifactWriter,
    plan: Plan,
    source: SourceCheckpoint,
    device: str,
    on_tensor: Callable[[PlanEntry, int], None],
) -> RunnerResult:
    """What the Ray runner does, with each shard task called here, last shard first (the
    order tasks finish in does not matter)."""
    assert writer.max_shard_size is not None
    ranges = shard_ranges(plan, alignment=writer.alignment, max_shard_size=writer.max_shard_size)
    tasks = [
        ShardTask(n, a, b, str(writer.staging), str(source.path), writer.alignment, device, 1)
        for n, (a, b) in enumerate(ranges, start=1)
    ]
    results = {t.number: write_shard(t, plan.entries) for t in reversed(tasks)}
    digests: dict[str, str] = {}
    for task in tasks:
        r = results[task.number]
        writer.adopt_shard(r.path, payload_end=r.payload_end, tensors=r.tensors)
        digests.update(r.source_digests)
        for entry, t in zip(plan.entries[task.start : task.stop], r.tensors, strict=True):
            on_tensor(entry, sum(p.nbytes for p in t.planes))
    return RunnerResult(digests, sum(r.spot_rows for r in results.values()), {"tasks": len(tasks)})


@pytest.mark.parametrize(
    ("source", "recipe", "shard"),
    [
        (EXAMPLE, QWEN_RECIPE, 150_000),
        (EXAMPLE, QWEN_RECIPE, 1 << 30),
        (EXAMPLE_NVFP4, NVFP4_RECIPE, 200_000),
    ],
)
def test_shard_tasks_give_the_bytes_of_a_local_run(
    tmp_path: Path, source: Path, recipe: Path, shard: int
) -> None:
    local, split = tmp_path / "local", tmp_path / "split"
    convert_checkpoint(source, recipe, local, device="cpu", jobs=2, max_shard_size=shard)
    report = convert_checkpoint(source, recipe, split, device="cpu", max_shard_size=shard,
                                runner=in_process_runner)  # fmt: skip
    assert files_of(split) == files_of(local)
    assert report.runner == {"tasks": len(list(local.glob("*.ninfer")))}
    assert report.to_dict()["runner"] == report.runner


def test_shard_ranges_are_the_writers_shards(tmp_path: Path) -> None:
    src = dense_checkpoint(tmp_path / "src")
    out = tmp_path / "out"
    convert_checkpoint(src, GENERIC_RECIPE, out, device="cpu", max_shard_size=100_000)
    _, plan = plan_conversion(src, GENERIC_RECIPE)
    ranges = shard_ranges(plan, alignment=4096, max_shard_size=100_000)
    with open_artifact(out) as art:
        names = list(art.tensors)
    assert len(ranges) == len(list(out.glob("*.ninfer"))) > 2
    assert [e.output for e in plan.entries] == names
    assert ranges[0][0] == 0 and ranges[-1][1] == len(plan.entries)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    index = (out / "model.ninfer.index.json").read_text()
    for number, (start, stop) in enumerate(ranges, start=1):
        for entry in plan.entries[start:stop]:
            assert f'"{entry.output}":"model-{number:05d}-of-{len(ranges):05d}.ninfer"' in index


def test_a_user_error_in_a_shard_task_is_the_local_error_and_leaves_no_file(
    tmp_path: Path,
) -> None:
    src = dense_checkpoint(tmp_path / "src", poison=True)
    with pytest.raises(EncodeError) as local:
        convert_checkpoint(src, GENERIC_RECIPE, tmp_path / "a", device="cpu",
                           max_shard_size=100_000)  # fmt: skip
    _, plan = plan_conversion(src, GENERIC_RECIPE)
    staging = tmp_path / "staging"
    staging.mkdir()
    ranges = shard_ranges(plan, alignment=4096, max_shard_size=100_000)
    number = len(ranges)  # the poisoned tensor is in the last layer
    task = ShardTask(number, *ranges[-1], str(staging), str(src), 4096, "cpu", 1)
    with pytest.raises(EncodeError) as remote:
        write_shard(task, plan.entries)
    assert str(remote.value) == str(local.value) and remote.value.kind == local.value.kind
    assert list(staging.iterdir()) == []  # the attempt's file is gone
    with pytest.raises(EncodeError):
        convert_checkpoint(src, GENERIC_RECIPE, tmp_path / "b", device="cpu",
                           max_shard_size=100_000, runner=in_process_runner)  # fmt: skip
    assert not (tmp_path / "b").exists() and list(tmp_path.glob(".b*")) == []


def test_the_fault_hook_kills_only_the_attempt_that_claims_the_trigger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = dense_checkpoint(tmp_path / "src")
    _, plan = plan_conversion(src, GENERIC_RECIPE)
    (tmp_path / "faults").mkdir()
    monkeypatch.setenv(FAULT_DIR_ENV, str(tmp_path / "faults"))
    killed: list[int] = []
    monkeypatch.setattr("ninfer_convert.cluster.tasks.os.kill", lambda pid, sig: killed.append(sig))
    (tmp_path / "faults" / "kill-shard-00001").touch()
    staging = tmp_path / "staging"
    staging.mkdir()
    write_shard(ShardTask(1, 0, 4, str(staging), str(src), 4096, "cpu", 1), plan.entries)
    write_shard(ShardTask(1, 0, 4, str(staging), str(src), 4096, "cpu", 1), plan.entries)
    assert len(killed) == 1 and list((tmp_path / "faults").iterdir()) == []
    assert [p.name for p in staging.iterdir()] == [payload_name(1)]


def _writer(tmp_path: Path) -> ArtifactWriter:
    return ArtifactWriter(tmp_path / "out", metadata=META, max_shard_size=1 << 20)


def _payload(tmp_path: Path) -> tuple[Path, Any]:
    """One shard task's payload of the example's first two tensors, and its result."""
    _, plan = plan_conversion(EXAMPLE, QWEN_RECIPE)
    staging = tmp_path / "payloads"
    staging.mkdir()
    result = write_shard(ShardTask(1, 0, 2, str(staging), str(EXAMPLE), 4096, "cpu", 1),
                         plan.entries)  # fmt: skip
    return Path(result.path), result


def test_adopt_shard_checks_the_payload_and_the_entries(tmp_path: Path) -> None:
    path, result = _payload(tmp_path)
    with _writer(tmp_path) as writer:
        with pytest.raises(UsageError, match="staging directory"):
            writer.adopt_shard(path, payload_end=result.payload_end, tensors=result.tensors)
        mine = writer.staging / path.name
        path.rename(mine)
        _grown(mine, 1)
        with pytest.raises(UsageError, match="payload has"):
            writer.adopt_shard(mine, payload_end=result.payload_end, tensors=result.tensors)
        _grown(mine, -1)
        first = result.tensors[0]
        moved = first.planes[0]
        planes = (PlaneEntry(moved.name, 64, moved.nbytes, moved.digest), *first.planes[1:])
        shifted = dataclasses.replace(first, planes=planes)
        with pytest.raises(UsageError, match="own offset"):
            writer.adopt_shard(mine, payload_end=result.payload_end, tensors=(shifted,))
        writer.adopt_shard(mine, payload_end=result.payload_end, tensors=result.tensors)
        with pytest.raises(UsageError, match="added twice"):
            writer.adopt_shard(mine, payload_end=result.payload_end, tensors=result.tensors)
        with pytest.raises(UsageError, match="adopted shards"):
            writer.reserve("x", "BF16", (4,), role="weight", provenance={})
        writer.abort()
    assert not (tmp_path / "out").exists()


def test_ray_needs_max_shard_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ray, "load_ray", lambda: SimpleNamespace())
    runner = RayCluster().convert_runner()
    with pytest.raises(UsageError, match="--max-shard-size"):
        convert_checkpoint(EXAMPLE, QWEN_RECIPE, tmp_path / "o", device="cpu", runner=runner)
    assert not (tmp_path / "o").exists()


# -- pre-flight ---------------------------------------------------------------------------------


def _cluster_with(
    monkeypatch: pytest.MonkeyPatch, make: Callable[[list[str], Path | None, str], ProbeResult]
) -> RayCluster:
    """A RayCluster whose probes answer ``make(paths, staging, token)`` (no Ray needed)."""
    monkeypatch.setattr(_ray, "load_ray", lambda: SimpleNamespace())
    cluster = RayCluster()

    def probes(ray: object, paths: list[str], staging: Path | None, token_file: str | None):
        token = None if staging is None or token_file is None else (
            (staging / token_file).read_text())  # fmt: skip
        return [make(paths, staging, token or "")]

    monkeypatch.setattr(cluster, "_probe_nodes", probes)
    return cluster


def _honest(paths: list[str], staging: Path | None, token: str, **changes: Any) -> ProbeResult:
    probe_file = None
    if staging is not None:
        probe_file = str(staging / "probe-node")
        Path(probe_file).write_text("mine")
    fields = dict(node="node-b:1", version=__version__, fingerprint=fingerprint(paths),
                  token_seen=token, probe_file=probe_file, probe_token="mine",
                  write_error=None)  # fmt: skip
    fields.update(changes)
    return ProbeResult(**fields)  # type: ignore[arg-type]


def _source_files() -> list[str]:
    return sorted(str(p) for p in EXAMPLE.glob("*.safetensors"))


def test_preflight_passes_an_honest_node_and_removes_its_probe_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = _cluster_with(monkeypatch, _honest)
    results = cluster.preflight(object(), "source", _source_files(), tmp_path)
    assert [r.node for r in results] == ["node-b:1"] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"version": "0.0.1"}, UsageError, "runs ninfer-convert 0.0.1"),
        ({"token_seen": None}, UsageError, "do not see the same staging folder"),
        ({"probe_token": "other"}, UsageError, "do not see the same staging folder"),
        ({"write_error": "Permission denied"}, ResourceError, "cannot write the staging"),
    ],
)
def test_preflight_refuses_a_node_that_differs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    changes: dict[str, Any],
    error: type[Exception],
    words: str,
) -> None:
    cluster = _cluster_with(monkeypatch, lambda p, s, t: _honest(p, s, t, **changes))
    with pytest.raises(error, match=words):
        cluster.preflight(object(), "source", _source_files(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_preflight_refuses_other_source_bytes_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _source_files()

    def other(paths: list[str], staging: Path | None, token: str) -> ProbeResult:
        seen = list(fingerprint(paths))
        seen[-1] = (seen[-1][0], seen[-1][1], "0" * 32)
        return _honest(paths, staging, token, fingerprint=tuple(seen))

    cluster = _cluster_with(monkeypatch, other)
    with pytest.raises(SourceError, match="does not see the same source file") as info:
        cluster.preflight(object(), "source", files, tmp_path)
    assert info.value.path == files[-1] and info.value.exit_code == 4


def test_fingerprint_digests_the_safetensors_header_only(tmp_path: Path) -> None:
    src = dense_checkpoint(tmp_path / "src")
    path = src / "model-00001-of-00002.safetensors"
    before = fingerprint([str(path)])
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # a tensor byte: not part of the header
    path.write_bytes(bytes(data))
    assert fingerprint([str(path)]) == before
    data[20] ^= 1  # a header byte
    path.write_bytes(bytes(data))
    assert fingerprint([str(path)]) != before
    assert fingerprint([str(tmp_path / "missing")])[0][1] == -1


def test_verify_runs_are_consecutive_and_cover_every_tensor() -> None:
    names = [f"t{i}" for i in range(10)]
    runs = _split(names, [1, 1, 1, 100, 1, 1, 1, 1, 1, 1], 4)
    assert [n for r in runs for n in r] == names and 1 < len(runs) <= 4
    assert _split([], [], 4) == [] and _split(["a"], [0], 4) == [["a"]]


# -- collecting results -------------------------------------------------------------------------


class _FakeRay:
    """Just enough of Ray for _gather: tasks finish in ``order``; ``fails`` maps a task to the
    exception its ``get`` raises (wrapped as Ray wraps a task's own exception)."""

    class exceptions:  # mirrors ray.exceptions
        class RayTaskError(Exception):
            def __init__(self, cause: BaseException) -> None:
                super().__init__(f"wrapped {cause!r}")
                self.cause = cause

    def __init__(self, order: list[int], fails: dict[int, BaseException]) -> None:
        self.order = list(order)
        self.fails = fails
        self.cancelled: list[int] = []

    def wait(self, pending: list[int], num_returns: int, timeout: float) -> tuple[list, list]:
        for i in self.order:
            if i in pending:
                self.order.remove(i)
                return [i], [r for r in pending if r != i]
        raise AssertionError("nothing left to finish")

    def get(self, ref: int) -> str:
        if ref in self.cancelled:
            raise RuntimeError("TaskCancelledError")
        if ref in self.fails:
            raise self.exceptions.RayTaskError(self.fails[ref])
        return f"result {ref}"

    def cancel(self, ref: int, force: bool) -> None:
        self.cancelled.append(ref)


def test_gather_hands_results_over_in_task_order() -> None:
    fake = _FakeRay([3, 1, 0, 2], {})
    seen: list[tuple[int, str]] = []
    out = _gather(fake, [0, 1, 2, 3], str, lambda i, r: seen.append((i, r)))
    assert out == [f"result {i}" for i in range(4)] and [i for i, _ in seen] == [0, 1, 2, 3]


def test_gather_raises_the_first_failing_tasks_own_error_as_a_local_run_would() -> None:
    # Task 3 fails first, then task 1: the local run, in plan order, would stop at task 1.
    late, early = EncodeError("late shard"), EncodeError("early shard")
    fake = _FakeRay([3, 0, 1, 2, 4], {3: late, 1: early})
    seen: list[int] = []
    with pytest.raises(EncodeError) as info:
        _gather(fake, [0, 1, 2, 3, 4], str, lambda i, r: seen.append(i))
    assert info.value is early  # unwrapped: the task's own typed error
    assert 4 in fake.cancelled and 2 in fake.cancelled  # tasks after a failure stop
    assert 0 not in fake.cancelled and seen == []  # nothing is adopted once a task failed


def test_gather_cancels_every_pending_task_on_ctrl_c() -> None:
    fake = _FakeRay([0], {})

    def interrupted(i: int, r: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _gather(fake, [0, 1, 2], str, interrupted)
    assert sorted(fake.cancelled) == [1, 2]


def test_place_tensors_is_the_writers_own_placement(tmp_path: Path) -> None:
    # BF16 vectors: one plane of 2 n bytes each; sizes that fill, overflow and exceed a shard.
    counts = [2500, 60000, 50, 100000, 1500, 1, 45000, 45000, 30000, 8]
    placed = place_tensors([[2 * n] for n in counts], alignment=64, max_shard_size=100_000)
    with ArtifactWriter(tmp_path / "o", metadata=META, alignment=64,
                        max_shard_size=100_000) as writer:  # fmt: skip
        for i, (n, where) in enumerate(zip(counts, placed, strict=True)):
            res = writer.reserve(f"t{i}", "BF16", (n,), role="weight",
                                 provenance=provenance("BF16", f"t{i}", (n,)))  # fmt: skip
            assert (res.shard.number - 1, res.offsets) == (where.shard, where.offsets), i
            writer.complete(res)
        writer.abort()
    assert [p.shard for p in placed] == [0, 1, 2, 3, 4, 4, 4, 5, 6, 6]


def _grown(path: Path, extra: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size + extra)


def test_adopt_shard_refuses_planes_off_the_writers_own_offsets(tmp_path: Path) -> None:
    """A payload placed with gaps the writer would not leave (another alignment, a bug in the
    task) is a valid-looking shard whose bytes differ from a local run's: refused."""
    path, result = _payload(tmp_path)
    with _writer(tmp_path) as writer:
        mine = writer.staging / path.name
        path.rename(mine)
        step = writer.alignment
        _grown(mine, step)
        shifted = tuple(
            dataclasses.replace(
                t,
                planes=tuple(
                    PlaneEntry(p.name, p.offset + step, p.nbytes, p.digest) for p in t.planes
                ),
            )
            for t in result.tensors
        )
        with pytest.raises(UsageError, match="own offset"):
            writer.adopt_shard(mine, payload_end=result.payload_end + step, tensors=shifted)
        writer.abort()
    assert not (tmp_path / "out").exists()


def test_adopt_shard_refuses_bytes_after_the_last_plane(tmp_path: Path) -> None:
    """Bytes between the last plane and the header are covered by no digest: refused."""
    path, result = _payload(tmp_path)
    with _writer(tmp_path) as writer:
        mine = writer.staging / path.name
        path.rename(mine)
        _grown(mine, 64)
        with pytest.raises(UsageError, match="after the last plane"):
            writer.adopt_shard(mine, payload_end=result.payload_end + 64, tensors=result.tensors)
        writer.abort()
    assert not (tmp_path / "out").exists()


def test_adopt_shard_refuses_a_shard_past_max_shard_size(tmp_path: Path) -> None:
    """A shard the writer itself would have split (a later tensor ends past
    --max-shard-size) is not the writer's shard: refused."""
    path, result = _payload(tmp_path)
    assert len(result.tensors) == 2
    first_end = max(p.offset + p.nbytes for p in result.tensors[0].planes)
    with ArtifactWriter(tmp_path / "out", metadata=META, max_shard_size=first_end) as writer:
        mine = writer.staging / path.name
        path.rename(mine)
        with pytest.raises(UsageError, match="max_shard_size"):
            writer.adopt_shard(mine, payload_end=result.payload_end, tensors=result.tensors)
        writer.abort()
    assert not (tmp_path / "out").exists()


def test_shard_tasks_with_importance_and_another_alignment_give_the_local_bytes(
    tmp_path: Path,
) -> None:
    """The plan's importance words reach the tasks (an importance-weighted encoder) and the
    tasks place planes at the writer's --alignment, not the default."""
    from test_convert_iw import _importance, _recipe, _source, _weights

    src, _ = _source(tmp_path)
    recipe, imp = _recipe(tmp_path), _importance(tmp_path, {"w": _weights()})
    local, split = tmp_path / "local", tmp_path / "split"
    options: dict[str, Any] = {"device": "cpu", "max_shard_size": 4096, "alignment": 8192,
                               "importance": imp}  # fmt: skip
    convert_checkpoint(src, recipe, local, jobs=1, **options)
    convert_checkpoint(src, recipe, split, runner=in_process_runner, **options)
    assert len(list(local.glob("*.ninfer"))) == 2
    assert files_of(split) == files_of(local)


def test_shard_tasks_with_compensation_factors_give_the_local_bytes(tmp_path: Path) -> None:
    """The plan's factors reach the tasks (GPTQ_F16_SEARCH_IW_V1) and both generated side
    files are written by the driver as locally."""
    from test_convert_gptq import _factor, _files, _recipe, _source, _weights

    src, _ = _source(tmp_path)
    imp, fac = _files(tmp_path, _weights(), _factor(128))
    local, split = tmp_path / "local", tmp_path / "split"
    options: dict[str, Any] = {"device": "cpu", "max_shard_size": 4096, "importance": imp,
                               "factors": fac}  # fmt: skip
    convert_checkpoint(src, _recipe(tmp_path), local, jobs=1, **options)
    convert_checkpoint(src, _recipe(tmp_path), split, runner=in_process_runner, **options)
    assert files_of(split) == files_of(local)
