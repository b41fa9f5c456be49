"""``verify``: prove an artifact is exactly what its recipe promised (docs/cli.md).

Contract of :func:`verify_artifact`:

* It raises only for a usage problem: a missing artifact path, a path that is not recognisably
  an artifact (:func:`~ninfer_convert.container.check_artifact_path`), a ``source`` path that
  does not exist, or a bad option (:class:`~ninfer_convert.errors.UsageError`, exit code 2).
  Everything else is a :class:`~.report.Finding` in the returned
  :class:`~.report.VerifyReport`; no check stops at its first problem, and a failing check does
  not stop later checks that can still run.
* Checks, reported in this order: ``structure`` (everything :func:`open_artifact` validates,
  and no stray container file in the directory), ``integrity``
  (:meth:`Artifact.integrity_problems`, the plane digests taken per tensor by the workers, and
  ``recipe.digest`` against the recorded recipe text), ``padding``
  (:meth:`Artifact.padding_problems`), ``values`` (:func:`~ninfer_convert.validate.
  logical_problems` of every tensor), then against the source when one is used:
  ``source-identity`` (recorded weight files and sizes, ``config``, the side-file list with
  sizes and digests, per-tensor dtype, shape and digest), ``source-words`` (every
  tensor equals :func:`ninfer_convert.derive.derive_logical` of its plan entry bit for bit: the
  re-encode of grouped tensors with their encoder profile, the copied NVFP4 / FP8 words, direct
  words with the recorded conversion re-applied, re-derived concat/transpose) and
  ``oracle-sample`` (sampled groups of every grouped tensor re-encoded with the exact reference
  of its encoder profile).
  Error statistics of every quantized tensor follow; they are information only.
* The source is ``source`` when given, else the recorded snapshot ``repo.id@repo.commit``
  (resolved through the Hugging Face cache) for a repo-id source, else the recorded
  ``source.path``.  Only ``use_recorded_source=False`` (``--no-source``) skips the source
  checks; a recorded source that cannot be found is a ``source-identity`` finding
  (:class:`~ninfer_convert.errors.SourceError`, exit 4), so skipped source checks never end in
  exit 0 by accident.  :attr:`~.report.VerifyReport.not_run` lists every skipped check.  The
  plan is rebuilt from the recorded recipe text against that source.  A tensor whose source
  digest differs from the recorded one is reported under ``source-identity`` (exit 4) and is
  not compared word by word.
* Memory: the per-tensor checks run on a pool of ``jobs`` threads, each holding one tensor
  (its re-derivation, its packed planes, its source words) at a time, with convert's rule for
  bytes in flight (at most the largest tensor's source bytes, or 256 MiB when that is larger;
  a larger tensor runs alone); numpy, xxhash and the encoders release the GIL.  A re-derived
  tensor is packed with its layout and compared with the stored planes byte for byte one row
  block at a time, digesting the stored slices on the way (grouped tensors on the host, and
  direct formats and copy paths on every device: their planes are never built, and such a
  tensor is admitted at no cost); only a tensor that differs is derived whole, decoded by the
  reader and compared word by word.  The stored planes and source bytes of the tensors ahead
  are read into the page cache in the background (:mod:`ninfer_convert.readahead`).
  Consecutive small tensors (:func:`ninfer_convert.scheduler.batches`, the scheduler convert
  uses too) are checked by one worker task: its direct copies (:mod:`.copy_runs`: stored
  words that are the source bytes as they are) as one unit, with one ``pread`` per run of
  neighbouring source tensors and one digest per tensor for its source and plane digests;
  any other tensor, and any copy that differs, one after the other on its own, so each
  finding is the per-tensor path's, for its tensor.  At most
  :data:`~ninfer_convert.scheduler.MAX_INFLIGHT_ITEMS` tasks are submitted at a time.  Results
  are deterministic: findings are ordered by check, then by stored tensor order, whatever the
  scheduling.
* ``progress`` (optional) receives :class:`ProgressEvent` values from the calling thread and
  from the workers; it must be thread-safe and cheap.
* ``tensor_checks`` (optional, ``verify --ray``: :mod:`ninfer_convert.cluster`) runs the
  per-tensor checks in other processes (:mod:`.remote`); their outcomes are merged exactly as
  local ones, so the report is the same.

This module is the driver: it opens the artifact, runs the checks in order and assembles the
report.  The checks live in :mod:`.artifact_checks` (beyond the reader's), :mod:`.prepare` (the
source, the plan and the header against it), :mod:`.source_identity`, :mod:`.tensor_checks`
(one tensor), :mod:`.runner` (every tensor, on the scheduler) and :mod:`.remote` (every
tensor, in other processes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from ..container import Artifact, check_artifact_path, open_artifact
from ..container.schema import paused_gc
from ..errors import ArtifactError, UsageError
from .artifact_checks import (
    artifact_level_findings,
    importance_findings,
    recipe_digest_findings,
)
from .prepare import Prepared, prepare_source
from .remote import CheckOptions, TensorChecks, absolute_source, remote_outcomes
from .report import CheckResult, Finding, SourceUse, VerifyReport, checks_in_order
from .runner import run_tensors
from .source_identity import unused_source_digests
from .tensor_checks import TensorOutcome

__all__ = [
    "DEFAULT_ORACLE_GROUPS",
    "DEFAULT_SEED",
    "ProgressEvent",
    "verify_artifact",
]

DEFAULT_ORACLE_GROUPS = 16
"""Groups per grouped tensor re-encoded with the exact reference of its encoder profile (the
cost per group of each profile: docs/cli.md, verify `--oracle-groups`)."""
DEFAULT_SEED = 0x5EED
"""Seed of the oracle group sample; with the tensor name it fixes the groups chosen."""


@dataclass(frozen=True)
class ProgressEvent:
    """``phase`` is 'open', 'integrity', 'padding', 'plan' or 'tensors'; ``done``/``total``
    count tensors (bytes for 'integrity'), ``item`` names the tensor just finished."""

    phase: str
    done: int
    total: int
    item: str | None = None


ProgressCallback = Callable[[ProgressEvent], None]


class _Emit(Protocol):
    def __call__(self, phase: str, done: int, total: int, item: str | None = None) -> None: ...


@dataclass(frozen=True)
class _Options:
    source: str | os.PathLike[str] | None
    use_recorded_source: bool
    device: str
    jobs: int
    oracle_groups: int
    seed: int


@dataclass
class _Run:
    """What the checks of an opened artifact found (the artifact is closed after them)."""

    names: list[str]
    total_bytes: int
    structure: list[Finding]
    integrity: list[Finding]
    """The reader's header, index, gap and side-file findings and verify's own, in the
    reader's order (:meth:`~ninfer_convert.container.Artifact.integrity_order`)."""
    padding: list[Finding]
    prepared: Prepared
    outcomes: list[TensorOutcome]


def _source_exists(spec: str) -> bool:
    from ..source.hf_cache import looks_like_repo_id

    return Path(spec).expanduser().exists() or looks_like_repo_id(spec)


def _status(findings: list[Finding]) -> Literal["pass", "fail"]:
    return "fail" if findings else "pass"


def verify_artifact(
    artifact: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    use_recorded_source: bool = True,
    device: str = "auto",
    jobs: int = 2,
    oracle_groups: int = DEFAULT_ORACLE_GROUPS,
    seed: int = DEFAULT_SEED,
    progress: ProgressCallback | None = None,
    tensor_checks: TensorChecks | None = None,
) -> VerifyReport:
    """Run every check (see the module contract) and return the report; ``tensor_checks``
    runs the per-tensor checks elsewhere (``verify --ray``), with the same report."""
    started = time.perf_counter()
    options = _Options(source, use_recorded_source, device, jobs, oracle_groups, seed)
    path = _checked_options(artifact, options)
    settings: dict[str, Any] = {
        "jobs": jobs,
        "device": device,
        "oracle_groups": oracle_groups,
        "seed": seed,
        "device_used": None,
    }

    def emit(phase: str, done: int, total: int, item: str | None = None) -> None:
        if progress is not None:
            progress(ProgressEvent(phase, done, total, item))

    timings: dict[str, float] = {}
    # As in convert, the collector is paused for the whole run (open, source plan, padding,
    # tensors): nothing built per tensor is cyclic.  The artifact and the run are dropped
    # (freed by reference counting) before it resumes, so its first pass looks at the report,
    # not at every header and plan entry of the run.
    with paused_gc():
        t0 = time.perf_counter()
        emit("open", 0, 1)
        try:
            art = open_artifact(path, check_header_digest=False)
        except ArtifactError as exc:
            timings["open"] = time.perf_counter() - t0
            return _unopened_report(path, source, exc, started, settings, timings)
        with art:
            timings["open"] = time.perf_counter() - t0
            emit("open", 1, 1)
            elsewhere = None if tensor_checks is None else (tensor_checks, path)
            run = _run_checks(art, options, emit, timings, settings, elsewhere)
        report = _report(path, run, started, settings, timings)
        del art, run
    return report


def _report(
    path: Path, run: _Run, started: float, settings: dict[str, Any], timings: dict[str, float]
) -> VerifyReport:
    results = _results(run)
    return VerifyReport(
        artifact=str(path),
        source=run.prepared.use,
        checks=checks_in_order(results),
        statistics=tuple(o.stats for o in run.outcomes if o.stats is not None),
        tensors=len(run.names),
        bytes=run.total_bytes,
        seconds=time.perf_counter() - started,
        settings=settings,
        timings=timings,
    )


def _checked_options(artifact: str | os.PathLike[str], options: _Options) -> Path:
    """The artifact's path, after every usage check of the options (UsageError, exit 2)."""
    jobs, oracle_groups, device, source = (
        options.jobs, options.oracle_groups, options.device, options.source
    )  # fmt: skip
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"jobs must be a positive integer, not {jobs!r}")
    if isinstance(oracle_groups, bool) or not isinstance(oracle_groups, int) or oracle_groups < 0:
        raise UsageError(f"oracle_groups must be a non-negative integer, not {oracle_groups!r}")
    if device not in ("auto", "cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}", hint="use auto, cpu or cuda")
    path = check_artifact_path(artifact)
    if device == "cuda":
        from ..derive import resolve_device

        resolve_device(device)  # a usage error without a GPU, before any check runs
    if source is not None and not _source_exists(os.fspath(source)):
        raise UsageError(
            "no such source file or directory",
            path=os.fspath(source),
            hint="pass the model directory, a .safetensors file, or a cached org/name",
        )
    return path


def _unopened_report(
    path: Path,
    source: str | os.PathLike[str] | None,
    exc: ArtifactError,
    started: float,
    settings: dict[str, Any],
    timings: dict[str, float],
) -> VerifyReport:
    """The report of an artifact that does not open: one ``structure`` finding, the rest
    skipped."""
    finding = Finding.of("structure", exc)
    skipped = "not run: the artifact could not be opened"
    checks = [CheckResult("structure", "fail", 0, (finding,))] + [
        CheckResult(name, "skipped", 0, (), skipped)
        for name in ("integrity", "padding", "values", "source-identity", "source-words",
                     "oracle-sample")
    ]  # fmt: skip
    return VerifyReport(
        artifact=str(path),
        source=SourceUse(None if source is None else os.fspath(source), "none", False,
                         skipped),
        checks=tuple(checks),
        statistics=(),
        tensors=0,
        bytes=0,
        seconds=time.perf_counter() - started,
        settings=settings,
        timings=timings,
    )  # fmt: skip


def _run_checks(
    art: Artifact,
    options: _Options,
    emit: _Emit,
    timings: dict[str, float],
    settings: dict[str, Any],
    elsewhere: tuple[TensorChecks, Path] | None = None,
) -> _Run:
    """Every check of the opened artifact, in order, each phase timed and reported (the
    per-tensor ones by ``elsewhere``'s checks, given the path the artifact was opened from)."""
    names = list(art.tensors)
    total_bytes = art.total_bytes()
    structure = artifact_level_findings(art)

    t0 = time.perf_counter()
    emit("integrity", 0, total_bytes)
    # Header, index, gap and side-file digests here; each tensor's plane digests are
    # checked by the worker that re-derives it, so those reads overlap the encoding.
    integrity = (
        [Finding.of("integrity", e) for e in art.integrity_problems(plane_digests=False)]
        + recipe_digest_findings(art)
        + importance_findings(art)
    )
    timings["integrity"] = time.perf_counter() - t0
    emit("integrity", total_bytes, total_bytes)

    t0 = time.perf_counter()
    emit("padding", 0, len(names))
    padding = [Finding.of("padding", e) for e in art.padding_problems()]
    timings["padding"] = time.perf_counter() - t0
    emit("padding", len(names), len(names))

    t0 = time.perf_counter()
    emit("plan", 0, 1)
    prepared = prepare_source(
        art, options.source, options.use_recorded_source, options.device, options.jobs,
        options.oracle_groups, options.seed,
    )  # fmt: skip
    timings["plan"] = time.perf_counter() - t0
    emit("plan", 1, 1)
    if prepared.ctx is not None:
        settings["device_used"] = prepared.ctx.device

    t0 = time.perf_counter()
    if elsewhere is not None:
        checks, path = elsewhere
        remote = CheckOptions(absolute_source(options.source), options.use_recorded_source,
                              options.device, options.jobs, options.oracle_groups,
                              options.seed)  # fmt: skip
        outcomes = remote_outcomes(checks, path, art, names, prepared.ctx, emit, remote)
    else:
        outcomes = run_tensors(art, names, prepared.ctx, options.jobs, emit)
    if prepared.ctx is not None:
        prepared.identity += unused_source_digests(prepared.ctx, art)
    timings["tensors"] = time.perf_counter() - t0
    # The workers' plane-digest findings go where Artifact.integrity_problems() would list them.
    integrity += [f for o in outcomes for f in o.integrity or ()]
    integrity.sort(key=lambda f: art.integrity_order(f.path, f.tensor))
    return _Run(names, total_bytes, structure, integrity, padding, prepared, outcomes)


def _results(run: _Run) -> list[CheckResult]:
    """The check results of a run, in report order."""
    names, outcomes, integrity = run.names, run.outcomes, run.integrity
    values = [f for o in outcomes for f in o.values]
    return [
        CheckResult("structure", _status(run.structure), len(names), tuple(run.structure)),
        CheckResult("integrity", _status(integrity), len(names), tuple(integrity)),
        CheckResult("padding", _status(run.padding), len(names), tuple(run.padding)),
        CheckResult("values", _status(values), len(names), tuple(values)),
        *_source_results(run.prepared, outcomes, len(names)),
    ]


def _source_results(prepared: Prepared, outcomes: list[TensorOutcome], n: int) -> list[CheckResult]:
    """``source-identity``, ``source-words`` and ``oracle-sample``; when the source was not
    compared, a check with findings (why it could not run) fails and the others are skipped."""
    identity = prepared.identity + [f for o in outcomes for f in o.identity]
    words = prepared.words + [f for o in outcomes for f in o.words]
    oracle = [f for o in outcomes for f in o.oracle]
    if not prepared.use.compared:
        reason = prepared.use.reason
        return [
            CheckResult("source-identity", _status(identity) if identity else "skipped", 0,
                        tuple(identity), reason),
            CheckResult("source-words", _status(words) if words else "skipped", 0, tuple(words),
                        reason),
            CheckResult("oracle-sample", "skipped", 0, (), reason),
        ]  # fmt: skip
    compared = sum(1 for o in outcomes if o.compared)
    groups = sum(o.oracle_groups for o in outcomes)
    sampled = sum(1 for o in outcomes if o.oracle_groups)
    not_compared = n - compared
    return [
        CheckResult("source-identity", _status(identity), n, tuple(identity)),
        CheckResult(
            "source-words",
            _status(words),
            compared,
            tuple(words),
            f"{not_compared} tensor(s) not compared" if not_compared else "",
        ),
        CheckResult(
            "oracle-sample",
            _status(oracle),
            sampled,
            tuple(oracle),
            f"{groups} group(s) in {sampled} tensor(s)",
        ),
    ]
