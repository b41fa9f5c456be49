"""How a conversion's tensors reach the writer, whoever stores them: the progress tally the
local pipeline and a :class:`TensorRunner` both feed, and the runner seam itself.

Contract: :class:`Tally` counts the tensors stored, in plan order, and sends a
:class:`~.convert_report.ProgressEvent` after each (and once before the first).  A
:class:`TensorRunner` (``convert --ray``: :mod:`ninfer_convert.cluster`) stores every plan entry
in the writer instead of the local pipeline, byte for byte the same, calls
``on_tensor(entry, stored_bytes)`` for each in plan order and returns a :class:`RunnerResult`;
everything else (the plan, the destination checks, side files, metadata, the signature, the
publish) stays :func:`~ninfer_convert.convert.convert_checkpoint`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .container import ArtifactWriter
from .convert_report import ProgressEvent
from .recipe import Plan, PlanEntry
from .source import SourceCheckpoint

__all__ = ["RunnerResult", "Tally", "TensorRunner"]


@dataclass(frozen=True)
class RunnerResult:
    """What a :class:`TensorRunner` did: the source digests of the tensors it read, the rows it
    spot-checked and free-form details for the report (``--json`` ``"runner"``)."""

    source_digests: dict[str, str]
    spot_checked_rows: int
    details: dict[str, Any]


class TensorRunner(Protocol):
    """Stores the plan's tensors in ``writer`` some other way than the local pipeline (see the
    module contract)."""

    def __call__(
        self,
        writer: ArtifactWriter,
        plan: Plan,
        source: SourceCheckpoint,
        device: str,
        on_tensor: Callable[[PlanEntry, int], None],
    ) -> RunnerResult: ...


class Tally:
    """What the calling thread has completed so far, and the :class:`ProgressEvent` it sends
    after each tensor (and once before the first)."""

    def __init__(
        self, plan: Plan, started: float, progress: Callable[[ProgressEvent], None] | None
    ) -> None:
        self.total = len(plan.entries)
        self.total_bytes = sum(e.source_bytes for e in plan.entries)
        self.started = started
        self.progress = progress
        self.done = 0
        self.done_bytes = 0
        self.written = 0
        self.spot_rows = 0

    def stored_run(self, entries: Sequence[PlanEntry], written: Sequence[int]) -> None:
        """Consecutive tensors stored (``written[i]`` plane bytes each), in plan order: the
        same counts and events as :meth:`stored` of each."""
        if self.progress is not None:
            for entry, nbytes in zip(entries, written, strict=True):
                self.stored(entry, nbytes)
            return
        self.written += sum(written)
        self.done += len(entries)
        self.done_bytes += sum(e.source_bytes for e in entries)

    def stored(self, entry: PlanEntry, written: int) -> None:
        """One more tensor stored (``written`` plane bytes), in plan order."""
        self.written += written
        self.done += 1
        self.done_bytes += entry.source_bytes
        if self.progress is not None:  # no call per tensor without a listener
            self.emit(entry.output)

    def emit(self, name: str | None) -> None:
        if self.progress is not None:
            self.progress(
                ProgressEvent(
                    name, self.done, self.total, self.done_bytes, self.total_bytes,
                    self.written, time.perf_counter() - self.started,
                )
            )  # fmt: skip
