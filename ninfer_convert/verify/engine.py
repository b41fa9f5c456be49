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
  uses too) are checked one after the other by one worker task; each is still checked,
  admitted and reported on its own.  At most
  :data:`~ninfer_convert.scheduler.MAX_INFLIGHT_ITEMS` tasks are submitted at a time.  Results
  are deterministic: findings are ordered by check, then by stored tensor order, whatever the
  scheduling.
* ``progress`` (optional) receives :class:`ProgressEvent` values from the calling thread and
  from the workers; it must be thread-safe and cheap.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ..container import Artifact, check_artifact_path, open_artifact
from ..container.schema import paused_gc
from ..encoder.mse_reference import encode_group_mse_reference
from ..encoder.oracle import encode_group_oracle
from ..errors import ArtifactError, IntegrityError, NinferError, SourceError, UsageError
from ..formats import (
    MAXABS_F16_RECIP_RNE_V1,
    MSE_F16_SEARCH_IW_V1,
    MSE_F16_SEARCH_V1,
    Category,
    lookup_format,
)
from ..importance import (
    IMPORTANCE_FILE,
    attach_importance,
    needs_importance,
    vector_digest,
    vectors_from_artifact,
)
from ..jsonlimits import nesting_problem
from ..layouts import LAYOUTS
from ..logical import GroupedCodes, LogicalTensor
from ..scheduler import Batch, ByteBudget, batches, bounded, inflight_budget, worker_pool
from ..validate import logical_problems
from .compare import BlockStats, compare_logical, error_stats, oracle_sample
from .report import (
    CheckResult,
    Finding,
    Mismatch,
    SourceUse,
    TensorErrorStats,
    VerifyReport,
    checks_in_order,
)

if TYPE_CHECKING:  # imported lazily at run time (recipe and source pull in more)
    from ..derive import PackedTensor
    from ..recipe import EncodeInput, Plan, PlanEntry
    from ..source import SourceCheckpoint

__all__ = [
    "DEFAULT_ORACLE_GROUPS",
    "DEFAULT_SEED",
    "ProgressEvent",
    "verify_artifact",
]

log = logging.getLogger(__name__)

DEFAULT_ORACLE_GROUPS = 16
"""Groups per grouped tensor re-encoded with the exact reference of its encoder profile (the
cost per group of each profile: docs/cli.md, verify `--oracle-groups`)."""
DEFAULT_SEED = 0x5EED
"""Seed of the oracle group sample; with the tensor name it fixes the groups chosen."""
Device = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class ProgressEvent:
    """``phase`` is 'open', 'integrity', 'padding', 'plan' or 'tensors'; ``done``/``total``
    count tensors (bytes for 'integrity'), ``item`` names the tensor just finished."""

    phase: str
    done: int
    total: int
    item: str | None = None


ProgressCallback = Callable[[ProgressEvent], None]


# ---------------------------------------------------------------------------------------------
# Paths and options


def _source_exists(spec: str) -> bool:
    from ..source.hf_cache import looks_like_repo_id

    return Path(spec).expanduser().exists() or looks_like_repo_id(spec)


# ---------------------------------------------------------------------------------------------
# Per-tensor work


@dataclass
class _TensorOutcome:
    name: str
    integrity: list[Finding] | None = None
    """Plane digest findings, when the checks digested the stored planes on the way."""
    values: list[Finding] = field(default_factory=list)
    identity: list[Finding] = field(default_factory=list)
    words: list[Finding] = field(default_factory=list)
    oracle: list[Finding] = field(default_factory=list)
    compared: bool = False
    oracle_groups: int = 0
    stats: TensorErrorStats | None = None


@dataclass
class _SourceContext:
    source: SourceCheckpoint
    entries: Mapping[str, PlanEntry]
    recorded: Mapping[str, str]
    """Recorded source digests by source tensor name."""
    device: str
    """'cpu' or 'cuda', as :func:`ninfer_convert.derive.resolve_device` returns it."""
    threads: int
    oracle_groups: int
    seed: int


_COMPARE_WORDS = 1 << 17
"""64-bit words compared per step (1 MiB): the comparison's boolean temporary stays in cache
instead of being a fresh allocation the size of the plane (2.5x faster on 300 MB)."""


def _bytes_equal(a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> bool:
    if a.size != b.size:
        return False
    whole = a.size // 8 * 8
    a64, b64 = a[:whole].view(np.uint64), b[:whole].view(np.uint64)
    for i in range(0, a64.size, _COMPARE_WORDS):
        if not np.array_equal(a64[i : i + _COMPARE_WORDS], b64[i : i + _COMPARE_WORDS]):
            return False
    return bool(np.array_equal(a[whole:], b[whole:]))


def _integrity_order(
    shards: dict[str, int], tensors: dict[str, int], f: Finding
) -> tuple[int, int]:
    shard = shards.get(f.path or "", len(shards))  # a side file sorts after every shard
    return shard, -1 if f.tensor is None else tensors.get(f.tensor, -1)


@contextmanager
def _stored_planes(art: Artifact, name: str) -> Iterator[list[npt.NDArray[np.uint8]]]:
    """The stored planes of ``name`` as read-only byte arrays over the mapping, released on
    exit (the caller must not keep them)."""
    views = [art.plane_buffer(name, p.name) for p in art.tensors[name].planes]
    arrays = [np.frombuffer(v, dtype=np.uint8) for v in views]
    try:
        yield arrays
    finally:
        arrays.clear()
        for view in views:
            view.release()


def _stored_equals(art: Artifact, name: str, planes: list[npt.NDArray[np.uint8]]) -> bool:
    """True when every stored plane of ``name`` equals ``planes`` byte for byte."""
    info = art.tensors[name]
    for plane, packed in zip(info.planes, planes, strict=True):
        view = art.plane_buffer(name, plane.name)
        try:
            stored = np.frombuffer(view, dtype=np.uint8)
            same = _bytes_equal(stored, packed)
            del stored
        finally:
            view.release()
        if not same:
            return False
    return True


def _read_and_check_values(art: Artifact, name: str, out: _TensorOutcome) -> LogicalTensor | None:
    info = art.tensors[name]
    try:
        found = art.read(name)
    except NinferError as exc:
        out.values.append(
            Finding.of("values", ArtifactError(f"cannot decode: {exc.message}",
                                               path=str(info.file), tensor=name))
        )  # fmt: skip
        return None
    out.values += [Finding.of("values", p) for p in logical_problems(info.format, found, name)]
    return found


def _blockwise(ctx: _SourceContext, entry: PlanEntry) -> bool:
    """Whether the tensor is re-encoded and compared block by block (grouped, on the host)."""
    return lookup_format(entry.format).is_grouped and ctx.device == "cpu"


def _streamed(entry: PlanEntry) -> bool:
    """Whether the tensor is a direct format or a copy path, re-derived and compared block by
    block."""
    from ..recipe.materialize import streams_directly

    return streams_directly(entry) or entry.copy is not None


def _input_streams(entry: PlanEntry) -> bool:
    """Whether materialize hands the encoder its input without building the tensor: a view of
    the memory-mapped source, or a :class:`~ninfer_convert.recipe.materialize.DerivedWords`
    that derives row blocks on request.  A transpose reads its strips from the mapped source
    (through reshapes) or from the mapped parts of a concat right before it; any other
    transpose (of a reshaped concat, of a transpose) builds its input whole."""
    state = "mapped"  # what the next transpose would read: mapped, concat or derived
    for step in entry.transforms:
        if step.op == "concat":
            state = "concat"
        elif step.op == "transpose":
            if state == "derived":
                return False
            state = "derived"
        elif state != "mapped":
            state = "derived"
    return True


_REFERENCES = {
    MAXABS_F16_RECIP_RNE_V1: encode_group_oracle,
    MSE_F16_SEARCH_V1: encode_group_mse_reference,
    MSE_F16_SEARCH_IW_V1: encode_group_mse_reference,  # with the group's stored weights
}
"""The exact reference each encoder profile's oracle-sample groups are re-encoded with."""
_REFERENCE_TEXT = {
    MAXABS_F16_RECIP_RNE_V1: "differs from the Section 7 oracle",
    MSE_F16_SEARCH_V1: "differs from the exact MSE_F16_SEARCH_V1 reference",
    MSE_F16_SEARCH_IW_V1: "differs from the exact MSE_F16_SEARCH_IW_V1 reference",
}


def _stored_importance(art: Artifact) -> Mapping[str, npt.NDArray[np.uint32]] | None:
    """The artifact's importance vectors (its side file, digest-checked on read), or None."""
    if IMPORTANCE_FILE not in art.side_files:
        return None
    return vectors_from_artifact(art.read_side_file(IMPORTANCE_FILE), str(art.path))


def _check_tensor(
    art: Artifact,
    name: str,
    ctx: _SourceContext | None,
    reserve: Callable[[int], None] = lambda nbytes: None,
) -> _TensorOutcome:
    """All per-tensor checks of one tensor (values, and against the source when ``ctx``).
    ``reserve(nbytes)`` is called, and may wait, before a block-compared tensor that differs
    is derived whole (the memory its admission did not count).

    With a source, the tensor is re-derived first and packed with its registered layout; when
    the packed planes equal the stored planes byte for byte, the stored logical words are the
    re-derived ones, which :func:`~ninfer_convert.derive.derive_logical` has already validated
    (so the value check holds) and nothing needs decoding.  Otherwise the stored tensor is
    decoded by the reader, value-checked, and compared word by word to locate every
    difference.  Without a source (or when re-deriving fails) it is decoded and value-checked.
    """
    info = art.tensors[name]
    fmt = lookup_format(info.format)
    out = _TensorOutcome(name)
    where = str(info.file)
    entry = ctx.entries.get(name) if ctx is not None else None
    if ctx is None or entry is None:  # no source, or reported once by the inventory check
        _read_and_check_values(art, name, out)
        return out
    from ..derive.entry import (  # convert's own derivation
        derive_packed,
        host_grouped_equals,
        host_stream_equals,
    )

    # On the host, grouped tensors are re-encoded and packed block by block and each block is
    # compared with its slice of the stored planes while it is in cache; the statistics come
    # from the same pass.  Only a tensor that differs is derived whole, to locate differences.
    acc = BlockStats(fmt, name, entry.source_dtype) if fmt.category is Category.GROUPED else None
    packed: PackedTensor | None = None
    equal: bool | None = None
    enc: EncodeInput | None
    try:
        if _blockwise(ctx, entry):
            plane_digests = [art.new_plane_digest() for _ in info.planes]
            with _stored_planes(art, name) as stored_planes:
                equal, digests, enc = host_grouped_equals(
                    entry, ctx.source, stored_planes, threads=ctx.threads, on_block=acc,
                    digests=plane_digests,
                )  # fmt: skip
            # The stored bytes were digested while they were compared: no second read.
            out.integrity = [
                Finding.of("integrity", e)
                for e in art.plane_digest_problems(name, [d.hexdigest() for d in plane_digests])
            ]
        elif _streamed(entry):
            # Direct formats and copy paths: re-derived a block at a time, each block compared
            # with its slice of the stored planes and the slice digested on the way.
            plane_digests = [art.new_plane_digest() for _ in info.planes]
            with _stored_planes(art, name) as stored_planes:
                equal, digests = host_stream_equals(entry, ctx.source, stored_planes, plane_digests)
            out.integrity = [
                Finding.of("integrity", e)
                for e in art.plane_digest_problems(name, [d.hexdigest() for d in plane_digests])
            ]
            enc = None
        else:
            packed = derive_packed(
                entry, ctx.source, device=ctx.device, threads=ctx.threads, on_block=acc
            )
            digests, enc = dict(packed.source_digests), packed.encode_input
        if _digest_findings(ctx, entry, digests, out):
            _read_and_check_values(art, name, out)
            return out
        if equal is None:
            assert packed is not None
            equal = _stored_equals(art, name, packed.planes)
        elif not equal:
            reserve(entry.source_bytes)
            packed = derive_packed(entry, ctx.source, device=ctx.device, threads=ctx.threads)
    except NinferError as exc:
        _read_and_check_values(art, name, out)
        changed = _changed_sources(ctx, entry, out)
        if not changed:
            out.words.append(
                Finding.of(
                    "source-words",
                    ArtifactError(
                        f"cannot re-derive it from the unchanged source: {exc.render()}",
                        path=where,
                        tensor=name,
                    ),
                )
            )
        return out
    out.compared = True
    if enc is not None and tuple(enc.words.shape) != tuple(info.shape):
        enc = None  # not in the tensor's logical coordinates: no oracle, no statistics
    found: LogicalTensor | Callable[[list[int]], GroupedCodes]
    if equal:
        # The stored planes are the re-derived ones, which the producer path validated, so
        # the value check holds and only the oracle's sampled rows ever need decoding.
        logical = packed.logical if packed is not None else None
        found = logical if logical is not None else partial(art.read_rows, name)
        if acc is not None and acc.parts and enc is not None:
            out.stats = acc.finish()
    else:
        assert packed is not None
        stored = _read_and_check_values(art, name, out)
        if stored is None:
            return out
        found = stored
        expected = packed.logical
        if expected is None:
            expected = LAYOUTS[info.layout].unpack(info.format, info.shape, packed.planes)
        out.words += [
            _mismatch("source-words", "differs from its re-derivation from the source", m, where)
            for m in compare_logical(fmt, name, expected, stored)
        ]
    if (
        fmt.category is Category.GROUPED
        and entry.encoder_profile in _REFERENCES
        and enc is not None
        and ctx.oracle_groups > 0
        and (callable(found) or isinstance(found, GroupedCodes))
    ):
        checked, mismatches = oracle_sample(
            fmt, name, enc.words, enc.source_dtype, found, ctx.oracle_groups, ctx.seed,  # type: ignore[arg-type]  # rows and columns by slices only
            shape=(int(info.shape[0]), int(info.shape[1])),
            group_encoder=_REFERENCES[entry.encoder_profile], weights=entry.importance,
        )  # fmt: skip
        out.oracle_groups = checked
        out.oracle += [
            _mismatch("oracle-sample", _REFERENCE_TEXT[entry.encoder_profile], m, where)
            for m in mismatches
        ]
    if (
        out.stats is None
        and fmt.category is not Category.DIRECT
        and enc is not None
        and not callable(found)
    ):
        from ..recipe.materialize import DerivedWords

        words = enc.words.whole() if isinstance(enc.words, DerivedWords) else enc.words
        out.stats = error_stats(fmt, name, words, enc.source_dtype, found)
    return out


def _mismatch(check: str, what: str, m: Mismatch, where: str) -> Finding:
    return Finding(
        check=check,
        error="ArtifactError",
        exit_code=ArtifactError.exit_code,
        message=f"{what}: {m.describe()}",
        path=where,
        tensor=m.tensor,
        mismatch=m,
        kind="word_mismatch",
    )


def _digest_findings(
    ctx: _SourceContext, entry: PlanEntry, digests: dict[str, str], out: _TensorOutcome
) -> bool:
    """Compare the digests read with the recorded ones; True when a source tensor changed.
    Called again after a failed re-derivation, so a finding already recorded is not repeated."""
    changed = False

    def add(finding: Finding) -> None:
        if finding not in out.identity:
            out.identity.append(finding)

    for src in entry.sources:
        now = digests.get(src.name)
        was = ctx.recorded.get(src.name)
        if was is None:
            add(
                Finding.of(
                    "source-identity",
                    ArtifactError(
                        f"the artifact records no digest for its source tensor {src.name!r}",
                        tensor=entry.output,
                    ),
                )
            )
        elif now is not None and now != was:
            changed = True
            add(
                Finding.of(
                    "source-identity",
                    SourceError(
                        f"source tensor {src.name!r} changed since conversion: recorded "
                        f"digest {was}, now {now}; the tensor was not compared",
                        kind="source_mismatch",
                        path=str(ctx.source.path),
                        tensor=entry.output,
                        hint="verify against the recorded source, or convert again",
                    ),
                )
            )
    return changed


def _changed_sources(ctx: _SourceContext, entry: PlanEntry, out: _TensorOutcome) -> bool:
    """After a failed re-derivation: read each source tensor's digest on its own."""
    digests: dict[str, str] = {}
    for src in entry.sources:
        try:
            digests[src.name] = ctx.source.read(src.name).digest
        except NinferError as exc:
            out.identity.append(
                Finding.of(
                    "source-identity", SourceError(exc.message, path=exc.path, tensor=entry.output)
                )
            )
            return True
    return _digest_findings(ctx, entry, digests, out)


def _unused_source_digests(ctx: _SourceContext, art: Artifact) -> list[Finding]:
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


# ---------------------------------------------------------------------------------------------
# Source preparation (header-only)


@dataclass
class _Prepared:
    use: SourceUse
    ctx: _SourceContext | None
    identity: list[Finding]
    words: list[Finding]


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


def _source_metadata_findings(
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
    from ..container.wire import canonical_json

    findings: list[Finding] = []
    meta = art.meta.source

    def add(exc: NinferError) -> None:
        findings.append(Finding.of("source-identity", exc))

    recorded_files = {f.name: f.size for f in meta.files}
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

    def same(a: object, b: object) -> bool:  # JSON equality: 1 and true, 1 and 1.0 differ
        try:
            return canonical_json(a) == canonical_json(b)
        except (TypeError, ValueError):  # not JSON text (a lone surrogate): not the same
            return False

    if not same(meta.config, src.config):
        own: object = None
        if "config.json" in art.side_files:
            with contextlib.suppress(NinferError, ValueError):
                text = art.read_side_file("config.json").decode("utf-8")
                if nesting_problem(text) is None:  # json.loads recurses once per level
                    own = json.loads(text)
        if src.config is not None and own is not None and same(own, src.config):
            add(ArtifactError(
                "the recorded source.config differs from the source's config.json and from "
                "the artifact's own copy of it (forged or damaged metadata)",
                path=str(art.path),
            ))  # fmt: skip
        else:
            add(SourceError(
                "the source's config.json differs from the recorded source.config",
                path=spec,
                hint="the source changed since conversion, or it is another checkpoint",
            ))  # fmt: skip

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


NO_SOURCE_REASON = "source checks turned off (--no-source)"


def _choose_source(
    art: Artifact, source: str | os.PathLike[str] | None, use_recorded_source: bool
) -> tuple[str, Literal["argument", "recorded"]] | _Prepared:
    """The source to compare against and where it came from, or the prepared result when
    there is none: skipped only when the caller turned the source checks off; a recorded
    source that cannot be found is a ``source-identity`` finding (exit 4), never a pass."""
    if source is not None:
        return os.fspath(source), "argument"
    if not use_recorded_source:
        return _Prepared(SourceUse(None, "none", False, NO_SOURCE_REASON), None, [], [])
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
    return _Prepared(SourceUse(recorded.path or None, "none", False, reason), None, [finding], [])


def _prepare_source(
    art: Artifact,
    source: str | os.PathLike[str] | None,
    use_recorded_source: bool,
    device: str,
    jobs: int,
    oracle_groups: int,
    seed: int,
) -> _Prepared:
    chosen = _choose_source(art, source, use_recorded_source)
    if isinstance(chosen, _Prepared):
        return chosen
    spec, use_origin = chosen

    from ..recipe import build_plan, loads_recipe
    from ..source import open_source

    def fail(finding: Finding, words: bool = False) -> _Prepared:
        use = SourceUse(spec, use_origin, False, finding.message)
        return _Prepared(use, None, [] if words else [finding], [finding] if words else [])

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
    try:  # MSE_F16_SEARCH_IW_V1 tensors are re-derived from the stored importance vectors
        plan = attach_importance(plan, _stored_importance(art), str(art.path))
    except NinferError as exc:
        return fail(
            Finding.of(
                "source-words",
                ArtifactError(
                    f"the artifact's importance vectors cannot be used: {exc.message}",
                    path=str(art.path),
                    tensor=exc.tensor,
                ),
            ),
            words=True,
        )
    identity: list[Finding] = _source_metadata_findings(art, plan, src, spec)
    recorded = art.meta.source.tensors
    for name, rec in recorded.items():
        sinfo = src.tensors.get(name)
        if sinfo is None:
            identity.append(
                Finding.of(
                    "source-identity",
                    SourceError(
                        f"the recorded source tensor {name!r} is missing",
                        kind="source_mismatch",
                        path=spec,
                    ),
                )
            )
        elif sinfo.dtype != rec.dtype or tuple(sinfo.shape) != tuple(rec.shape):
            identity.append(
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
    words: list[Finding] = []
    entries = {e.output: e for e in plan.entries}
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
        if prov.conversion != entry.conversion:
            problems.append(f"conversion {prov.conversion}, the recipe gives {entry.conversion}")
        stored_sources = [s.name for s in prov.sources]
        planned_sources = [s.name for s in entry.sources]
        if stored_sources != planned_sources:
            problems.append(
                f"made from {stored_sources}, the recipe makes it from {planned_sources}"
            )
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
    bad = {f.tensor for f in words}
    # Metadata that does not change the words (role, rule, constraints, source dtypes, shapes
    # and files, transforms): a finding, and the words are still compared.
    words += _recorded_metadata_findings(art, entries, bad)
    usable = {n: e for n, e in entries.items() if n in art.tensors and n not in bad}
    from ..derive import resolve_device

    ctx = _SourceContext(
        source=src,
        entries=usable,
        recorded={k: v.digest for k, v in recorded.items()},
        device=resolve_device(device),
        threads=jobs,
        oracle_groups=oracle_groups,
        seed=seed,
    )
    note = f"compared against {spec} ({'given' if use_origin == 'argument' else 'recorded'})"
    return _Prepared(SourceUse(spec, use_origin, True, note), ctx, identity, words)


# ---------------------------------------------------------------------------------------------
# Artifact-level checks beyond the reader's


def _artifact_level_findings(art: Artifact) -> list[Finding]:
    """``structure`` findings of an artifact that opened: container-like files in its
    directory that are not part of it (a stale shard beside ``model.ninfer``)."""
    return [
        Finding.of(
            "structure",
            ArtifactError(
                f"{name!r} looks like a container file but is not part of this artifact",
                path=str(art.directory / name),
                hint="a leftover of another conversion; remove it, or convert into an empty "
                "directory",
            ),
        )
        for name in art.stray_files
    ]


def _importance_findings(art: Artifact) -> list[Finding]:
    """docs/container.md (side file entry): ``importance.safetensors`` exists exactly when some
    tensor's provenance records an ``importance`` digest, holds exactly those tensors' entries,
    and each entry's digest is the recorded one.  Needs no source, so it runs with
    ``--no-source`` too.  A side file whose own digest fails is reported by
    ``integrity_problems`` already (nothing is added here)."""
    where = str((art.path if art.path.is_dir() else art.path.parent) / IMPORTANCE_FILE)
    recorded = {
        name: info.entry.provenance.importance
        for name, info in art.tensors.items()
        if info.entry.provenance.importance is not None
    }

    def problem(message: str, tensor: str | None) -> Finding:
        hint = "the header or the side file was edited after conversion; convert again"
        return Finding.of(
            "integrity", IntegrityError(message, path=where, tensor=tensor, hint=hint)
        )

    if IMPORTANCE_FILE not in art.side_files:
        if not recorded:
            return []
        first = next(iter(recorded))
        return [
            problem(
                f"{len(recorded)} tensors record an importance digest (first: {first}) but the "
                f"artifact has no side file {IMPORTANCE_FILE}",
                first,
            )
        ]
    try:
        vectors = _stored_importance(art) or {}
    except IntegrityError:
        return []
    except NinferError as exc:
        return [problem(exc.message, None)]
    out = []
    for name, digest in recorded.items():
        if name not in vectors:
            out.append(problem(f"provenance.importance is {digest} but the side file has no "
                               f"entry named {name!r}", name))  # fmt: skip
        elif vector_digest(vectors[name]) != digest:
            out.append(problem(f"provenance.importance is {digest} but the side file's entry "
                               f"has digest {vector_digest(vectors[name])}", name))  # fmt: skip
    for name in sorted(set(vectors) - set(recorded)):
        out.append(problem(f"the side file has an entry {name!r} for a tensor that records no "
                           "importance digest", name))  # fmt: skip
    return out


def _recipe_digest_findings(art: Artifact) -> list[Finding]:
    """``recipe.digest`` against the recorded recipe text: ``sha256:<hex>`` of its UTF-8
    bytes, the definition of :attr:`ninfer_convert.recipe.Recipe.digest`."""
    from ..container.wire import RECIPE_DIGEST_ALGORITHM, recipe_digest

    recipe = art.meta.recipe
    algorithm, sep, recorded = recipe.digest.partition(":")
    if not sep or algorithm != RECIPE_DIGEST_ALGORITHM:
        message = (
            f"recipe.digest {recipe.digest[:80]!r} is not 'sha256:<hex>', the only form verify "
            "can check, so the recorded recipe text is unprotected"
        )
    else:
        actual = recipe_digest(recipe.text).partition(":")[2]
        if actual == recorded:
            return []
        message = (
            f"recipe.digest is sha256:{recorded[:80]} but the recorded recipe text hashes to "
            f"sha256:{actual} (the text or the digest changed)"
        )
    return [Finding.of("integrity", IntegrityError(message, path=str(art.files[0])))]


def _recorded_metadata_findings(
    art: Artifact, entries: Mapping[str, PlanEntry], skip: set[str | None]
) -> list[Finding]:
    """Each stored tensor's ``role`` and whole ``provenance`` against what convert records
    for its plan entry (:func:`ninfer_convert.derive.provenance_of`, the one definition)."""
    from ..container.schema import Provenance, SchemaError
    from ..derive import provenance_of

    findings: list[Finding] = []
    for name, entry in entries.items():
        info = art.tensors.get(name)
        if info is None or name in skip:
            continue
        problems = []
        if info.role != entry.role:
            problems.append(f"role {info.role!r}, the recipe gives {entry.role!r}")
        try:
            parsed = Provenance.from_json(provenance_of(entry))
        except SchemaError as exc:  # pragma: no cover - convert writes exactly this
            problems.append(f"the recipe's provenance does not fit the schema: {exc}")
        else:
            # Equal typed values have equal JSON: only a difference needs the key-by-key walk.
            same = parsed == info.entry.provenance
            expected = {} if same else parsed.to_json()
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


# ---------------------------------------------------------------------------------------------
# The driver


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
) -> VerifyReport:
    """Run every check (see the module contract) and return the report."""
    started = time.perf_counter()
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
    t0 = time.perf_counter()
    emit("open", 0, 1)
    try:
        art = open_artifact(path, check_header_digest=False)
    except ArtifactError as exc:
        timings["open"] = time.perf_counter() - t0
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
    with art:
        timings["open"] = time.perf_counter() - t0
        emit("open", 1, 1)
        names = list(art.tensors)
        files = art.files
        total_bytes = art.total_bytes()
        structure = _artifact_level_findings(art)
        results = [CheckResult("structure", _status(structure), len(names), tuple(structure))]

        t0 = time.perf_counter()
        emit("integrity", 0, total_bytes)
        # Header, index, gap and side-file digests here; each tensor's plane digests are
        # checked by the worker that re-derives it, so those reads overlap the encoding.
        integrity = (
            [Finding.of("integrity", e) for e in art.integrity_problems(plane_digests=False)]
            + _recipe_digest_findings(art)
            + _importance_findings(art)
        )
        timings["integrity"] = time.perf_counter() - t0
        emit("integrity", total_bytes, total_bytes)

        t0 = time.perf_counter()
        emit("padding", 0, len(names))
        padding = [Finding.of("padding", e) for e in art.padding_problems()]
        timings["padding"] = time.perf_counter() - t0
        emit("padding", len(names), len(names))
        results.append(CheckResult("padding", _status(padding), len(names), tuple(padding)))

        t0 = time.perf_counter()
        emit("plan", 0, 1)
        prepared = _prepare_source(
            art, source, use_recorded_source, device, jobs, oracle_groups, seed
        )
        timings["plan"] = time.perf_counter() - t0
        emit("plan", 1, 1)
        if prepared.ctx is not None:
            settings["device_used"] = prepared.ctx.device

        t0 = time.perf_counter()
        with paused_gc():  # as in convert: nothing built per tensor is cyclic
            outcomes = _run_tensors(art, names, prepared.ctx, jobs, emit)
        if prepared.ctx is not None:
            prepared.identity += _unused_source_digests(prepared.ctx, art)
        timings["tensors"] = time.perf_counter() - t0

    # The order integrity_problems() reports: shard by shard, each shard's own findings and
    # then its tensors' (gaps, then plane digests), side files last.
    integrity += [f for o in outcomes for f in o.integrity or ()]
    integrity.sort(key=partial(_integrity_order, {str(p): i for i, p in enumerate(files)},
                               {n: i for i, n in enumerate(names)}))  # fmt: skip
    results.insert(1, CheckResult("integrity", _status(integrity), len(names), tuple(integrity)))

    values = [f for o in outcomes for f in o.values]
    results.append(CheckResult("values", _status(values), len(names), tuple(values)))
    identity = prepared.identity + [f for o in outcomes for f in o.identity]
    words = prepared.words + [f for o in outcomes for f in o.words]
    oracle = [f for o in outcomes for f in o.oracle]
    if prepared.use.compared:
        compared = sum(1 for o in outcomes if o.compared)
        groups = sum(o.oracle_groups for o in outcomes)
        sampled = sum(1 for o in outcomes if o.oracle_groups)
        not_compared = len(names) - compared
        results += [
            CheckResult("source-identity", _status(identity), len(names), tuple(identity)),
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
    else:
        reason = prepared.use.reason
        results += [
            CheckResult("source-identity", _status(identity) if identity else "skipped", 0,
                        tuple(identity), reason),
            CheckResult("source-words", _status(words) if words else "skipped", 0, tuple(words),
                        reason),
            CheckResult("oracle-sample", "skipped", 0, (), reason),
        ]  # fmt: skip
    stats = tuple(o.stats for o in outcomes if o.stats is not None)
    return VerifyReport(
        artifact=str(path),
        source=prepared.use,
        checks=checks_in_order(results),
        statistics=stats,
        tensors=len(names),
        bytes=total_bytes,
        seconds=time.perf_counter() - started,
        settings=settings,
        timings=timings,
    )


def _run_tensors(
    art: Artifact,
    names: list[str],
    ctx: _SourceContext | None,
    jobs: int,
    emit: Callable[[str, int, int, str | None], None],
) -> list[_TensorOutcome]:
    total = len(names)
    done = 0
    lock = threading.Lock()
    emit("tensors", 0, total, None)

    def entry_of(name: str) -> PlanEntry | None:
        return ctx.entries.get(name) if ctx is not None else None

    def cost(name: str) -> int:
        # What the check allocates.  Nothing tensor-sized for a grouped tensor compared block
        # by block straight from the mapped source (source and stored planes are mapped, not
        # copied), so such tensors never wait for each other; one that differs reserves its
        # source bytes before it is derived whole (``reserve`` below).  Convert's measure
        # (source bytes) for any other re-derived tensor; the stored bytes for a tensor that
        # is only decoded.
        entry = entry_of(name)
        if entry is None:
            return art.tensors[name].nbytes
        assert ctx is not None
        if _streamed(entry) or (_blockwise(ctx, entry) and _input_streams(entry)):
            return 0
        return entry.source_bytes

    def source_bytes(name: str) -> int:
        entry = entry_of(name)
        return entry.source_bytes if entry is not None else 0

    costs = {n: cost(n) for n in names}
    # Sized for the largest tensor whatever its admission cost: a block-compared tensor that
    # differs reserves its source bytes later.
    largest = max((max(costs[n], source_bytes(n)) for n in names), default=0)
    budget = ByteBudget(inflight_budget(largest))
    sizes = {n: art.tensors[n].nbytes + source_bytes(n) for n in names}
    stored_and_source_bytes = sizes.__getitem__

    def prefetch(name: str) -> None:
        art.prefetch(name)
        entry = entry_of(name)
        if ctx is not None and entry is not None:
            ctx.source.prefetch(s.name for s in entry.sources)

    def work(name: str) -> _TensorOutcome:
        nonlocal done
        held = costs[name]
        budget.acquire(held)

        def reserve(nbytes: int) -> None:
            nonlocal held
            if held == 0:  # a tensor admitted with a cost already holds its source bytes
                budget.acquire(nbytes)
                held = nbytes

        try:
            result = _check_tensor(art, name, ctx, reserve)
            if result.integrity is None:  # not digested on the way: read the planes for it
                result.integrity = [Finding.of("integrity", e) for e in art.verify_tensor(name)]
        finally:
            budget.release(held)
        with lock:
            done += 1
            count = done
        emit("tensors", count, total, name)
        return result

    # Cold reads (stored planes and source) of the tensors ahead overlap the re-encoding, as
    # convert does for its source; page cache only, so the window costs no process memory.
    with worker_pool(
        names,
        jobs=jobs,
        thread_name="ninfer-verify",
        key=str,
        nbytes=stored_and_source_bytes,
        prefetch=prefetch,
    ) as workers:

        def work_batch(batch: Batch[str]) -> list[_TensorOutcome]:
            # One read-ahead top-up per batch: started() requests every tensor up to the last.
            workers.started(batch)
            return [work(n) for n in batch.items]

        tasks = batches(names, lambda n: max(costs[n], stored_and_source_bytes(n)))
        if jobs == 1 or total <= 1:
            return [o for b in tasks for o in work_batch(b)]

        # Bytes are admitted by the workers (``budget``: a tensor that differs reserves more
        # while it runs), so the submission window bounds the task count only.
        def submit(batch: Batch[str]) -> Future[list[_TensorOutcome]]:
            return workers.pool.submit(work_batch, batch)

        window = bounded(tasks, submit, 0, _no_cost)
        # In stored order, whatever order the workers finish in.
        return [o for _, fut in window for o in fut.result()]


def _no_cost(batch: Batch[str]) -> int:
    return 0
