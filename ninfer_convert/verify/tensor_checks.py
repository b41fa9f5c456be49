"""The per-tensor checks of ``verify``: one stored tensor against its value rules and, with a
source, against its re-derivation from that source and the exact reference of its encoder.

Contract of :func:`check_tensor` (run by :mod:`.runner` on the worker threads):

* Without a source, or for a tensor the plan check already reported (not in
  :attr:`SourceContext.entries`), the tensor is decoded by the reader and value-checked
  (``values`` findings).
* With a source, the tensor is re-derived with :mod:`ninfer_convert.derive` (convert's own
  derivation) and packed with its registered layout.  Grouped tensors on the host, direct
  formats and copy paths are compared with the stored planes one row block at a time, and the
  stored planes are digested on the way (:attr:`TensorOutcome.integrity`); other tensors are
  derived whole and compared byte for byte.  A source tensor whose digest differs from the
  recorded one is a ``source-identity`` finding and the tensor is not compared.  When the planes
  are equal, the stored logical words are the re-derived ones (validated by the derivation), so
  nothing is decoded except the oracle's sampled rows; otherwise the tensor is derived whole,
  decoded, value-checked and compared word by word (``source-words``).
* Sampled groups of a grouped tensor are re-encoded with the exact reference of its encoder
  profile (``oracle-sample``), and the error statistics of a quantized tensor are collected.
* Every finding goes into the returned :class:`TensorOutcome`; only a programming error raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from ..container import Artifact

# Convert's own derivation, looked up on the module at each call (a function-level import
# cost about 5 us, three per tiny tensor).
from ..derive import entry as derivation
from ..encoder.mse_reference import encode_group_mse_reference
from ..encoder.oracle import encode_group_oracle
from ..errors import ArtifactError, NinferError, SourceError
from ..formats import (
    GPTQ_F16_SEARCH_IW_V1,
    MAXABS_F16_RECIP_RNE_V1,
    MSE_F16_SEARCH_IW_V1,
    MSE_F16_SEARCH_V1,
    Category,
    NumericFormat,
    lookup_format,
)
from ..layouts import LAYOUTS
from ..logical import GroupedCodes, LogicalTensor
from ..recipe.materialize import DerivedWords, streams_directly
from ..validate import logical_problems
from .compare import BlockStats, compare_logical, error_stats, oracle_sample, oracle_sample_rows
from .report import Finding, Mismatch, TensorErrorStats
from .stored_planes import StoredPlanes, bytes_equal, stored_equals

if TYPE_CHECKING:  # imported lazily at run time (recipe and source pull in more)
    from ..derive import PackedTensor
    from ..recipe import EncodeInput, PlanEntry
    from ..source import SourceCheckpoint

__all__ = [
    "SourceContext",
    "TensorOutcome",
    "blockwise",
    "bytes_equal",
    "check_tensor",
    "input_streams",
    "streamed",
]


@dataclass
class TensorOutcome:
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
class SourceContext:
    source: SourceCheckpoint
    entries: Mapping[str, PlanEntry]
    recorded: Mapping[str, str]
    """Recorded source digests by source tensor name."""
    device: str
    """'cpu' or 'cuda', as :func:`ninfer_convert.derive.resolve_device` returns it."""
    threads: int
    oracle_groups: int
    seed: int


@dataclass
class _Rederived:
    """A tensor re-derived from an unchanged source and compared with the stored planes."""

    equal: bool
    packed: PackedTensor | None
    """The whole derivation, when one was made (always when ``equal`` is false)."""
    enc: EncodeInput | None
    """The encoder's input, when the tensor was encoded from it."""


def _read_and_check_values(art: Artifact, name: str, out: TensorOutcome) -> LogicalTensor | None:
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


def blockwise(ctx: SourceContext, entry: PlanEntry) -> bool:
    """Whether the tensor is re-encoded and compared block by block (grouped, on the host)."""
    return lookup_format(entry.format).is_grouped and ctx.device == "cpu"


def streamed(entry: PlanEntry) -> bool:
    """Whether the tensor is a direct format or a copy path, re-derived and compared block by
    block."""
    return streams_directly(entry) or entry.copy is not None


def input_streams(entry: PlanEntry) -> bool:
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
    GPTQ_F16_SEARCH_IW_V1: encode_group_mse_reference,  # unused: whole rows, see below
}
"""The exact reference each encoder profile's oracle-sample groups are re-encoded with."""
_REFERENCE_TEXT = {
    MAXABS_F16_RECIP_RNE_V1: "differs from the Section 7 oracle",
    MSE_F16_SEARCH_V1: "differs from the exact MSE_F16_SEARCH_V1 reference",
    MSE_F16_SEARCH_IW_V1: "differs from the exact MSE_F16_SEARCH_IW_V1 reference",
    GPTQ_F16_SEARCH_IW_V1: "differs from the exact GPTQ_F16_SEARCH_IW_V1 reference (whole row)",
}


def check_tensor(
    art: Artifact,
    name: str,
    ctx: SourceContext | None,
    reserve: Callable[[int], None] = lambda nbytes: None,
) -> TensorOutcome:
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
    out = TensorOutcome(name)
    entry = ctx.entries.get(name) if ctx is not None else None
    if ctx is None or entry is None:  # no source, or reported once by the inventory check
        _read_and_check_values(art, name, out)
        return out
    # On the host, grouped tensors are re-encoded and packed block by block and each block is
    # compared with its slice of the stored planes while it is in cache; the statistics come
    # from the same pass.  Only a tensor that differs is derived whole, to locate differences.
    acc = BlockStats(fmt, name, entry.source_dtype) if fmt.category is Category.GROUPED else None
    try:
        derived = _rederive(art, name, entry, ctx, acc, out, reserve)
    except NinferError as exc:
        _rederive_failed(art, name, entry, ctx, out, exc)
        return out
    if derived is None:  # a source tensor changed: reported, not compared
        return out
    out.compared = True
    enc = derived.enc
    if enc is not None and tuple(enc.words.shape) != tuple(info.shape):
        enc = None  # not in the tensor's logical coordinates: no oracle, no statistics
    if derived.equal and enc is None:
        # Equal planes and no encoder input (direct formats and copy paths): nothing to
        # decode, no oracle sample and no statistics, which all need the encoder's input.
        return out
    found = _stored_words(art, name, fmt, derived, enc, acc, out)
    if found is None:
        return out
    _oracle_check(art, name, fmt, entry, ctx, enc, found, out)
    if (
        out.stats is None
        and fmt.category is not Category.DIRECT
        and enc is not None
        and not callable(found)
    ):
        words = enc.words.whole() if isinstance(enc.words, DerivedWords) else enc.words
        out.stats = error_stats(fmt, name, words, enc.source_dtype, found)
    return out


def _rederive(
    art: Artifact,
    name: str,
    entry: PlanEntry,
    ctx: SourceContext,
    acc: BlockStats | None,
    out: TensorOutcome,
    reserve: Callable[[int], None],
) -> _Rederived | None:
    """Re-derive ``name`` and compare it with the stored planes; None (after the value check)
    when a source tensor's digest differs from the recorded one.  A tensor that differs is
    derived whole, after ``reserve``, to locate its differences."""
    planes = art.tensors[name].planes
    packed: PackedTensor | None = None
    equal: bool | None = None
    enc: EncodeInput | None
    # blockwise() and streamed(), decided with one format lookup: every entry that is not
    # grouped is a direct format or a copy path.
    grouped = lookup_format(entry.format).is_grouped
    if grouped and ctx.device == "cpu":
        plane_digests = [art.new_plane_digest() for _ in planes]
        with StoredPlanes(art, name, planes) as stored_planes:
            equal, digests, enc = derivation.host_grouped_equals(
                entry, ctx.source, stored_planes, threads=ctx.threads, on_block=acc,
                digests=plane_digests,
            )  # fmt: skip
        # The stored bytes were digested while they were compared: no second read.
        out.integrity = _plane_digest_findings(art, name, plane_digests)
    elif not grouped:
        # Direct formats and copy paths: re-derived a block at a time, each block compared
        # with its slice of the stored planes and the slice digested on the way.
        plane_digests = [art.new_plane_digest() for _ in planes]
        with StoredPlanes(art, name, planes) as stored_planes:
            equal, digests = derivation.host_stream_equals(
                entry, ctx.source, stored_planes, plane_digests
            )
        out.integrity = _plane_digest_findings(art, name, plane_digests)
        enc = None
    else:
        packed = derivation.derive_packed(
            entry, ctx.source, device=ctx.device, threads=ctx.threads, on_block=acc
        )
        digests, enc = dict(packed.source_digests), packed.encode_input
    if _digest_findings(ctx, entry, digests, out):
        _read_and_check_values(art, name, out)
        return None
    if equal is None:
        assert packed is not None
        equal = stored_equals(art, name, packed.planes)
    elif not equal:
        reserve(entry.source_bytes)
        packed = derivation.derive_packed(entry, ctx.source, device=ctx.device, threads=ctx.threads)
    return _Rederived(equal, packed, enc)


def _plane_digest_findings(art: Artifact, name: str, plane_digests: list[Any]) -> list[Finding]:
    return [
        Finding.of("integrity", e)
        for e in art.plane_digest_problems(name, [d.hexdigest() for d in plane_digests])
    ]


def _rederive_failed(
    art: Artifact,
    name: str,
    entry: PlanEntry,
    ctx: SourceContext,
    out: TensorOutcome,
    exc: NinferError,
) -> None:
    """Re-deriving raised: the stored tensor is value-checked, and the failure is a
    ``source-words`` finding unless a source tensor changed (then ``source-identity``)."""
    _read_and_check_values(art, name, out)
    changed = _changed_sources(ctx, entry, out)
    if not changed:
        out.words.append(
            Finding.of(
                "source-words",
                ArtifactError(
                    f"cannot re-derive it from the unchanged source: {exc.render()}",
                    path=str(art.tensors[name].file),
                    tensor=name,
                ),
            )
        )


def _stored_words(
    art: Artifact,
    name: str,
    fmt: NumericFormat,
    derived: _Rederived,
    enc: EncodeInput | None,
    acc: BlockStats | None,
    out: TensorOutcome,
) -> LogicalTensor | Callable[[list[int]], GroupedCodes] | None:
    """The stored words for the oracle sample and the statistics (a row reader when nothing
    needs decoding), after the word-by-word comparison of a tensor that differs; None when the
    stored tensor does not decode."""
    info = art.tensors[name]
    packed = derived.packed
    if derived.equal:
        # The stored planes are the re-derived ones, which the producer path validated, so
        # the value check holds and only the oracle's sampled rows ever need decoding.
        logical = packed.logical if packed is not None else None
        if acc is not None and acc.parts and enc is not None:
            out.stats = acc.finish()
        return logical if logical is not None else partial(art.read_rows, name)
    assert packed is not None
    stored = _read_and_check_values(art, name, out)
    if stored is None:
        return None
    expected = packed.logical
    if expected is None:
        expected = LAYOUTS[info.layout].unpack(info.format, info.shape, packed.planes)
    where = str(info.file)
    out.words += [
        _mismatch("source-words", "differs from its re-derivation from the source", m, where)
        for m in compare_logical(fmt, name, expected, stored)
    ]
    return stored


def _oracle_check(
    art: Artifact,
    name: str,
    fmt: NumericFormat,
    entry: PlanEntry,
    ctx: SourceContext,
    enc: EncodeInput | None,
    found: LogicalTensor | Callable[[list[int]], GroupedCodes],
    out: TensorOutcome,
) -> None:
    """Re-encode the sampled groups of a grouped tensor with its profile's exact reference."""
    if not (
        fmt.category is Category.GROUPED
        and entry.encoder_profile in _REFERENCES
        and enc is not None
        and ctx.oracle_groups > 0
        and (callable(found) or isinstance(found, GroupedCodes))
    ):
        return
    info = art.tensors[name]
    shape = (int(info.shape[0]), int(info.shape[1]))
    if entry.factor is not None:  # compensated: whole rows with the exact reference
        checked, mismatches = oracle_sample_rows(
            fmt, name, enc.words, enc.source_dtype, found, ctx.oracle_groups, ctx.seed,  # type: ignore[arg-type]  # rows by slices only
            entry.importance, entry.factor.words(), shape=shape,
        )  # fmt: skip
    else:
        checked, mismatches = oracle_sample(
            fmt, name, enc.words, enc.source_dtype, found, ctx.oracle_groups, ctx.seed,  # type: ignore[arg-type]  # rows and columns by slices only
            shape=shape, group_encoder=_REFERENCES[entry.encoder_profile], weights=entry.importance,
        )  # fmt: skip
    out.oracle_groups = checked
    out.oracle += [
        _mismatch("oracle-sample", _REFERENCE_TEXT[entry.encoder_profile], m, str(info.file))
        for m in mismatches
    ]


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
    ctx: SourceContext, entry: PlanEntry, digests: dict[str, str], out: TensorOutcome
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


def _changed_sources(ctx: SourceContext, entry: PlanEntry, out: TensorOutcome) -> bool:
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
