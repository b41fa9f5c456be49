"""``ninfer convert``: plan, derive, encode and write an artifact, streaming and crash-safe.

Contract:

* :func:`plan_conversion` reads metadata only (shard headers, config.json, the recipe) and
  returns the complete plan; every recipe problem is reported before any tensor byte is read.
* What each tensor stores is derived by :mod:`.derive` (:func:`~.derive.derive_packed`), the
  one definition of "the words stored for a plan entry" that ``ninfer verify`` re-derives too,
  so producer and verifier cannot drift apart; convert is the driver that writes it.
* :func:`convert_checkpoint` streams the plan: the calling thread reserves each tensor's
  planes in the output in plan order (:meth:`~.container.ArtifactWriter.reserve`), worker
  threads derive, encode and pack the tensors a row block at a time straight into their
  reserved planes, and the calling thread completes them in plan order, so the artifact is
  byte-identical for any ``jobs`` and device.  The workers, the read-ahead window, the bound
  on work in flight (source bytes: at most the largest tensor's bytes, or 256 MiB when that
  is larger; page cache, since sources are mapped; and a task count) and the batching of
  consecutive small entries into one task are :mod:`.scheduler`'s, shared with verify; a
  batch's entries are reserved as runs (:meth:`~.container.ArtifactWriter.reserve_run`: one
  reservation and buffer per run of one shard; an entry whose planes exceed 256 KiB, larger
  than its small source, alone in the file's pages), derived one after the other by one worker
  into the run's buffer and completed by one ``complete_run`` per run.  On the host paths
  (direct formats, conversions, derivations, copy paths, grouped encoding) a worker holds a
  few blocks, never a tensor or a plane, so peak memory follows the block size, not the tensor
  or the model.  The
  CUDA path still packs a tensor whole before storing it.  Everything is staged by
  :class:`~.container.ArtifactWriter` and published only when complete; a failure, Ctrl-C,
  SIGTERM or SIGHUP leaves the output name as it was.  Before any
  source byte is read the output is locked, stale staging folders of dead runs are restored or
  removed (``on_notice`` gets one line each), the destination is checked (what ``force`` may
  replace, never the source) and the free space is compared with the plan's exact size.
* ``runner`` (a :class:`TensorRunner`; ``convert --ray``: :mod:`ninfer_convert.cluster`)
  stores the plan's tensors in the writer instead of ``write_tensors``, byte for byte the
  same; planning, the destination checks, side files, metadata, signing and the publish stay
  here.
* :func:`check_output` makes the same destination, permission and free-space checks without
  writing anything (``convert --dry-run``).
* The steps of :func:`convert_checkpoint`, in order: plan (:func:`plan_conversion`), choose
  the encoding device, open the writer with the exact planned size, stream the tensors
  (:func:`~.convert_tensors.write_tensors`), digest the skipped tensors, add the side files,
  record the metadata (:mod:`.artifact_metadata`), sign and publish.  Its results and
  progress events are the records of :mod:`.convert_report`, exported here.
* The model directory gets the source's side files (but the source's own ``model.sig``, which
  signs the source's files, not the artifact's) and, unless the recipe says
  ``output: {readme: false}``, the generated model card README.md of :mod:`.card` (the source's
  own README.md is kept as SOURCE_README.md); a name clash is refused before any tensor is read.
* With ``signer`` (:mod:`.signing`), the complete staging directory is signed as the last step
  before it is published, so a published artifact is never unsigned when a key was given.
* On CUDA, grouped tensors are encoded by the torch backend after a parity gate (the Section 12
  boundary corpus must match the oracle bit for bit, or conversion stops), and a sample of rows
  of every GPU-encoded tensor is re-encoded on the host and compared.  Tensors whose rule names
  MSE_F16_SEARCH_V1 or MSE_F16_SEARCH_IW_V1 are always encoded on the host, with their C kernel
  (docs/encoder-profiles.md).
* ``importance`` (MSE_F16_SEARCH_IW_V1 rules): the vectors are attached to the plan and checked
  before any tensor is read (:func:`~.importance.attach_importance`); the ones used are stored
  as the side file importance.safetensors and each tensor's provenance records its digest.
* ``factors`` (GPTQ_F16_SEARCH_IW_V1 rules, which need ``importance`` too): a factor file,
  read lazily; each such entry's [K, B] factor is checked before any tensor is read
  (:func:`~.factors.attach_factors`) and then dropped: the entry keeps a reference, and the
  factor is read again (its digest checked) only while its tensor is encoded and while the
  side file compensation.safetensors is written, one factor at a time; provenance records
  each factor's digest and block width.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .artifact_metadata import artifact_metadata, planned_metadata_size
from .card import (
    README_NAME,
    SOURCE_README_NAME,
    add_text_file,
    copied_side_files,
    render_readme,
    side_file_names,
)
from .container import DEFAULT_ALIGNMENT, ArtifactWriter, check_writer_alignment
from .container.publish import check_destination, check_free_space, check_writable
from .container.schema import Provenance, paused_gc
from .container.wire import SOURCE_DIGEST_PREFIX
from .container.writer import PlannedEntry, planned_size
from .convert_report import ConvertReport, OutputCheck, ProgressEvent
from .convert_tensors import RunnerResult, Tally, TensorRunner, write_tensors
from .derive import provenances, resolve_device
from .encoder.parity import cuda_parity_gate
from .errors import SourceError, UsageError
from .factors import attach_calibration, generated_files
from .recipe import Plan, Recipe, build_plan
from .signing import SIGNATURE_NAME, SignatureStatus, Signer, sign_directory
from .source import SideFileSource, SourceCheckpoint, open_source

__all__ = [
    "ConvertReport",
    "OutputCheck",
    "ProgressEvent",
    "RunnerResult",
    "TensorRunner",
    "check_output",
    "convert_checkpoint",
    "plan_conversion",
]


def plan_conversion(
    source: str | Path | SourceCheckpoint,
    recipe: str | Path | Recipe,
    *,
    check_identity: bool = True,
    importance: str | Path | None = None,
    factors: str | Path | None = None,
) -> tuple[SourceCheckpoint, Plan]:
    """Open the source and plan it against the recipe (metadata only); ``importance`` is the
    importance file of MSE_F16_SEARCH_IW_V1 and GPTQ_F16_SEARCH_IW_V1 rules, ``factors`` the
    factor file of the latter; their vectors and factors are attached and checked."""
    src = source if isinstance(source, SourceCheckpoint) else open_source(source)
    # Given a path, build_plan reports recipe-file and against-source problems together.
    plan = build_plan(recipe, src, check_identity=check_identity)
    _check_recorded_names(plan)
    side_file_names(plan, src.side_files)  # a model-card name clash fails a dry run too
    names = {name for _, name in side_file_names(plan, src.side_files)}
    return src, attach_calibration(plan, names, importance, factors, str(src.path))


def _check_recorded_names(plan: Plan) -> None:
    """The source path and file names the artifact records (metadata, card, plan report) are
    UTF-8 text: a name of other bytes (decoded with surrogate escapes) is refused here rather
    than met as an encoding error in the size plan or the report."""
    for text in (os.path.abspath(plan.source_path), *(name for name, _ in plan.source_files)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            shown = text.encode("utf-8", "backslashreplace").decode("utf-8")  # printable
            raise SourceError(
                "the name is not valid UTF-8 (the artifact records it as text)",
                path=shown,
                hint="rename it, or convert from a path whose names are UTF-8",
            ) from None


# ---------------------------------------------------------------------------------------------
# provenance, destination checks and the planned size


def _provenances(plan: Plan) -> dict[str, Provenance]:
    """Every entry's parsed provenance, built once per conversion (the size plan and the
    writer both take it as is)."""
    return provenances(plan.entries)


# Files convert makes beside the artifact that its header does not list: --force replaces them.
_COMPANIONS = (SIGNATURE_NAME,)


def _source_paths(src: SourceCheckpoint) -> list[Path]:
    """Every path of the source an output must not be, contain or lie inside."""
    files = [src.file_path(n) for n, _ in src.files] + [f.path for f in src.side_files]
    if src.kind != "safetensors-file" and files:
        files.insert(0, files[0].parent)
    return files


# Room left for a signature (model.sig, written after the plan): a Sigstore bundle is a few KB
# plus about 150 bytes per file it lists; generous, since its exact size is known only then.
_SIGNATURE_ALLOWANCE = 64 << 10
_SIGNATURE_PER_FILE = 512


def _card_text(
    plan: Plan, src: SourceCheckpoint, side_files: list[tuple[SideFileSource, str]]
) -> str | None:
    """The generated README.md, or None when the recipe turns it off."""
    if not plan.recipe.output.readme:
        return None
    kept = any(name == SOURCE_README_NAME for _, name in side_files)
    return render_readme(plan, src.config, kept_source_card=kept)


def planned_output_bytes(
    plan: Plan,
    src: SourceCheckpoint,
    *,
    alignment: int,
    max_shard_size: int | None,
    signed: bool = False,
    prepared: tuple[str | None, Mapping[str, Provenance]] | None = None,
    planned: dict[str, PlannedEntry] | None = None,
) -> int:
    """The exact size of the model directory convert writes for ``plan`` (shards, index, side
    files, the generated card), plus an allowance for the signature when ``signed``.
    ``prepared``: the card text and the entries' provenance when the caller already has them
    (convert builds each once: the card's cost notes walk every entry); ``planned`` receives
    the planned header entries (for the writer: see ``ArtifactWriter(planned=...)``)."""
    digested = {s.name for e in plan.entries for s in e.sources} | {s.name for s in plan.skipped}
    side_files = copied_side_files(plan, src)
    sizes = [(name, source.size) for source, name in side_files]
    # The card is deterministic: the same text convert writes.
    card, provs = prepared or (_card_text(plan, src, side_files), _provenances(plan))
    if card is not None:
        sizes.append((README_NAME, len(card.encode("utf-8"))))
    sizes += [(name, size) for name, size, _ in generated_files(plan)]
    total = planned_size(
        ((e.output, e.format, e.shape, e.role, provs[e.output]) for e in plan.entries),
        # Digests are fixed-length: placeholders give the final size.
        metadata_size=planned_metadata_size(
            plan, src, digested, SOURCE_DIGEST_PREFIX + "0" * 32, alignment
        ),
        side_files=sizes,
        alignment=alignment,
        max_shard_size=max_shard_size,
        planned=planned,
    )
    if signed:
        total += _SIGNATURE_ALLOWANCE + _SIGNATURE_PER_FILE * (len(sizes) + len(plan.entries))
    return total


def check_output(
    src: SourceCheckpoint,
    plan: Plan,
    output: str | Path,
    *,
    force: bool = False,
    alignment: int = DEFAULT_ALIGNMENT,
    max_shard_size: int | None = None,
    signed: bool = False,
) -> OutputCheck:
    """The destination, permission and free-space checks of :func:`convert_checkpoint`, with
    nothing written (no lock is taken, so a concurrent run may change the answer)."""
    out = Path(output).absolute()
    dest = check_destination(out, force=force, sources=_source_paths(src), companions=_COMPANIONS)
    check_writable(out)
    needed = planned_output_bytes(
        plan, src, alignment=alignment, max_shard_size=max_shard_size, signed=signed
    )
    free = check_free_space(out.parent, needed)
    return OutputCheck(dest, needed, free)


# ---------------------------------------------------------------------------------------------
# the streaming pipeline


# The steps are helpers already; what is left is their order, inside one paused collector
# and one writer, and the runner hook takes that one line past the limit.
# long: every step of a conversion in its crash-safe order (see the comment above)
def convert_checkpoint(
    source: str | Path | SourceCheckpoint,
    recipe: str | Path | Recipe,
    output: str | Path,
    *,
    device: str = "auto",
    jobs: int = 2,
    max_shard_size: int | None = None,
    force: bool = False,
    check_identity: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
    progress: Callable[[ProgressEvent], None] | None = None,
    signer: Signer | None = None,
    on_notice: Callable[[str], None] | None = None,
    importance: str | Path | None = None,
    runner: TensorRunner | None = None,
    factors: str | Path | None = None,
) -> ConvertReport:
    """Convert ``source`` with ``recipe`` into the model directory ``output`` (signed with
    ``signer`` just before it is published, when given).  ``importance``: the importance file
    for MSE_F16_SEARCH_IW_V1 rules (docs/recipes.md); the vectors used are stored in the
    artifact as the side file importance.safetensors.  ``factors``: the factor file for
    GPTQ_F16_SEARCH_IW_V1 rules (stored as compensation.safetensors).  ``runner``: see the
    module contract."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"--jobs must be a positive integer, not {jobs!r}")
    check_writer_alignment(alignment)  # before any source byte is read
    # The collector's passes over the growing heap (source header, plan, size plan, header
    # entries) cost about a quarter of the CPU of 20,000 tiny tensors; nothing built per
    # tensor is cyclic, so reference counting frees it all (see paused_gc).
    with paused_gc():
        started = time.perf_counter()
        src, plan = plan_conversion(
            source, recipe, check_identity=check_identity, importance=importance, factors=factors
        )
        side_files = copied_side_files(plan, src)  # refuses a clash before reading
        used_device = _encoding_device(plan, device)
        tally = Tally(plan, started, progress)
        metadata = artifact_metadata(plan, src, {}, alignment)
        card = _card_text(plan, src, side_files)  # deterministic: planned and written the same
        provs = _provenances(plan)
        planned: dict[str, PlannedEntry] = {}  # filled by the size plan, used by the writer
        writer = ArtifactWriter(
            output,
            metadata=metadata,
            alignment=alignment,
            max_shard_size=max_shard_size,
            overwrite=force,
            sources=_source_paths(src),
            companions=_COMPANIONS,
            expected_bytes=planned_output_bytes(
                plan,
                src,
                alignment=alignment,
                max_shard_size=max_shard_size,
                signed=signer is not None,
                prepared=(card, provs),
                planned=planned,
            ),
            on_notice=on_notice,
            planned=planned,
        )
        with writer:
            tally.emit(None)
            digests, details = _store(runner, writer, plan, src, provs, used_device, jobs, tally)
            # Skipped tensors are part of the source identity too: digest them while reading.
            for skipped in plan.skipped:
                digests[skipped.name] = src.read(skipped.name).digest
            _add_side_files(writer, plan, src, side_files, card)
            writer.set_metadata(artifact_metadata(plan, src, digests, alignment))
            out, signature = _sign_and_commit(writer, signer)
        files = tuple(sorted(p.name for p in out.iterdir()))
        return ConvertReport(
            output=out,
            plan=plan,
            device=used_device,
            jobs=jobs,
            tensors=len(plan.entries),
            source_bytes=tally.total_bytes,
            written_bytes=tally.written,
            files=files,
            elapsed_s=time.perf_counter() - started,
            spot_checked_rows=tally.spot_rows,
            signature=signature,
            notices=tuple(writer.notes),
            runner=details,
        )


def _encoding_device(plan: Plan, device: str) -> str:
    """The device grouped tensors are encoded on (after the CUDA parity gate when that is
    CUDA); "cpu" when nothing is encoded, since there is then no device to choose."""
    grouped = sorted({e.format for e in plan.entries if e.encoder_profile is not None})
    used_device = resolve_device(device) if grouped or device == "cuda" else "cpu"
    if used_device == "cuda" and grouped:
        cuda_parity_gate(grouped, device="cuda")
    return used_device


def _store(
    runner: TensorRunner | None,
    writer: ArtifactWriter,
    plan: Plan,
    src: SourceCheckpoint,
    provs: Mapping[str, Provenance],
    device: str,
    jobs: int,
    tally: Tally,
) -> tuple[dict[str, str], dict[str, Any] | None]:
    """Every tensor into the writer, by ``runner`` or by the local pipeline; the source
    digests read and the runner's details for the report."""
    if runner is None:
        return write_tensors(writer, plan, src, provs, device, jobs, tally), None
    ran = runner(writer, plan, src, device, tally.stored)
    tally.spot_rows += ran.spot_checked_rows
    return dict(ran.source_digests), ran.details


def _add_side_files(
    writer: ArtifactWriter,
    plan: Plan,
    src: SourceCheckpoint,
    side_files: list[tuple[SideFileSource, str]],
    card: str | None,
) -> None:
    """The model directory's files beside the artifact: the source's side files, the model
    card, the importance vectors and the factors used."""
    for path, name in side_files:
        writer.add_file(path, name)
    if card is not None:
        add_text_file(writer, README_NAME, card)
    for name, size, chunks in generated_files(plan):
        writer.add_stream(name, size, chunks())  # a factor at a time, never the whole file


def _sign_and_commit(
    writer: ArtifactWriter, signer: Signer | None
) -> tuple[Path, SignatureStatus | None]:
    """Publish the staged directory, signed first when ``signer`` is given."""
    signed: list[SignatureStatus] = []

    def sign_staged(staging: Path) -> None:
        if signer is not None:
            signed.append(sign_directory(staging, signer, lock=False))

    out = Path(writer.commit(before_publish=sign_staged))
    # The signature was written in the staging directory, now renamed to ``out``.
    return out, replace(signed[0], path=str(out / SIGNATURE_NAME)) if signed else None
