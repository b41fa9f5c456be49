"""``cluster``: ``convert --ray`` and ``verify --ray``, the same work on a Ray cluster.

Data flows as on one machine; only where the tensors are derived changes.

* ``convert``: the driver plans exactly as a local run (every recipe and source error comes
  before any work), opens the artifact writer (lock, stale-staging recovery, destination and
  free-space checks, the staging folder next to the output), splits the plan into shards on the
  writer's own ``--max-shard-size`` boundaries (:func:`shard_ranges`; ``--ray`` requires that
  flag) and runs one Ray task per shard (:func:`.tasks.write_shard`).  Each task opens the
  source itself, writes its shard's payload under a per-attempt name in the staging folder and
  renames it when complete; the driver checks every result (the tensors planned, the payload's
  size, every header entry's geometry and offsets: :meth:`~ninfer_convert.container.
  ArtifactWriter.adopt_shard`), and the writer then appends the headers, writes the index and
  publishes with the crash-safe rules of a local run.  The bytes equal a local run's with the
  same flags (tests/test_cluster.py).
* ``verify``: the artifact-level checks run on the driver; the per-tensor checks run as tasks
  over consecutive runs of tensors (:func:`~ninfer_convert.verify.remote.check_tensors`), merged
  in stored order into the same report.
* Before any task: on every live node, one probe (:func:`.tasks.probe`) checks the package
  version, the sizes and header digests of the files the tasks read, and (convert) that the
  node sees the driver's token in the staging folder and can write a probe file the driver
  reads back (shared storage).  A problem is a typed error: UsageError (version, storage not
  shared), SourceError (different source bytes), ResourceError (staging not writable).
* Failures: a task whose worker or node dies is retried by Ray (``max_retries``); a task that
  fails for a user reason raises the same typed error as a local run (unwrapped from Ray's
  wrapper; the error of the first failing shard in plan order), later tasks are cancelled and
  the writer removes the staging folder: nothing appears under the output name.
* Ray is imported only by :mod:`._ray` (optional extra ``ray``); without it a
  :class:`RayCluster` is a UsageError naming the extra.
"""

from __future__ import annotations

from ._ray import RAY_EXTRA
from .driver import DEFAULT_MAX_RETRIES, RayCluster, shard_ranges

__all__ = ["DEFAULT_MAX_RETRIES", "RAY_EXTRA", "RayCluster", "shard_ranges"]
