"""Verify a .ninfer artifact against its format, layout and recipe contracts and its source.

Public API::

    report = verify_artifact("out/model-dir", source=None, device="auto", jobs=2)
    report.passed, report.exit_code, report.checks, report.first_mismatch, report.to_json()

See :mod:`.engine` for the contract of the checks (the driver; the checks themselves are in
:mod:`.artifact_checks`, :mod:`.prepare`, :mod:`.source_identity`, :mod:`.tensor_checks` and
:mod:`.runner`), :mod:`.report` for the report and its JSON schema (documented in docs/cli.md),
and :mod:`.compare` and :mod:`.stored_planes` for the bit-exact comparisons.
"""

from __future__ import annotations

from ..container import check_artifact_path
from .compare import compare_logical, error_stats, oracle_sample, sample_groups
from .engine import (
    DEFAULT_ORACLE_GROUPS,
    DEFAULT_SEED,
    ProgressCallback,
    ProgressEvent,
    verify_artifact,
)
from .report import (
    CHECK_DESCRIPTIONS,
    CHECK_ORDER,
    VERIFY_SCHEMA_VERSION,
    CheckResult,
    CheckStatus,
    Finding,
    Mismatch,
    SourceUse,
    TensorErrorStats,
    VerifyReport,
)

__all__ = [
    "CHECK_DESCRIPTIONS",
    "CHECK_ORDER",
    "DEFAULT_ORACLE_GROUPS",
    "DEFAULT_SEED",
    "VERIFY_SCHEMA_VERSION",
    "CheckResult",
    "CheckStatus",
    "Finding",
    "Mismatch",
    "ProgressCallback",
    "ProgressEvent",
    "SourceUse",
    "TensorErrorStats",
    "VerifyReport",
    "check_artifact_path",
    "compare_logical",
    "error_stats",
    "oracle_sample",
    "sample_groups",
    "verify_artifact",
]
