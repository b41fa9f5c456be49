"""Compensation factors of GPTQ_F16_SEARCH_IW_V1: the file format, reading, writing, digests,
and the attachment of a conversion's calibration files (importance vectors and factors).

Contract (docs/recipes.md "Compensated rules", docs/container.md section 4.6): a factor file
is a safetensors file like an importance file (:mod:`.importance`) whose tensors are
two-dimensional ``F32`` [K, B] factors (B a positive multiple of 128) keyed by source weight
name; ``ninfer calibrate --factors`` writes one, ``ninfer convert --factors`` reads it lazily
(:class:`FactorFile`: only the factors a rule uses are read), and the converter stores the
factors it used as the side file :data:`FACTOR_FILE` (the bytes of :func:`factor_bytes`, the
same pure function of the arrays as the importance side file, written streaming by
:func:`factor_chunks`), each tensor's provenance recording the factor's digest
(:func:`factor_digest`) and its block width.  Factor values are checked where they are
attached (:func:`~ninfer_convert.encoder.gptq.check_factor`: finite, positive diagonal, +0
outside the upper triangle of each block, [K, B]); a broken one is an
:class:`~ninfer_convert.errors.EncodeError` naming the file, the tensor and the rule.

Memory: a plan entry holds a :class:`FactorRef` (where the factor is, its shape and digest),
never the words: attaching reads each factor once to check and digest it and drops it, and
:meth:`FactorRef.words` reads it again for the one tensor being encoded (or verified) and
checks the digest, so a factor file changed during the run is an ``EncodeError``, and peak
memory follows the largest factor, not the model.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .container.wire import digest_hex
from .encoder.gptq_reference import BLOCK_UNIT
from .errors import ArtifactError, EncodeError, RecipeError, SourceError, UsageError
from .formats import lookup_profile
from .importance import (
    IMPORTANCE_FILE,
    attach_importance,
    calibration_key,
    check_safetensors_suffix,
    f32_file_bytes,
    f32_file_header,
    f32_file_size,
    f32_file_size_of,
    frozen_words,
    importance_bytes,
    load_importance,
    needs_importance,
    stored_vectors,
    write_new_file,
)
from .layouts.base import ceil_div
from .source import open_source
from .source.header import MAX_HEADER_BYTES, parse_header_bytes

if TYPE_CHECKING:
    from .recipe.plan import Plan, PlanEntry

__all__ = [
    "FACTOR_FILE",
    "FactorFile",
    "FactorRef",
    "SideFileFactors",
    "attach_calibration",
    "attach_factors",
    "factor_bytes",
    "factor_chunks",
    "factor_digest",
    "factor_words",
    "factors_from_artifact",
    "generated_files",
    "needs_factor",
    "stored_factors",
    "write_factor_file",
]

FACTOR_FILE = "compensation.safetensors"
"""The artifact's side file holding every compensation factor the encoder used."""


def factor_digest(words: npt.NDArray[np.uint32]) -> str:
    """xxh3-128 (32 lowercase hex digits) of the factor's row-major little-endian binary32
    bytes: the tensor's ``provenance.factor``."""
    return digest_hex(np.ascontiguousarray(words, dtype="<u4").data.cast("B"))


def needs_factor(entry: PlanEntry) -> bool:
    return entry.encoder_profile is not None and lookup_profile(entry.encoder_profile).factor


@dataclass(frozen=True)
class FactorRef:
    """A checked compensation factor by reference: the entry ``name`` of ``store`` (a factor
    file, the artifact's side file, or a mapping in memory) that tensor ``tensor`` uses, its
    [K, B] ``shape`` and the :func:`factor_digest` of the words that were checked; ``where``
    names the file in messages.  The words are not kept (see the module's "Memory")."""

    store: Mapping[str, npt.NDArray[np.uint32]] = dataclasses.field(repr=False, compare=False)
    name: str
    tensor: str
    shape: tuple[int, int]
    digest: str
    where: str

    @property
    def block(self) -> int:
        """The block width B (``provenance.factor_block``)."""
        return self.shape[1]

    def words(self) -> npt.NDArray[np.uint32]:
        """The factor's [K, B] binary32 words (read-only), read again from ``store``: an
        :class:`~ninfer_convert.errors.EncodeError` naming the tensor when they are not the
        words that were checked (the file changed since)."""
        words = _as_words(self.store[self.name])
        got = factor_digest(words) if words.shape == self.shape else None
        if got != self.digest:
            raise EncodeError(
                f"tensor {self.tensor}: the compensation factor {self.name!r} changed after it "
                f"was checked (digest {self.digest}, now "
                + (f"{got})" if got is not None else f"shape {list(words.shape)})"),
                path=self.where,
                tensor=self.tensor,
                hint="do not modify the factor file while ninfer runs; run it again",
            )
        return words


def _as_words(factor: npt.NDArray[np.generic]) -> npt.NDArray[np.uint32]:
    """Binary32 words as read-only contiguous native uint32 (no copy when they are already)."""
    f = np.asarray(factor)
    if f.dtype == np.float32:
        f = f.view(np.uint32)
    out = np.ascontiguousarray(f, dtype=np.uint32).view()  # a view: the caller's flags stay
    out.flags.writeable = False
    return out


def factor_words(entry: PlanEntry) -> npt.NDArray[np.uint32] | None:
    """The entry's compensation factor words, read for the tensor about to be encoded or
    verified (:meth:`FactorRef.words`), or None when it has none."""
    ref = entry.factor
    return None if ref is None else ref.words()


def factor_bytes(
    factors: Mapping[str, npt.NDArray[np.uint32]], metadata: Mapping[str, str] | None = None
) -> bytes:
    """A safetensors file of [K, B] factors, laid out exactly as :func:`importance_bytes`
    lays out vectors (names sorted, shapes [K, B], row-major data)."""
    return f32_file_bytes(factors, metadata)


def write_factor_file(
    path: str | os.PathLike[str],
    factors: Mapping[str, npt.NDArray[np.uint32]],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a new factor file, with the rules of :func:`write_importance_file`."""
    write_new_file(path, factor_bytes(factors, metadata), "factor file")


def attach_factors(
    plan: Plan, factors: Mapping[str, npt.NDArray[np.uint32]] | None, where: str
) -> Plan:
    """The plan with each GPTQ_F16_SEARCH_IW_V1 entry's compensation factor attached (checked:
    present, [K, B] with B a multiple of 128, the factor rules of
    :func:`~ninfer_convert.encoder.gptq.check_factor`).  Run after :func:`attach_importance`
    (which refuses column-moving transforms for every importance profile).  ``where`` names
    the factor file (or the artifact) in messages.  Factors of other tensors are not read.
    Each entry gets a :class:`FactorRef`: its factor is read once here (with the factor of a
    row concat's other parts, compared one at a time) and dropped."""
    from .encoder.gptq import check_factor

    todo = [e for e in plan.entries if needs_factor(e)]
    if not todo:
        return plan
    if factors is None:
        raise UsageError(
            f"{len(todo)} tensors use the compensated encoder profile {todo[0].encoder_profile} "
            f"(first: {todo[0].output}) but no factor file was given",
            hint="pass --factors FILE (write one with: ninfer calibrate SOURCE -o IMP "
            "--compensation-block 128 --factors FILE)",
        )
    out: list[PlanEntry] = []
    for e in plan.entries:
        if not needs_factor(e):
            out.append(e)
            continue
        rule = f"rule {e.rule.index + 1} (line {e.rule.line})"
        for candidate in [e.output] if e.output in factors else [s.name for s in e.sources]:
            if candidate in factors:  # before any entry is read (or compared)
                _check_declared_shape(e, candidate, _declared_shape(factors, candidate), where)
        name = calibration_key(e, factors, "compensation factor")
        if name is None:
            raise RecipeError(
                f"tensor {e.output}: rule {e.rule.index + 1} selects {e.encoder_profile} but "
                f"the factor file has no factor named {e.output!r}",
                path=where,
                where=f"recipe {rule}",
                hint="run ninfer calibrate --compensation-block B --factors FILE on the same "
                "model, or give this tensor another profile",
            )
        try:
            words = check_factor(factors[name], e.shape[-1], e.output)
        except EncodeError as exc:
            raise EncodeError(
                f"{exc.message} (factor {name!r}, {rule})",
                path=where,
                tensor=e.output,
                where=f"recipe {rule}",
                hint=exc.hint,
            ) from None
        k, b = (int(d) for d in words.shape)
        ref = FactorRef(factors, name, e.output, (k, b), factor_digest(words), where)
        del words  # read again when the tensor is encoded: only those in flight are held
        out.append(dataclasses.replace(e, factor=ref))
    return dataclasses.replace(plan, entries=tuple(out))


def _declared_shape(factors: Mapping[str, npt.NDArray[np.uint32]], name: str) -> tuple[int, ...]:
    """The shape of entry ``name``: from the file's header for a :class:`FactorFile` (nothing
    of the entry is read), else of the array in memory."""
    if isinstance(factors, (FactorFile, SideFileFactors)):
        return factors.shape_of(name)
    return tuple(int(d) for d in np.shape(factors[name]))


def _check_declared_shape(e: PlanEntry, name: str, shape: tuple[int, ...], where: str) -> None:
    """A factor entry for ``e`` is [K, B] with K the tensor's and B a positive multiple of 128
    of at most K rounded up to 128 (a wider block is the same single block with +0 columns
    added: one factor, one spelling), so what a factor file makes convert read and check is
    bounded by the tensor's K."""
    k = int(e.shape[-1])
    widest = ceil_div(k, BLOCK_UNIT) * BLOCK_UNIT
    if len(shape) == 2 and shape[0] == k and 0 < shape[1] <= widest and shape[1] % BLOCK_UNIT == 0:
        return
    rule = f"rule {e.rule.index + 1} (line {e.rule.line})"
    raise EncodeError(
        f"tensor {e.output}: the compensation factor must be [K, B] binary32 words with "
        f"K = {k} and B a positive multiple of {BLOCK_UNIT} of at most {widest} (K rounded up "
        f"to {BLOCK_UNIT}), got shape {list(shape)} (factor {name!r}, {rule})",
        path=where,
        tensor=e.output,
        where=f"recipe {rule}",
        hint="recompute the factor file with ninfer calibrate for this source",
    )


def stored_factors(plan: Plan) -> dict[str, FactorRef]:
    """The factors an artifact stores: one per compensated entry, under the entry's name."""
    return {e.output: e.factor for e in plan.entries if e.factor is not None}


def factor_chunks(factors: Mapping[str, FactorRef]) -> Iterator[bytes | memoryview]:
    """The bytes of :func:`factor_bytes` of the referenced factors, as chunks: the length
    prefix and header (known from the shapes), then each factor's words in name order, each
    read when its chunk is asked for (so one factor is in memory at a time) and checked
    against its digest (:meth:`FactorRef.words`)."""
    text = f32_file_header({n: r.shape for n, r in factors.items()}, None)
    yield struct.pack("<Q", len(text)) + text
    for name in sorted(factors):
        words = np.ascontiguousarray(factors[name].words(), dtype="<u4")
        yield words.data.cast("B")
        del words


class FactorFile(Mapping[str, npt.NDArray[np.uint32]]):
    """The factors of a factor file by source weight name, read on first use (a factor file
    holds one [K, B] factor per Linear, so only the ones a rule uses are read)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        check_safetensors_suffix(Path(path))
        if not Path(path).is_file():
            raise UsageError(
                "the factor file "
                + ("is not a regular file" if os.path.lexists(path) else "does not exist"),
                path=str(path),
                hint="pass the .safetensors file that ninfer calibrate --factors wrote",
            )
        self.path = str(path)
        # Resolved now, in the driver's working directory: a shard task of convert --ray
        # runs in another one, where a relative path would name another file (or none).
        self._absolute = os.path.abspath(path)
        self._src = open_source(Path(path))
        for name, info in self._src.tensors.items():
            _check_factor_entry(name, info.dtype, info.shape, self.path)

    def __reduce__(self) -> tuple[type[FactorFile], tuple[str]]:
        # By path (reopened, its header checked again): plan entries travel to the shard
        # tasks of convert --ray, whose FactorRef.words() then checks each factor's digest.
        return (FactorFile, (self._absolute,))

    def shape_of(self, name: str) -> tuple[int, ...]:
        """The entry's shape from the file's header (nothing of the entry is read)."""
        return tuple(int(d) for d in self._src.tensors[name].shape)

    def __getitem__(self, name: str) -> npt.NDArray[np.uint32]:
        info = self._src.tensors[name]  # KeyError for an unknown name, as a Mapping should
        return frozen_words(self._src.read(name).words).reshape(info.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self._src.tensors)

    def __len__(self) -> int:
        return len(self._src.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._src.tensors


class SideFileFactors(Mapping[str, npt.NDArray[np.uint32]]):
    """The factors of a factor side file read in parts: ``read(offset, size)`` returns those
    bytes of the ``size``-byte file (the artifact's pinned descriptor, or bytes in memory).
    The header is read and checked here (an :class:`~ninfer_convert.errors.ArtifactError`
    naming ``where``); each factor is read when it is asked for, and not kept."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, where: str) -> None:
        self._read = read
        try:
            head = read(0, min(size, 8))
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            fits = len(head) == 8 and n <= MAX_HEADER_BYTES and 8 + n <= size
            header = parse_header_bytes(
                read(0, 8 + n) if fits else head, FACTOR_FILE, file_size=size
            )
            for name, entry in header.tensors.items():
                _check_factor_entry(name, entry.dtype, entry.shape, FACTOR_FILE)
        except (UsageError, SourceError) as exc:
            raise ArtifactError(
                f"the factor side file is invalid: {exc.message}", path=where
            ) from None
        self._entries = header.tensors

    def shape_of(self, name: str) -> tuple[int, ...]:
        """The entry's shape from the header (nothing of the entry is read)."""
        return tuple(int(d) for d in self._entries[name].shape)

    def __getitem__(self, name: str) -> npt.NDArray[np.uint32]:
        entry = self._entries[name]  # KeyError for an unknown name, as a Mapping should
        k, b = entry.shape
        data = self._read(entry.begin, 4 * k * b)
        words = np.frombuffer(data, dtype="<u4").astype(np.uint32, copy=False)
        return _as_words(words.reshape(k, b))

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def factors_from_artifact(data: bytes | None, where: str) -> SideFileFactors | None:
    """The factors of a factor side file held in memory (already digest-checked by the
    caller); verify reads the artifact's in parts instead (:class:`SideFileFactors`)."""
    if data is None:
        return None
    return SideFileFactors(lambda offset, size: data[offset : offset + size], len(data), where)


def _check_factor_entry(name: str, dtype: str, shape: tuple[int, ...], where: str) -> None:
    if dtype != "F32" or len(shape) != 2 or shape[0] < 1 or shape[1] < 1 or shape[1] % 128:
        raise UsageError(
            f"compensation factor {name!r} is {dtype} with shape {list(shape)}; every entry "
            "must be a two-dimensional F32 [K, B] factor with B a positive multiple of 128",
            path=where,
            hint="write the file with ninfer calibrate --compensation-block B --factors FILE",
        )


def attach_calibration(
    plan: Plan,
    side_names: set[str],
    importance: str | os.PathLike[str] | None,
    factors: str | os.PathLike[str] | None,
    source_path: str,
) -> Plan:
    """The plan with the importance vectors and factors of its rules attached from the
    given files (convert): a file no rule needs, or a needed one missing, is refused, and so
    is a source side file (``side_names``: their names in the artifact) that would take the
    name of a generated one."""
    vectors = load_importance(importance).vectors if importance is not None else None
    if vectors is not None and not any(needs_importance(e) for e in plan.entries):
        raise UsageError(
            "an importance file was given but no recipe rule selects an importance-weighted "
            "encoder profile",
            path=str(importance),
            hint="select encoder_profile: MSE_F16_SEARCH_IW_V1 in the rules it is for, or "
            "drop --importance",
        )
    # Before attach_importance: a compensated tensor without a vector may take its rule's
    # fallback_profile there, and then no longer needs a factor.
    compensated = [e.output for e in plan.entries if needs_factor(e)]
    plan = attach_importance(plan, vectors, str(importance))
    factor_file = FactorFile(factors) if factors is not None else None
    if factor_file is not None and not any(needs_factor(e) for e in plan.entries):
        if compensated:
            raise UsageError(
                f"a factor file was given but every tensor whose rule selects a compensated "
                f"encoder profile took its rule's fallback_profile, since the importance file "
                f"has a vector for none of these {len(compensated)} tensors (first: "
                f"{compensated[0]}), so no factor is used",
                path=str(factors),
                hint="pass the importance file written with these factors (ninfer calibrate "
                "... --factors), or drop --factors",
            )
        raise UsageError(
            "a factor file was given but no recipe rule selects a compensated encoder profile",
            path=str(factors),
            hint="select encoder_profile: GPTQ_F16_SEARCH_IW_V1 in the rules it is for, or "
            "drop --factors",
        )
    plan = attach_factors(plan, factor_file, str(factors))
    for name, _size, _data in generated_files(plan):
        if name in side_names:
            raise UsageError(
                f"the source has a side file named {name}, the name the artifact's "
                "importance vectors or factors are stored under",
                path=source_path,
                hint="rename or remove that file in a copy of the source",
            )
    return plan


GeneratedFile = tuple[str, int, Callable[[], Iterable[bytes | memoryview]]]
"""(name, exact size, the bytes as chunks) of a side file convert generates."""


def generated_files(plan: Plan) -> list[GeneratedFile]:
    """(name, exact size, chunks) of the side files the plan's calibration data makes: the
    importance vectors and the factors used, each file only when some tensor uses one.  The
    sizes come from the plan (no factor is read); the factors' chunks are
    :func:`factor_chunks` (one factor in memory at a time)."""
    out: list[GeneratedFile] = []
    vectors = stored_vectors(plan)
    if vectors:
        flat = {k: np.asarray(v).reshape(-1) for k, v in vectors.items()}
        out.append((IMPORTANCE_FILE, f32_file_size(flat), lambda: [importance_bytes(vectors)]))
    factors = stored_factors(plan)
    if factors:
        size = f32_file_size_of({n: r.shape for n, r in factors.items()})
        out.append((FACTOR_FILE, size, lambda: factor_chunks(factors)))
    return out
