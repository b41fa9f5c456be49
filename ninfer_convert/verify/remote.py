"""The per-tensor checks of ``verify`` run in other processes (``verify --ray``,
:mod:`ninfer_convert.cluster`), with the same outcomes as :func:`~.runner.run_tensors`.

Contract:

* :func:`check_tensors` is what another process runs: it opens the artifact, prepares the
  source (:func:`~.prepare.prepare_source`, the same rules as the driver) and checks ``names``
  with :func:`~.runner.run_tensors`, returning their outcomes in that order.
* A :class:`TensorChecks` runs :func:`check_tensors` over runs of consecutive stored tensors
  somewhere else and returns every outcome in stored order; :func:`remote_outcomes` (the
  driver side) hands it what the workers need (the artifact's and the source's files, for
  their pre-flight, and each tensor's stored plus source bytes, to cut the runs) and checks
  that the outcomes are for exactly the names asked for.  The report is then assembled from
  them exactly as from local outcomes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..container import Artifact, open_artifact
from ..container.schema import paused_gc
from ..errors import NinferError
from .prepare import prepare_source
from .runner import Emit, run_tensors
from .tensor_checks import SourceContext, TensorOutcome

__all__ = ["CheckOptions", "TensorChecks", "check_tensors", "remote_outcomes"]


@dataclass(frozen=True)
class CheckOptions:
    """The settings of the per-tensor checks, as :func:`~.engine.verify_artifact` takes them
    (``source`` absolute, or a repo id, so another process in another folder finds it)."""

    source: str | None
    use_recorded_source: bool
    device: str
    jobs: int
    oracle_groups: int
    seed: int


def check_tensors(artifact: str, names: list[str], options: CheckOptions) -> list[TensorOutcome]:
    """The per-tensor checks of ``names`` (in that order), in this process."""
    with open_artifact(Path(artifact), check_header_digest=False) as art:
        prepared = prepare_source(art, options.source, options.use_recorded_source,
                                  options.device, options.jobs, options.oracle_groups,
                                  options.seed)  # fmt: skip
        with paused_gc():  # as in the driver: nothing built per tensor is cyclic
            return run_tensors(art, names, prepared.ctx, options.jobs, _no_progress)


def _no_progress(phase: str, done: int, total: int, item: str | None) -> None:
    return None


class TensorChecks(Protocol):
    """Runs the per-tensor checks somewhere else: given the artifact, the files the checks
    read (artifact, source), the stored tensor names with their stored plus source bytes, and
    the options, returns one outcome per name in the same order (each as
    :func:`check_tensors` gives it); ``on_done(count)`` after each finished run of tensors."""

    def __call__(
        self,
        artifact: Path,
        artifact_files: list[str],
        source_files: list[str],
        names: list[str],
        weights: list[int],
        options: CheckOptions,
        on_done: Callable[[int], None],
    ) -> list[TensorOutcome]: ...


def absolute_source(source: str | os.PathLike[str] | None) -> str | None:
    """``source`` as another process in another folder finds it (a repo id stays one)."""
    if source is None:
        return None
    path = Path(source).expanduser()
    return str(path.absolute()) if path.exists() else os.fspath(source)


def remote_outcomes(
    checks: TensorChecks,
    artifact: Path,
    art: Artifact,
    names: list[str],
    ctx: SourceContext | None,
    emit: Emit,
    options: CheckOptions,
) -> list[TensorOutcome]:
    """The outcomes of ``names`` from ``checks`` (``artifact``: the path ``art`` was opened
    from), with the driver's progress events."""
    source_files: list[str] = []
    if ctx is not None:
        source_files = [os.path.abspath(ctx.source.file_path(n)) for n, _ in ctx.source.files]
    entries = {} if ctx is None else ctx.entries
    weights = [
        art.tensors[n].nbytes + (entries[n].source_bytes if n in entries else 0) for n in names
    ]
    emit("tensors", 0, len(names), None)
    outcomes = checks(
        artifact.absolute(), [os.path.abspath(f) for f in art.files], source_files,
        names, weights, options,
        lambda count: emit("tensors", count, len(names), names[count - 1]),
    )  # fmt: skip
    if [o.name for o in outcomes] != names:
        raise NinferError("the remote tensor checks returned other tensors than asked for")
    return outcomes
