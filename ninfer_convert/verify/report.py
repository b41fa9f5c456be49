"""The result of ``verify``: checks in order, every finding, error statistics, timings.

Contract: everything here is plain data (frozen dataclasses), built by :mod:`.engine` and never
printed by the library.  :meth:`VerifyReport.to_json` returns the documented, stable JSON object
(``schema_version`` :data:`VERIFY_SCHEMA_VERSION`, docs/cli.md "verify --json"); a field is only
ever added in a new minor revision of that schema, never renamed or removed.

Exit codes follow :mod:`ninfer_convert.errors`: 0 when every check passed, 6
(:class:`~ninfer_convert.errors.ArtifactError`) when any finding is about the artifact, else 4
(:class:`~ninfer_convert.errors.SourceError`) when the only findings say the source is not the
recorded one.  Error statistics are information and never change the exit code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ArtifactError, NinferError, SourceError

__all__ = [
    "CHECK_DESCRIPTIONS",
    "CHECK_ORDER",
    "VERIFY_SCHEMA_VERSION",
    "CheckResult",
    "CheckStatus",
    "Finding",
    "Mismatch",
    "SourceUse",
    "TensorErrorStats",
    "VerifyReport",
]

VERIFY_SCHEMA_VERSION = 1
"""Version of the ``verify --json`` object; bumped only for an incompatible change."""

CheckStatus = Literal["pass", "fail", "skipped"]

CHECK_ORDER: tuple[str, ...] = (
    "structure",
    "integrity",
    "padding",
    "values",
    "source-identity",
    "source-words",
    "oracle-sample",
)
"""The checks in the order they are reported (docs/cli.md "What it checks")."""

CHECK_DESCRIPTIONS: dict[str, str] = {
    "structure": "header schema, registry identities, geometry, placement, shard identity "
    "and index, no stray container files",
    "integrity": "header, plane, shard, side-file and recipe digests; zero gap bytes",
    "padding": "canonical layout padding is all zero bits",
    "values": "value invariants of spec Sections 3-6 (codes, scales, divisor)",
    "source-identity": "the source is the recorded one (files, config, side files, per-tensor "
    "dtype, shape, digest)",
    "source-words": "every tensor equals its re-derivation from the source, bit for bit",
    "oracle-sample": "sampled groups re-encoded with the bit-level oracle match the artifact",
}


@dataclass(frozen=True)
class Mismatch:
    """The first differing word of one plane of one tensor, and how many differ in total.

    ``plane`` is a logical field ('words', 'codes', 'scales', 'divisor'); ``index`` is the
    coordinate in that field's logical array.  ``row``/``group``/``column`` are filled where
    they apply.  ``expected`` and ``found`` are the words as integers (signed codes for grouped
    formats, unsigned words otherwise); ``expected_text``/``found_text`` are display forms.
    """

    tensor: str
    plane: str
    index: tuple[int, ...]
    row: int | None
    group: int | None
    column: int | None
    expected: int
    found: int
    expected_text: str
    found_text: str
    count: int
    total: int

    def describe(self) -> str:
        where = []
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.group is not None:
            where.append(f"group {self.group}")
        if self.column is not None:
            where.append(f"column {self.column}")
        if not where:
            where.append(f"index {list(self.index)}")
        return (
            f"{self.plane} {', '.join(where)}: expected {self.expected_text}, found "
            f"{self.found_text} ({self.count} of {self.total} differ)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "plane": self.plane,
            "index": list(self.index),
            "row": self.row,
            "group": self.group,
            "column": self.column,
            "expected": self.expected,
            "found": self.found,
            "expected_text": self.expected_text,
            "found_text": self.found_text,
            "count": self.count,
            "total": self.total,
        }


@dataclass(frozen=True)
class Finding:
    """One problem.  ``error`` is the class name of the typed error it corresponds to, ``kind``
    its stable failure kind (:data:`ninfer_convert.errors.KINDS`); ``rule`` and ``where`` are
    the error's normative rule and location."""

    check: str
    error: str
    exit_code: int
    message: str
    path: str | None = None
    tensor: str | None = None
    mismatch: Mismatch | None = None
    kind: str = NinferError.default_kind
    rule: str | None = None
    where: str | None = None

    @staticmethod
    def of(check: str, exc: NinferError, mismatch: Mismatch | None = None) -> Finding:
        return Finding(
            check=check,
            error=type(exc).__name__,
            exit_code=exc.exit_code,
            message=exc.message + (f" ({exc.hint})" if exc.hint else ""),
            path=exc.path,
            tensor=exc.tensor,
            mismatch=mismatch,
            kind=exc.kind,
            rule=exc.rule,
            where=exc.where,
        )

    def render(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path)
        if self.tensor is not None:
            where.append(f"tensor {self.tensor!r}")
        if self.where is not None:
            where.append(self.where)
        if self.rule is not None:
            where.append(f"rule {self.rule}")
        return (": ".join(where) + ": " if where else "") + self.message

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "error": self.error,
            "kind": self.kind,
            "exit_code": self.exit_code,
            "message": self.message,
            "path": self.path,
            "tensor": self.tensor,
            "rule": self.rule,
            "where": self.where,
            "mismatch": None if self.mismatch is None else self.mismatch.to_json(),
        }


@dataclass(frozen=True)
class CheckResult:
    """One check: its status, how many tensors it covered, its findings, and a note."""

    name: str
    status: CheckStatus
    tensors: int
    findings: tuple[Finding, ...]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": CHECK_DESCRIPTIONS.get(self.name, ""),
            "status": self.status,
            "tensors": self.tensors,
            "findings": [f.to_json() for f in self.findings],
            "note": self.note,
        }


@dataclass(frozen=True)
class TensorErrorStats:
    """Quantization error of one tensor against its source values (information only).

    ``sqnr_db`` is ``10 * log10(sum(x^2) / sum((x - x_hat)^2))``; it is ``None`` when the
    error is exactly zero (infinite SQNR), and also when the signal is all zero.
    """

    tensor: str
    format: str
    numel: int
    max_abs_error: float
    rms_error: float
    sqnr_db: float | None
    exact: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "format": self.format,
            "numel": self.numel,
            "max_abs_error": _finite_or_none(self.max_abs_error),
            "rms_error": _finite_or_none(self.rms_error),
            "sqnr_db": None if self.sqnr_db is None else _finite_or_none(self.sqnr_db),
            "exact": self.exact,
        }

    @property
    def sort_key(self) -> float:
        """Lower is worse: the SQNR, +inf for an exact tensor."""
        return math.inf if self.sqnr_db is None else self.sqnr_db


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class SourceUse:
    """Which source verify compared against, and why (or why not)."""

    path: str | None
    origin: Literal["argument", "recorded", "none"]
    compared: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "origin": self.origin,
            "compared": self.compared,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class VerifyReport:
    """Everything ``verify`` found; print-free.  See the module docstring for exit codes."""

    artifact: str
    source: SourceUse
    checks: tuple[CheckResult, ...]
    statistics: tuple[TensorErrorStats, ...]
    tensors: int
    bytes: int
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase: 'open', 'integrity', 'padding', 'plan', 'tensors'."""

    WORST_SHOWN = 10

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks for f in c.findings]

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def exit_code(self) -> int:
        codes = {f.exit_code for f in self.findings}
        if not codes:
            return 0
        if ArtifactError.exit_code in codes:
            return ArtifactError.exit_code
        if SourceError.exit_code in codes:
            return SourceError.exit_code
        return max(codes)

    @property
    def not_run(self) -> list[tuple[str, str]]:
        """(check, reason) of every check that did not run (status ``skipped``).  Skipped
        checks end in exit 0 only with ``--no-source``: source checks that cannot run for any
        other reason come with a failing ``source-identity`` finding, and an artifact that
        cannot be opened fails ``structure``."""
        return [(c.name, c.note) for c in self.checks if c.status == "skipped"]

    @property
    def first_mismatch(self) -> Mismatch | None:
        for f in self.findings:
            if f.mismatch is not None:
                return f.mismatch
        return None

    def check(self, name: str) -> CheckResult:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def worst(self, count: int | None = None) -> list[TensorErrorStats]:
        """Quantized tensors with the lowest SQNR first (exact ones last)."""
        ranked = sorted(self.statistics, key=lambda s: (s.sort_key, s.tensor))
        return ranked[: self.WORST_SHOWN if count is None else count]

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The stable JSON object of ``verify --json`` (docs/cli.md)."""
        first = self.first_mismatch
        return {
            "schema_version": VERIFY_SCHEMA_VERSION,
            "kind": "ninfer-verify-report",
            "artifact": self.artifact,
            "source": self.source.to_json(),
            "passed": self.passed,
            "exit_code": self.exit_code,
            "checks": [c.to_json() for c in self.checks],
            "findings_total": len(self.findings),
            "not_run": [{"check": name, "reason": why} for name, why in self.not_run],
            "first_mismatch": None if first is None else first.to_json(),
            "statistics": {
                "tensors": [s.to_json() for s in self.statistics],
                "worst": [s.tensor for s in self.worst()],
            },
            "totals": {
                "tensors": self.tensors,
                "bytes": self.bytes,
                "seconds": round(self.seconds, 6),
                "bytes_per_second": round(self.bytes_per_second, 3),
                "timings": {k: round(v, 6) for k, v in self.timings.items()},
            },
            "settings": dict(self.settings),
        }

    def dumps(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_json(), indent=indent, allow_nan=False)


def checks_in_order(results: Sequence[CheckResult]) -> tuple[CheckResult, ...]:
    """Sort check results into :data:`CHECK_ORDER`."""
    rank = {name: i for i, name in enumerate(CHECK_ORDER)}
    return tuple(sorted(results, key=lambda c: rank.get(c.name, len(rank))))
