"""Preparation of the source checks of ``verify`` (header-only: no tensor is read here).

Contract of :func:`prepare_source`: choose the source (the ``source`` argument, else the
recorded snapshot ``repo.id@repo.commit``, else the recorded ``source.path``; none only when
the caller turned the source checks off), open it, load the recorded recipe text and rebuild
the plan against the source, attach the artifact's stored importance vectors, and compare the
header with the plan.  It returns a :class:`Prepared`: how the source is used, the
``source-identity`` and ``source-words`` findings found so far, and the
:class:`~.tensor_checks.SourceContext` of the per-tensor checks (None when they cannot run).
A plan entry the artifact does not store, a stored tensor the plan does not produce, and a
tensor whose format, shape, encoder profile, importance digest, conversion or source list
disagrees with the plan are ``source-words`` findings and are left out of the context (not
compared); other recorded metadata that differs (role, provenance) is a finding, and the
words are still compared.  It never raises for a problem of the artifact or the source.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..container import Artifact
from ..errors import ArtifactError, NinferError, SourceError
from ..factors import attach_factors
from ..importance import attach_importance, vector_digest
from .artifact_checks import stored_factor_set, stored_importance
from .report import Finding, SourceUse
from .source_identity import recorded_tensor_findings, source_metadata_findings
from .tensor_checks import SourceContext

if TYPE_CHECKING:  # imported lazily at run time (recipe and source pull in more)
    from ..container import TensorInfo
    from ..recipe import Plan, PlanEntry
    from ..source import SourceCheckpoint

__all__ = ["NO_SOURCE_REASON", "Prepared", "prepare_source"]

NO_SOURCE_REASON = "source checks turned off (--no-source)"


@dataclass
class Prepared:
    use: SourceUse
    ctx: SourceContext | None
    identity: list[Finding]
    words: list[Finding]


def _choose_source(
    art: Artifact, source: str | os.PathLike[str] | None, use_recorded_source: bool
) -> tuple[str, Literal["argument", "recorded"]] | Prepared:
    """The source to compare against and where it came from, or the prepared result when
    there is none: skipped only when the caller turned the source checks off; a recorded
    source that cannot be found is a ``source-identity`` finding (exit 4), never a pass."""
    if source is not None:
        return os.fspath(source), "argument"
    if not use_recorded_source:
        return Prepared(SourceUse(None, "none", False, NO_SOURCE_REASON), None, [], [])
    recorded = art.meta.source
    if recorded.repo is not None:
        # Exactly the converted snapshot, through the hub cache (offline).
        return f"{recorded.repo.id}@{recorded.repo.commit}", "recorded"
    if recorded.path and Path(recorded.path).expanduser().exists():
        return recorded.path, "recorded"
    what = f"the recorded source {recorded.path!r}" if recorded.path else "no source path"
    reason = f"the source checks cannot run: {what} " + (
        "does not exist here" if recorded.path else "is recorded in the artifact"
    )
    finding = Finding.of(
        "source-identity",
        SourceError(
            reason,
            path=str(art.path),
            hint="pass --source SOURCE, or --no-source to verify without the source checks",
        ),
    )
    return Prepared(SourceUse(recorded.path or None, "none", False, reason), None, [finding], [])


def prepare_source(
    art: Artifact,
    source: str | os.PathLike[str] | None,
    use_recorded_source: bool,
    device: str,
    jobs: int,
    oracle_groups: int,
    seed: int,
) -> Prepared:
    chosen = _choose_source(art, source, use_recorded_source)
    if isinstance(chosen, Prepared):
        return chosen
    spec, use_origin = chosen
    opened = _open_and_plan(art, spec, use_origin)
    if isinstance(opened, Prepared):
        return opened
    src, plan = opened
    identity = source_metadata_findings(art, plan, src, spec)
    identity += recorded_tensor_findings(art, src, spec)
    entries = {e.output: e for e in plan.entries}
    words = _inventory_findings(art, entries)
    bad = {f.tensor for f in words}
    # Metadata that does not change the words (role, rule, constraints, source dtypes, shapes
    # and files, transforms): a finding, and the words are still compared.
    words += _recorded_metadata_findings(art, entries, bad)
    usable = {n: e for n, e in entries.items() if n in art.tensors and n not in bad}
    from ..derive import resolve_device

    ctx = SourceContext(
        source=src,
        entries=usable,
        recorded={k: v.digest for k, v in art.meta.source.tensors.items()},
        device=resolve_device(device),
        threads=jobs,
        oracle_groups=oracle_groups,
        seed=seed,
    )
    note = f"compared against {spec} ({'given' if use_origin == 'argument' else 'recorded'})"
    return Prepared(SourceUse(spec, use_origin, True, note), ctx, identity, words)


def _open_and_plan(
    art: Artifact, spec: str, use_origin: Literal["argument", "recorded"]
) -> tuple[SourceCheckpoint, Plan] | Prepared:
    """The opened source and the recorded recipe's plan against it (with the stored
    importance vectors attached), or the prepared result that says why there is none."""
    from ..recipe import build_plan, loads_recipe
    from ..source import open_source

    def fail(finding: Finding, words: bool = False) -> Prepared:
        use = SourceUse(spec, use_origin, False, finding.message)
        return Prepared(use, None, [] if words else [finding], [finding] if words else [])

    try:
        src = open_source(spec)
    except NinferError as exc:
        return fail(Finding.of("source-identity", SourceError(exc.message, path=exc.path or spec,
                                                              hint=exc.hint)))  # fmt: skip
    try:
        recipe = loads_recipe(art.meta.recipe.text)
    except NinferError as exc:
        return fail(
            Finding.of(
                "source-words",
                ArtifactError(
                    f"the recipe recorded in the artifact does not load: {exc.message}",
                    path=str(art.path),
                ),
            ),
            words=True,
        )
    try:
        plan: Plan = build_plan(recipe, src, check_identity=False)
    except NinferError as exc:
        return fail(
            Finding.of(
                "source-identity",
                SourceError(
                    f"the recorded recipe does not apply to this source, so it is not the "
                    f"recorded one: {exc.message}",
                    path=spec,
                ),
            )
        )
    try:  # importance-weighted and compensated tensors: re-derived from the stored parts
        plan = attach_importance(plan, stored_importance(art), str(art.path))
        plan = attach_factors(plan, stored_factor_set(art), str(art.path))
    except NinferError as exc:
        return fail(
            Finding.of(
                "source-words",
                ArtifactError(
                    f"the artifact's importance vectors or factors cannot be used: {exc.message}",
                    path=str(art.path),
                    tensor=exc.tensor or _first_weighted(plan),
                ),
            ),
            words=True,
        )
    return src, plan


def _first_weighted(plan: Plan) -> str | None:
    """The first tensor re-derived from a stored importance vector or factor (the one a
    failure to read them is reported for when the error names no tensor)."""
    from ..importance import needs_importance

    return next((e.output for e in plan.entries if needs_importance(e)), None)


def _inventory_findings(art: Artifact, entries: Mapping[str, PlanEntry]) -> list[Finding]:
    """The plan's outputs against the stored tensors: each stored, each stored one planned,
    and the header fields that decide the words equal to the plan's."""
    words: list[Finding] = []
    for name, entry in entries.items():
        info = art.tensors.get(name)
        if info is None:
            words.append(
                Finding.of(
                    "source-words",
                    ArtifactError(
                        f"the recorded recipe produces {name!r} ({entry.format}) but the "
                        "artifact does not store it",
                        path=str(art.path),
                        tensor=name,
                    ),
                )
            )
            continue
        if _header_agrees(info, entry):
            continue
        problems = _header_problems(info, entry)
        if problems:
            words.append(
                Finding.of(
                    "source-words",
                    ArtifactError(
                        "the header disagrees with the recorded recipe: " + "; ".join(problems),
                        path=str(info.file),
                        tensor=name,
                    ),
                )
            )
    for name, info in art.tensors.items():
        if name not in entries:
            words.append(
                Finding.of(
                    "source-words",
                    ArtifactError(
                        "stored, but the recorded recipe does not produce it from this source",
                        path=str(info.file),
                        tensor=name,
                    ),
                )
            )
    return words


def _header_agrees(info: TensorInfo, entry: PlanEntry) -> bool:
    """True only when :func:`_header_problems` finds nothing, decided without building its
    lists (it runs for every stored tensor); an importance vector or a factor, and anything
    that differs, is left to :func:`_header_problems`."""
    stored = info.entry
    prov = stored.provenance
    if not (
        stored.format == entry.format
        and stored.shape == entry.shape
        and prov.encoder_profile == entry.encoder_profile
        and prov.conversion == entry.conversion
        and entry.importance is None
        and prov.importance is None
        and entry.factor is None
        and prov.factor is None
        and len(prov.sources) == len(entry.sources)
    ):
        return False
    if len(entry.sources) == 1:  # the common case, without a generator
        return bool(prov.sources[0].name == entry.sources[0].name)
    return all(a.name == b.name for a, b in zip(prov.sources, entry.sources, strict=True))


def _header_problems(info: TensorInfo, entry: PlanEntry) -> list[str]:
    """How the stored tensor's word-deciding header fields differ from its plan entry."""
    prov = info.entry.provenance
    problems = []
    if info.format != entry.format:
        problems.append(f"format {info.format}, the recipe gives {entry.format}")
    if tuple(info.shape) != tuple(entry.shape):
        problems.append(f"shape {list(info.shape)}, the recipe gives {list(entry.shape)}")
    if prov.encoder_profile != entry.encoder_profile:
        problems.append(
            f"encoder profile {prov.encoder_profile}, the recipe gives {entry.encoder_profile}"
        )
    want_importance = None if entry.importance is None else vector_digest(entry.importance)
    if prov.importance != want_importance:
        problems.append(
            f"importance digest {prov.importance}, the stored vector's is {want_importance}"
        )
    want_factor = None if entry.factor is None else entry.factor.digest
    if prov.factor != want_factor:
        problems.append(f"factor digest {prov.factor}, the stored factor's is {want_factor}")
    if prov.conversion != entry.conversion:
        problems.append(f"conversion {prov.conversion}, the recipe gives {entry.conversion}")
    stored_sources = [s.name for s in prov.sources]
    planned_sources = [s.name for s in entry.sources]
    if stored_sources != planned_sources:
        problems.append(f"made from {stored_sources}, the recipe makes it from {planned_sources}")
    return problems


def _recorded_metadata_findings(
    art: Artifact, entries: Mapping[str, PlanEntry], skip: set[str | None]
) -> list[Finding]:
    """Each stored tensor's ``role`` and whole ``provenance`` against what convert records
    for its plan entry (:func:`ninfer_convert.derive.provenance_of`, the one definition)."""
    from ..derive import provenance_matches, provenance_of

    findings: list[Finding] = []
    for name, entry in entries.items():
        info = art.tensors.get(name)
        if info is None or name in skip:
            continue
        # Equal typed values have equal JSON: only a difference needs the key-by-key walk.
        same = provenance_matches(entry, info.entry.provenance)
        if same and info.role == entry.role:
            continue
        problems = []
        if info.role != entry.role:
            problems.append(f"role {info.role!r}, the recipe gives {entry.role!r}")
        expected = {} if same else provenance_of(entry).to_json()
        stored = {} if same else info.entry.provenance.to_json()
        for key in sorted(set(expected) | set(stored)):
            if expected.get(key) != stored.get(key):
                problems.append(
                    f"provenance.{key} {json.dumps(stored.get(key))[:200]}, the recipe "
                    f"gives {json.dumps(expected.get(key))[:200]}"
                )
        if problems:
            findings.append(
                Finding.of(
                    "source-words",
                    ArtifactError(
                        "the header's metadata disagrees with the recorded recipe: "
                        + "; ".join(problems),
                        path=str(info.file),
                        tensor=name,
                    ),
                )
            )
    return findings
