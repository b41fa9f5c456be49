"""``source-identity`` findings that need no re-derivation: is the source the recorded one?

Contract: each function returns findings of the check ``source-identity`` and never raises for
a problem of the artifact or the source.  :func:`source_metadata_findings` compares the
recorded weight files, ``config`` and side-file list with the source;
:func:`recorded_tensor_findings` compares each recorded source tensor's dtype and shape;
:func:`unused_source_digests` reads the recorded source tensors no compared plan entry read and
compares their digests.  A difference that says the source is not the recorded one is a
:class:`~ninfer_convert.errors.SourceError` (exit 4); one that says the artifact is not what
convert makes of this source is an :class:`~ninfer_convert.errors.ArtifactError` (exit 6).
Per-tensor source digests of compared tensors are checked by :mod:`.tensor_checks`.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from typing import TYPE_CHECKING

from ..container import Artifact
from ..errors import ArtifactError, NinferError, SourceError
from ..factors import FACTOR_FILE, needs_factor
from ..importance import IMPORTANCE_FILE, needs_importance
from ..jsonlimits import nesting_problem
from .report import Finding
from .tensor_checks import SourceContext

if TYPE_CHECKING:  # imported lazily at run time (recipe and source pull in more)
    from ..recipe import Plan
    from ..source import SourceCheckpoint

__all__ = ["recorded_tensor_findings", "source_metadata_findings", "unused_source_digests"]


def _source_side_files(
    plan: Plan, src: SourceCheckpoint
) -> tuple[dict[str, os.PathLike[str]], set[str]]:
    """(the side files convert copies from ``src`` by their name in the artifact, the names
    convert generates itself): convert's own list (:func:`~ninfer_convert.card.copied_side_files`:
    the card naming of :func:`~ninfer_convert.card.side_file_names`, without the source's
    ``model.sig``)."""
    from ..card import README_NAME, copied_side_files

    copied: dict[str, os.PathLike[str]] = {
        name: source for source, name in copied_side_files(plan, src)
    }
    generated = {README_NAME} if plan.recipe.output.readme else set()
    if any(needs_importance(e) for e in plan.entries):
        generated.add(IMPORTANCE_FILE)
    if any(needs_factor(e) for e in plan.entries):
        generated.add(FACTOR_FILE)
    return copied, generated


def _source_file_digest(path: os.PathLike[str], size: int) -> str | None:
    """xxh3-128 of a source side file of exactly ``size`` bytes (the recorded size), or None
    when it is not a regular file of that size; never blocks on a FIFO, never reads more."""
    from ..container.wire import new_digest

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return None
        h = new_digest()
        pos = 0
        while pos < size:
            chunk = os.pread(fd, min(1 << 24, size - pos), pos)
            if not chunk:
                return None
            h.update(chunk)
            pos += len(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def source_metadata_findings(
    art: Artifact, plan: Plan, src: SourceCheckpoint, spec: str
) -> list[Finding]:
    """``source.files``, ``source.config`` and the side-file list against the source.

    A difference that says the source is not the recorded one is a :class:`SourceError`
    (exit 4): a weight file missing, added or of another size; a config that differs from the
    recorded one and from the artifact's own ``config.json``; a side file the artifact records
    that the source lacks, or whose bytes differ.  A difference that says the artifact is not
    what convert makes of this source is an :class:`ArtifactError` (exit 6): a recorded config
    that differs from both the source's and the artifact's own copy, or a side file the source
    has but the artifact does not record (convert copies every one)."""
    findings = _weight_file_findings(art, src, spec)
    findings += _config_findings(art, src, spec)
    findings += _side_file_findings(art, plan, src, spec)
    return findings


def _weight_file_findings(art: Artifact, src: SourceCheckpoint, spec: str) -> list[Finding]:
    findings: list[Finding] = []

    def add(exc: NinferError) -> None:
        findings.append(Finding.of("source-identity", exc))

    recorded_files = {f.name: f.size for f in art.meta.source.files}
    actual_files = dict(src.files)
    for name in sorted(set(recorded_files) | set(actual_files)):
        was, now = recorded_files.get(name), actual_files.get(name)
        if was == now:
            continue
        if now is None:
            add(SourceError(f"the recorded source file {name!r} ({was} bytes) is missing",
                            kind="source_mismatch", path=spec))  # fmt: skip
        elif was is None:
            add(SourceError(f"source file {name!r} ({now} bytes) is not recorded in the artifact",
                            kind="source_mismatch", path=spec))  # fmt: skip
        else:
            add(
                SourceError(
                    f"source file {name!r} is {now} bytes, recorded as {was}",
                    kind="source_mismatch",
                    path=spec,
                )
            )
    return findings


def _config_findings(art: Artifact, src: SourceCheckpoint, spec: str) -> list[Finding]:
    from ..container.wire import canonical_json

    def same(a: object, b: object) -> bool:  # JSON equality: 1 and true, 1 and 1.0 differ
        try:
            return canonical_json(a) == canonical_json(b)
        except (TypeError, ValueError):  # not JSON text (a lone surrogate): not the same
            return False

    if same(art.meta.source.config, src.config):
        return []
    own: object = None
    if "config.json" in art.side_files:
        with contextlib.suppress(NinferError, ValueError):
            text = art.read_side_file("config.json").decode("utf-8")
            if nesting_problem(text) is None:  # json.loads recurses once per level
                own = json.loads(text)
    if src.config is not None and own is not None and same(own, src.config):
        exc: NinferError = ArtifactError(
            "the recorded source.config differs from the source's config.json and from "
            "the artifact's own copy of it (forged or damaged metadata)",
            path=str(art.path),
        )
    else:
        exc = SourceError(
            "the source's config.json differs from the recorded source.config",
            path=spec,
            hint="the source changed since conversion, or it is another checkpoint",
        )
    return [Finding.of("source-identity", exc)]


def _side_file_findings(
    art: Artifact, plan: Plan, src: SourceCheckpoint, spec: str
) -> list[Finding]:
    findings: list[Finding] = []

    def add(exc: NinferError) -> None:
        findings.append(Finding.of("source-identity", exc))

    try:
        source_side, generated = _source_side_files(plan, src)
    except NinferError as exc:
        add(SourceError(f"convert would refuse this source's side files: {exc.message}",
                        path=exc.path or spec))  # fmt: skip
        return findings
    for name in sorted(generated - set(art.side_files)):
        add(ArtifactError(
            f"convert writes the side file {name!r} for this recipe, but the artifact does not "
            "record it",
            path=str(art.path),
        ))  # fmt: skip
    for name in sorted(set(source_side) - set(art.side_files)):
        add(ArtifactError(
            f"the source has the side file {name!r}, which the artifact does not record "
            "(convert copies every side file, so its list was changed)",
            path=str(art.path),
        ))  # fmt: skip
    for name, rec in art.side_files.items():
        path = source_side.get(name)
        if name in generated:
            continue  # made by convert, not copied; integrity checks its recorded digest
        if path is None:
            add(SourceError(f"the artifact records the side file {name!r}, which the source "
                            "does not have", path=spec))  # fmt: skip
        elif _source_file_digest(path, rec.size) != rec.digest:
            add(SourceError(
                f"the source's side file {name!r} differs from the recorded one ({rec.size} "
                f"bytes, digest {rec.digest})",
                path=os.fspath(path),
            ))  # fmt: skip
    return findings


def recorded_tensor_findings(art: Artifact, src: SourceCheckpoint, spec: str) -> list[Finding]:
    """Each recorded source tensor is in the source with its recorded dtype and shape."""
    findings: list[Finding] = []
    for name, rec in art.meta.source.tensors.items():
        sinfo = src.tensors.get(name)
        if sinfo is None:
            findings.append(
                Finding.of(
                    "source-identity",
                    SourceError(
                        f"the recorded source tensor {name!r} is missing",
                        kind="source_mismatch",
                        path=spec,
                    ),
                )
            )
        elif sinfo.dtype != rec.dtype or (
            sinfo.shape != rec.shape and tuple(sinfo.shape) != tuple(rec.shape)
        ):
            findings.append(
                Finding.of(
                    "source-identity",
                    SourceError(
                        f"source tensor {name!r} is {sinfo.dtype} {list(sinfo.shape)}, recorded "
                        f"as {rec.dtype} {list(rec.shape)}",
                        kind="source_mismatch",
                        path=spec,
                    ),
                )
            )
    return findings


def unused_source_digests(ctx: SourceContext, art: Artifact) -> list[Finding]:
    """Digests of recorded source tensors no compared entry read (skipped by the recipe, or
    inputs of a tensor whose header disagreed with the recipe): they are part of the identity."""
    read = {s.name for e in ctx.entries.values() for s in e.sources}
    findings: list[Finding] = []
    for name, was in ctx.recorded.items():
        if name in read or name not in ctx.source.tensors:
            continue  # read by an entry, or reported missing by the header check
        try:
            now = ctx.source.read(name).digest
        except NinferError as exc:
            findings.append(Finding.of("source-identity", SourceError(exc.message, path=exc.path)))
            continue
        if now != was:
            findings.append(
                Finding.of(
                    "source-identity",
                    SourceError(
                        f"source tensor {name!r} (not stored) changed since conversion: "
                        f"recorded digest {was}, now {now}",
                        path=str(ctx.source.path),
                    ),
                )
            )
    return findings
