"""The driver side of ``convert --ray`` and ``verify --ray`` (see :mod:`ninfer_convert.cluster`)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._version import __version__
from ..container import ArtifactWriter
from ..convert import RunnerResult
from ..errors import NinferError, ResourceError, SourceError, UsageError
from ..formats import lookup_format
from ..layouts import check_combination
from ..recipe import Plan, PlanEntry
from ..source import SourceCheckpoint
from ..verify.remote import CheckOptions, check_tensors
from ..verify.tensor_checks import TensorOutcome
from . import _ray
from .tasks import (
    ProbeResult,
    ShardResult,
    ShardTask,
    fingerprint,
    payload_name,
    probe,
    write_shard,
)

__all__ = ["DEFAULT_MAX_RETRIES", "RayCluster", "shard_ranges"]

DEFAULT_MAX_RETRIES = 3
"""Times Ray re-runs a task whose worker or node died (a user error is never retried)."""

_POLL_S = 0.5


def shard_ranges(plan: Plan, *, alignment: int, max_shard_size: int) -> list[tuple[int, int]]:
    """The plan entries ``[start, stop)`` of each shard, on the writer's own boundaries."""
    from ..container.placement import place_tensors

    sizes = []
    for e in plan.entries:
        layout = check_combination(e.format, lookup_format(e.format).layout)
        sizes.append(
            [s.nbytes for s in layout.planes(e.format, layout.check_shape(e.format, e.shape))]
        )
    placed = place_tensors(sizes, alignment=alignment, max_shard_size=max_shard_size)
    ranges: list[tuple[int, int]] = []
    for i, p in enumerate(placed):
        if p.shard == len(ranges):
            ranges.append((i, i + 1))
        else:
            ranges[-1] = (ranges[-1][0], i + 1)
    return ranges


@dataclass
class _NodeStats:
    tasks: int = 0
    tensors: int = 0
    source_bytes: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0

    def to_json(self, elapsed: float) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "tensors": self.tensors,
            "source_bytes": self.source_bytes,
            "busy_s": round(self.busy_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "throughput_source_bytes_per_s": round(self.source_bytes / elapsed)
            if elapsed > 0
            else None,
        }


@dataclass
class _Progress:
    started: float = field(default_factory=time.perf_counter)
    nodes: dict[str, _NodeStats] = field(default_factory=dict)

    def add(self, node: str, tensors: int, source_bytes: int, busy_s: float, cpu_s: float) -> None:
        host = node.rsplit(":", 1)[0]
        stats = self.nodes.setdefault(host, _NodeStats())
        stats.tasks += 1
        stats.tensors += tensors
        stats.source_bytes += source_bytes
        stats.busy_s += busy_s
        stats.cpu_s += cpu_s

    def to_json(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.started
        return {host: s.to_json(elapsed) for host, s in sorted(self.nodes.items())}


def _unwrap(ray: Any, exc: BaseException, what: str) -> BaseException:
    """The error a local run raises for a task's failure: the task's own exception (Ray wraps
    it in a RayTaskError), or a ResourceError for a task that died on every attempt."""
    cause = getattr(exc, "cause", None)
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        return cause
    if isinstance(exc, NinferError):
        return exc
    return ResourceError(
        f"{what} failed on the Ray cluster: {type(exc).__name__}: {exc}",
        hint="a worker or node died on every attempt: check the workers' memory and the Ray "
        "logs, or raise the retries",
    )


CONNECT_PROBE_S = 10.0
"""How long the driver waits for a TCP connection to a ``HOST:PORT`` address before saying the
cluster is unreachable; ``ray.init`` itself retries a refused port for minutes."""


def tcp_endpoint(address: str | None) -> tuple[str, int] | None:
    """(host, port) of an address written ``HOST:PORT`` or ``ray://HOST:PORT`` (IPv6 hosts in
    brackets); None for every other form (``auto``, ``local``, none), left to ``ray.init``."""
    if not address:
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def probe_address(address: str, timeout_s: float = CONNECT_PROBE_S) -> None:
    """Fail fast, with a UsageError naming the address, when nothing accepts a TCP connection
    at a ``HOST:PORT`` address; other address forms pass unchecked."""
    endpoint = tcp_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise UsageError(
            f"cannot reach the Ray cluster at {address}: {reason} (a TCP connection to "
            f"{endpoint[0]} port {endpoint[1]} within {timeout_s:g} s)",
            hint="check the head node's address and port (ray start --head prints it), that "
            "it runs and that no firewall is in the way; --ray auto on a node of the cluster",
        ) from None


class RayCluster:
    """A Ray cluster to run ``convert`` and ``verify`` on (``address`` as ``ray.init`` takes
    it: None for a local cluster, ``auto`` for the running one).  Constructing it only checks
    that Ray is installed; the connection is made when a run starts (after the plan), and a
    cluster this object started is shut down when the run ends."""

    def __init__(
        self,
        address: str | None = None,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        init_options: dict[str, Any] | None = None,
    ) -> None:
        self._ray = _ray.load_ray()
        self.address = address
        self.max_retries = max_retries
        self._init_options = dict(init_options or {})

    @contextlib.contextmanager
    def connected(self) -> Iterator[Any]:
        ray = self._ray
        if ray.is_initialized():  # the caller's own connection (a notebook, the tests)
            yield ray
            return
        # Workers' output would mix into --json on stdout; a dashboard only for a cluster
        # started here (joining one, Ray refuses or ignores the option).
        options: dict[str, Any] = {"log_to_driver": False}
        if self.address is None:
            options["include_dashboard"] = False
        if self.address is not None:
            probe_address(self.address)
        try:
            ray.init(address=self.address, **{**options, **self._init_options})
        except Exception as exc:  # ConnectionError, ValueError, RuntimeError from ray.init
            where = self.address or "a new local cluster"
            raise UsageError(
                f"cannot start or reach the Ray cluster ({where}): {exc}",
                hint="pass --ray auto on a node of a running cluster, --ray ray://HOST:10001, or "
                "--ray alone for a local one",
            ) from None
        try:
            yield ray
        finally:
            ray.shutdown()

    # -- pre-flight ----------------------------------------------------------------------------

    def _probe_nodes(
        self, ray: Any, paths: list[str], staging: Path | None, token_file: str | None
    ) -> list[ProbeResult]:
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
        if not nodes:
            raise UsageError("the Ray cluster has no live node with a CPU")
        fn = _ray.remote(ray, probe, num_cpus=0, max_retries=self.max_retries)
        refs = [
            fn.options(scheduling_strategy=_ray.node_strategy(n["NodeID"])).remote(
                paths, None if staging is None else str(staging), token_file
            )
            for n in nodes
        ]
        try:
            return list(ray.get(refs))
        except Exception as exc:
            raise _unwrap(ray, exc, "the pre-flight probe") from None

    def preflight(
        self, ray: Any, what: str, paths: list[str], staging: Path | None = None
    ) -> list[ProbeResult]:
        """Check on every node: the same package version, the same bytes of ``paths`` (sizes
        and header digests) and, given ``staging``, that it is the driver's folder (shared
        storage) and writable.  Raises the typed error of the first problem."""
        expected = fingerprint(paths)
        token = uuid.uuid4().hex
        token_file: str | None = None
        if staging is not None:
            token_file = f"probe-driver-{token}"
            (staging / token_file).write_text(token)
        try:
            results = self._probe_nodes(ray, paths, staging, token_file)
            for r in results:
                if r.version != __version__:
                    raise UsageError(
                        f"node {r.node} runs ninfer-convert {r.version}, the driver {__version__}",
                        hint="install the same version on every node",
                    )
                for mine, theirs in zip(expected, r.fingerprint, strict=True):
                    if mine != theirs:
                        seen = "missing or unreadable" if theirs[1] < 0 else (
                            f"{theirs[1]} bytes, header digest {theirs[2]}")  # fmt: skip
                        raise SourceError(
                            f"node {r.node} does not see the same {what} file: {seen}, the "
                            f"driver {mine[1]} bytes, header digest {mine[2]}",
                            path=mine[0],
                            hint="put the files on storage every node mounts at the same path",
                        )
                if staging is None:
                    continue
                if r.write_error is not None:
                    raise ResourceError(
                        f"node {r.node} cannot write the staging folder: {r.write_error}",
                        path=str(staging),
                        hint="give every node write access to the output's parent folder",
                    )
                shared = r.token_seen == token and r.probe_file is not None
                if shared:
                    with contextlib.suppress(OSError):
                        shared = Path(r.probe_file or "").read_text() == r.probe_token
                if not shared:
                    raise UsageError(
                        f"node {r.node} and the driver do not see the same staging folder",
                        path=str(staging),
                        hint="--output must be on storage every node mounts at the same path",
                    )
            return results
        finally:
            if staging is not None:
                for name in staging.glob("probe-*"):  # ours: the staging folder is this run's
                    with contextlib.suppress(OSError):
                        name.unlink()

    # -- convert -------------------------------------------------------------------------------

    def convert_runner(self) -> _ConvertOnRay:
        return _ConvertOnRay(self)

    # -- verify --------------------------------------------------------------------------------

    def verify_runner(self) -> _VerifyOnRay:
        return _VerifyOnRay(self)


def _gather(
    ray: Any,
    refs: Sequence[Any],
    what: Callable[[int], str],
    on_done: Callable[[int, Any], None],
) -> list[Any]:
    """Wait for every task, handing each result to ``on_done(i, result)`` in task order.  On a
    failure of task k the tasks after k are cancelled, the ones before still finish, and the
    error of the first failed task is raised, as a local run, which goes in order, would."""
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    handed = 0
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=_POLL_S)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except Exception as exc:
                    if errors and i > min(errors):
                        continue  # cancelled after the first failure, or a later failure
                    errors[i] = _unwrap(ray, exc, what(i))
                    for later in pending:
                        if index[later] > i:
                            ray.cancel(later, force=True)
                    pending = [r for r in pending if index[r] < i]
            while not errors and handed in results:
                on_done(handed, results[handed])
                handed += 1
    except BaseException:  # Ctrl-C, SIGTERM: no task may go on writing
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(refs))]


class _ConvertOnRay:
    """The :class:`~ninfer_convert.convert.TensorRunner` of ``convert --ray``: one task per
    shard, each writing its payload into the run's staging folder."""

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster

    def __call__(
        self,
        writer: ArtifactWriter,
        plan: Plan,
        source: SourceCheckpoint,
        device: str,
        on_tensor: Callable[[PlanEntry, int], None],
    ) -> RunnerResult:
        if writer.max_shard_size is None:
            raise UsageError(
                "convert --ray needs --max-shard-size: one task writes each shard",
                hint="add e.g. --max-shard-size 5GB (the same flag gives the same bytes locally)",
            )
        ranges = shard_ranges(plan, alignment=writer.alignment,
                              max_shard_size=writer.max_shard_size)  # fmt: skip
        staging = writer.staging
        source_path = os.path.abspath(source.path)
        files = [os.path.abspath(source.file_path(n)) for n, _ in source.files]
        t0 = time.perf_counter()
        with self.cluster.connected() as ray:
            t1 = time.perf_counter()
            probes = self.cluster.preflight(ray, "source", files, staging)
            t2 = time.perf_counter()
            progress = _Progress()
            entries_ref = ray.put(list(plan.entries))
            fn = _ray.remote(
                ray, _write_shard_task, num_cpus=1, num_gpus=1 if device == "cuda" else 0,
                max_retries=self.cluster.max_retries,
            )  # fmt: skip
            tasks = [
                ShardTask(number, start, stop, str(staging), source_path, writer.alignment,
                          device, 1)
                for number, (start, stop) in enumerate(ranges, start=1)
            ]  # fmt: skip
            refs = [fn.remote(task, entries_ref) for task in tasks]
            digests: dict[str, str] = {}
            spot = 0

            def adopt(i: int, result: ShardResult) -> None:
                nonlocal spot
                task = tasks[i]
                mine = plan.entries[task.start : task.stop]
                got = [(t.name, t.format, t.shape) for t in result.tensors]
                want = [(e.output, e.format, tuple(e.shape)) for e in mine]
                if result.number != task.number or got != want:
                    raise NinferError(f"shard task {task.number} returned other tensors than "
                                      "planned")  # fmt: skip
                writer.adopt_shard(
                    staging / payload_name(task.number),
                    payload_end=result.payload_end,
                    tensors=result.tensors,
                )
                digests.update(result.source_digests)
                spot += result.spot_rows
                progress.add(
                    result.node, len(mine), result.source_bytes, result.seconds, result.cpu_s
                )
                for entry, tensor in zip(mine, result.tensors, strict=True):
                    on_tensor(entry, sum(p.nbytes for p in tensor.planes))

            _gather(ray, refs, lambda i: f"shard task {i + 1}", adopt)
            t3 = time.perf_counter()
        # Killed attempts' partial files (ours: this run's staging); one may remove its own.
        for left in staging.glob("*.attempt"):
            left.unlink(missing_ok=True)
        return RunnerResult(
            source_digests=digests,
            spot_checked_rows=spot,
            details={
                "ray": {
                    "address": self.cluster.address,
                    "shard_tasks": len(tasks),
                    "probed_nodes": sorted(p.node.rsplit(":", 1)[0] for p in probes),
                    "nodes": progress.to_json(),
                    "connect_s": round(t1 - t0, 3),
                    "preflight_s": round(t2 - t1, 3),
                    "tasks_s": round(t3 - t2, 3),
                }
            },
        )


def _write_shard_task(task: ShardTask, entries: list[PlanEntry]) -> ShardResult:
    return write_shard(task, entries)


def _split(names: list[str], weights: Sequence[int], parts: int) -> list[list[str]]:
    """``names`` in order, cut into at most ``parts`` consecutive runs of similar weight."""
    total = sum(weights) or 1
    runs: list[list[str]] = [[]]
    acc = 0
    for name, w in zip(names, weights, strict=True):
        if runs[-1] and acc >= total * len(runs) / parts:
            runs.append([])
        runs[-1].append(name)
        acc += w
    return [r for r in runs if r]


class _VerifyOnRay:
    """The tensor checks of ``verify --ray``: consecutive runs of tensors, one task each."""

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster

    def __call__(
        self,
        artifact: Path,
        artifact_files: list[str],
        source_files: list[str],
        names: list[str],
        weights: list[int],
        options: CheckOptions,
        on_done: Callable[[int], None],
    ) -> list[TensorOutcome]:
        with self.cluster.connected() as ray:
            self.cluster.preflight(ray, "artifact or source", artifact_files + source_files)
            cpus = int(ray.cluster_resources().get("CPU", 1))
            runs = _split(names, weights, max(1, 2 * cpus))
            fn = _ray.remote(ray, check_tensors, num_cpus=1, max_retries=self.cluster.max_retries)
            refs = [fn.remote(str(artifact), run, options) for run in runs]
            out: list[TensorOutcome] = []

            def collect(i: int, outcomes: list[TensorOutcome]) -> None:
                out.extend(outcomes)
                on_done(len(out))

            _gather(ray, refs, lambda i: f"verify task {i + 1}", collect)
        return out
