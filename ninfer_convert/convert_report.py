"""What ``ninfer convert`` hands back: its progress events, its report and the output check of
a dry run (docs/cli.md "convert --json" and "convert --dry-run --json" for the JSON forms).

Contract: plain frozen records; ``to_dict`` gives the JSON objects the CLI prints, and nothing
here reads a file or a clock.  :mod:`~ninfer_convert.convert` builds them and exports them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .container.publish import Destination
from .recipe import Plan
from .signing import SignatureStatus

__all__ = ["ConvertReport", "OutputCheck", "ProgressEvent"]


@dataclass(frozen=True)
class ProgressEvent:
    """Emitted after each tensor is written (and once at the start with ``done == 0``)."""

    tensor: str | None
    done: int
    total: int
    source_bytes_done: int
    source_bytes_total: int
    written_bytes: int
    elapsed_s: float


@dataclass(frozen=True)
class ConvertReport:
    output: Path
    plan: Plan
    device: str
    jobs: int
    tensors: int
    source_bytes: int
    written_bytes: int
    files: tuple[str, ...]
    elapsed_s: float
    spot_checked_rows: int = 0
    signature: SignatureStatus | None = None
    notices: tuple[str, ...] = ()
    """Stale staging folders restored or removed, remains kept (one line each)."""
    runner: dict[str, Any] | None = None
    """The :class:`~ninfer_convert.convert.TensorRunner`'s details, when one stored the tensors."""

    def to_dict(self) -> dict[str, Any]:
        # Only the plan's totals and warnings: its entries (a dict per tensor) are not part of
        # the report.
        plan = self.plan
        return {
            "output": str(self.output),
            "recipe": {"name": self.plan.recipe.name, "digest": self.plan.recipe.digest},
            "source": os.path.abspath(self.plan.source_path),
            "device": self.device,
            "jobs": self.jobs,
            "tensors": self.tensors,
            "skipped": len(self.plan.skipped),
            "source_bytes": self.source_bytes,
            "written_bytes": self.written_bytes,
            "files": list(self.files),
            "elapsed_s": round(self.elapsed_s, 3),
            "throughput_source_bytes_per_s": (
                round(self.source_bytes / self.elapsed_s) if self.elapsed_s > 0 else None
            ),
            "totals": plan.totals_dict(),
            "spot_checked_rows": self.spot_checked_rows,
            "warnings": plan.warnings_list(),
            "signature": None if self.signature is None else self.signature.to_json(),
            "notices": list(self.notices),
            **({} if self.runner is None else {"runner": self.runner}),
        }


@dataclass(frozen=True)
class OutputCheck:
    """What writing the plan to an output would do (``convert --dry-run --output``)."""

    destination: Destination
    needed_bytes: int
    free_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.destination.to_dict(),
            "needed_bytes": self.needed_bytes,
            "free_bytes": self.free_bytes,
        }
