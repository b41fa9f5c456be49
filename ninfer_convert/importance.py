"""Importance vectors of MSE_F16_SEARCH_IW_V1 and GPTQ_F16_SEARCH_IW_V1: the file format,
reading, writing, digests (the compensation factors of the latter: :mod:`.factors`).

Contract (docs/recipes.md "Importance", docs/container.md section 4.10): an importance file is
a safetensors file whose tensors are one-dimensional ``F32`` vectors keyed by the *source*
weight name they belong to (``model.layers.0.mlp.down_proj.weight``), one binary32 weight per
column K of the [N, K] matrix the encoder sees.  ``ninfer calibrate`` writes one; a recipe names
one; the converter copies the vectors it used into the artifact as the side file
:data:`IMPORTANCE_FILE`, written by :func:`importance_bytes` (a pure function of the vectors:
names sorted, no metadata, so the same vectors give the same bytes), and records each vector's
digest in the tensor's provenance (:func:`vector_digest`).  Reading goes through the source
reader (:func:`~ninfer_convert.source.open_source`), so a hostile file gets the same typed
checks as a checkpoint.  Weight *values* are checked where they are used
(:func:`~ninfer_convert.encoder.mse_search.check_weights`: finite, sign bit clear, length K).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .container.wire import digest_hex
from .errors import ArtifactError, RecipeError, SourceError, UsageError
from .formats import lookup_profile
from .source import open_source
from .source.header import parse_header_bytes

if TYPE_CHECKING:
    from .recipe.plan import Plan, PlanEntry

__all__ = [
    "IMPORTANCE_FILE",
    "ImportanceSet",
    "attach_importance",
    "calibration_key",
    "check_importance_output",
    "check_safetensors_suffix",
    "f32_file_bytes",
    "f32_file_header",
    "f32_file_size",
    "f32_file_size_of",
    "frozen_words",
    "importance_bytes",
    "load_importance",
    "needs_importance",
    "stored_vectors",
    "vector_digest",
    "vectors_from_artifact",
    "write_importance_file",
    "write_new_file",
]

IMPORTANCE_FILE = "importance.safetensors"
"""The artifact's side file holding every importance vector the encoder used."""


@dataclass(frozen=True)
class ImportanceSet:
    """The vectors of one importance file, by source weight name (binary32 words, read-only)."""

    path: str
    vectors: Mapping[str, npt.NDArray[np.uint32]]


def vector_digest(words: npt.NDArray[np.uint32]) -> str:
    """xxh3-128 (32 lowercase hex digits, as plane digests) of the vector's little-endian
    binary32 bytes: the tensor's ``provenance.importance``."""
    return digest_hex(np.ascontiguousarray(words, dtype="<u4").tobytes())


def needs_importance(entry: PlanEntry) -> bool:
    return entry.encoder_profile is not None and lookup_profile(entry.encoder_profile).importance


def calibration_key(
    entry: PlanEntry, vectors: Mapping[str, npt.NDArray[np.uint32]], what: str = "importance vector"
) -> str | None:
    """The importance-file name whose vector belongs to ``entry``: its own output name, else,
    for a row concat (axis 0 of rank-two inputs: every part has the same K columns), the
    sources' names when all of them hold byte-identical vectors (factors: the same)."""
    if entry.output in vectors:
        return entry.output
    names = [s.name for s in entry.sources]
    if all(n in vectors for n in names):
        first = vectors[names[0]]
        if all(np.array_equal(vectors[n], first) for n in names[1:]):
            return names[0]
        raise RecipeError(
            f"tensor {entry.output}: its sources have different {what}s "
            f"({', '.join(names)}), so no single {what} covers its columns",
            where=f"recipe rule {entry.rule.index + 1} at line {entry.rule.line}",
            hint=f"add an entry named {entry.output!r} to the file",
        )
    return None


def _check_transforms(entry: PlanEntry) -> None:
    for t in entry.transforms:
        rows = (
            t.op == "concat" and all(len(s.shape) == 2 for s in entry.sources) and t.axis in (0, -2)
        )
        if not rows:
            raise RecipeError(
                f"tensor {entry.output}: rule {entry.rule.index + 1} applies a {t.op} "
                "transform, which moves or regroups the input columns an importance vector "
                "is indexed by",
                where=f"recipe rule {entry.rule.index + 1} at line {entry.rule.line}",
                hint="MSE_F16_SEARCH_IW_V1 takes tensors without transforms, or a row concat "
                "(axis 0) of rank-two inputs; use MSE_F16_SEARCH_V1 for this rule",
            )


def attach_importance(
    plan: Plan, vectors: Mapping[str, npt.NDArray[np.uint32]] | None, where: str
) -> Plan:
    """The plan with each MSE_F16_SEARCH_IW_V1 entry's importance vector attached (checked:
    present, length K, finite and >= +0, no column-moving transform); an entry without a
    vector whose rule has a ``fallback_profile`` gets that profile instead (no vector), but
    at least one entry must get a vector.  ``where`` names the
    importance file (or the artifact) in messages.  Vectors of other tensors are ignored."""
    from .encoder.mse_search import check_weights

    todo = [e for e in plan.entries if needs_importance(e)]
    if not todo:
        return plan
    if vectors is None:
        raise UsageError(
            f"{len(todo)} tensors use an importance-weighted encoder profile (first: "
            f"{todo[0].output}) but no importance file was given",
            hint="pass --importance FILE (write one with: ninfer calibrate SOURCE -o FILE)",
        )
    out: list[PlanEntry] = []
    for e in plan.entries:
        if not needs_importance(e):
            out.append(e)
            continue
        fallback = next(r for r in plan.recipe.rules if r.index == e.rule.index).fallback_profile
        if fallback is None:
            _check_transforms(e)
        name = calibration_key(e, vectors)
        if name is None and fallback is not None:
            # The rule says what to do without a vector (docs/recipes.md 4.8): the plan, the
            # artifact's provenance and verify's re-plan all carry the fallback profile.
            out.append(dataclasses.replace(e, encoder_profile=fallback))
            continue
        _check_transforms(e)
        if name is None:
            raise RecipeError(
                f"tensor {e.output}: rule {e.rule.index + 1} selects {e.encoder_profile} but "
                f"the importance file has no vector named {e.output!r}",
                path=where,
                where=f"recipe rule {e.rule.index + 1} at line {e.rule.line}",
                hint="calibrate the same model (ninfer calibrate) or give this tensor another "
                "profile",
            )
        words = check_weights(vectors[name], e.shape[-1], e.output)
        out.append(dataclasses.replace(e, importance=words))
    if not any(e.importance is not None for e in out):
        # Only fallback rules, and no vector for any of their tensors: surely the wrong file
        # (and an artifact without vectors could not say which file it was made with).
        raise RecipeError(
            f"the importance file has a vector for none of the {len(todo)} tensors whose "
            f"rules select an importance-weighted encoder profile (first: {todo[0].output})",
            path=where,
            hint="calibrate this model (ninfer calibrate SOURCE -o FILE) and pass that file",
        )
    return dataclasses.replace(plan, entries=tuple(out))


def stored_vectors(plan: Plan) -> dict[str, npt.NDArray[np.uint32]]:
    """The vectors an artifact stores: one per weighted entry, under the entry's name."""
    return {e.output: e.importance for e in plan.entries if e.importance is not None}


def vectors_from_artifact(
    data: bytes | None, where: str
) -> Mapping[str, npt.NDArray[np.uint32]] | None:
    """Parse the artifact's importance side file (already digest-checked by the caller)."""
    if data is None:
        return None
    try:
        header = parse_header_bytes(data, IMPORTANCE_FILE)
        out: dict[str, npt.NDArray[np.uint32]] = {}
        for name, entry in header.tensors.items():
            _check_vector(name, entry.dtype, entry.shape, IMPORTANCE_FILE)
            words = np.frombuffer(data, dtype="<u4", count=entry.shape[0], offset=entry.begin)
            out[name] = frozen_words(words)
    except (UsageError, SourceError) as exc:
        raise ArtifactError(
            f"the importance side file is invalid: {exc.message}", path=where
        ) from None
    return MappingProxyType(out)


def importance_bytes(
    vectors: Mapping[str, npt.NDArray[np.uint32]], metadata: Mapping[str, str] | None = None
) -> bytes:
    """A safetensors file of the vectors: names sorted, data in that order, the JSON header
    compact with sorted keys and padded with spaces to a multiple of 8 bytes."""
    return f32_file_bytes({k: np.asarray(v).reshape(-1) for k, v in vectors.items()}, metadata)


def f32_file_size(arrays: Mapping[str, npt.NDArray[np.uint32]]) -> int:
    """``len(factor_bytes(arrays))`` (or of :func:`importance_bytes` for vectors) without
    building the data: what the converter plans for the side file."""
    return f32_file_size_of(_shapes(arrays))


def f32_file_size_of(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The size of the canonical file of arrays of these shapes (:func:`f32_file_size` from
    the shapes alone: what the converter plans for a side file it writes streaming)."""
    text = f32_file_header(shapes, None)
    return 8 + len(text) + 4 * sum(math.prod(s) for s in shapes.values())


def _shapes(arrays: Mapping[str, npt.NDArray[np.uint32]]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(int(d) for d in np.shape(a)) for name, a in arrays.items()}


def f32_file_header(
    shapes: Mapping[str, tuple[int, ...]], metadata: Mapping[str, str] | None
) -> bytes:
    """The JSON header of the canonical file of arrays of these shapes (without its 8-byte
    length prefix): names sorted, data offsets in that order, compact with sorted keys, padded
    with spaces to a multiple of 8 bytes.  The data follows it in name order."""
    header: dict[str, object] = {}
    offset = 0
    for name in sorted(shapes):
        n = math.prod(shapes[name])
        header[name] = {
            "dtype": "F32",
            "shape": [int(d) for d in shapes[name]],
            "data_offsets": [offset, offset + 4 * n],
        }
        offset += 4 * n
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return text + b" " * (-len(text) % 8)


def f32_file_bytes(
    arrays: Mapping[str, npt.NDArray[np.uint32]], metadata: Mapping[str, str] | None
) -> bytes:
    """The canonical safetensors bytes of binary32 arrays (importance and factor files)."""
    names = sorted(arrays)
    text = f32_file_header(_shapes(arrays), metadata)
    body = b"".join(
        np.ascontiguousarray(arrays[name], dtype="<u4").reshape(-1).tobytes() for name in names
    )
    return struct.pack("<Q", len(text)) + text + body


def write_importance_file(
    path: str | os.PathLike[str],
    vectors: Mapping[str, npt.NDArray[np.uint32]],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a new importance file; an existing path is refused (never overwritten), and an
    interrupted write leaves only ``<name>.partial``, never a file that looks finished.  A
    failure of the file system is a :class:`~ninfer_convert.errors.ResourceError` and leaves
    nothing behind."""
    write_new_file(path, importance_bytes(vectors, metadata), "importance file")


def write_new_file(path: str | os.PathLike[str], data: bytes, what: str) -> None:
    """Write ``data`` as the new file ``path`` (the rules of :func:`write_importance_file`);
    ``what`` names the file in messages."""
    from .container.publish import resource_error

    p = check_importance_output(path)
    tmp = _partial(p)
    try:
        fd = os.open(tmp, _CREATE_NEW, 0o666)  # the umask applies, as for open()
    except FileExistsError:
        raise _partial_exists(tmp) from None
    except OSError as exc:
        raise resource_error(exc, tmp, doing=f"writing the {what}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, p)  # fails instead of replacing a file that appeared meanwhile
    except FileExistsError:
        raise _output_exists(p) from None
    except OSError as exc:
        raise resource_error(exc, p, doing=f"writing the {what}") from None
    finally:
        os.unlink(tmp)


_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def check_importance_output(path: str | os.PathLike[str]) -> Path:
    """Refuse (:class:`~ninfer_convert.errors.UsageError`) an output the writer would refuse,
    so that ``ninfer calibrate`` says so before it loads and runs the model: a name without
    ``.safetensors``, an existing file (or link), a ``<name>.partial`` left by an interrupted
    run (never removed: the tool cannot know it made it), a parent that is not a directory."""
    p = Path(path)
    check_safetensors_suffix(p)
    if os.path.lexists(p):
        raise _output_exists(p)
    if os.path.lexists(_partial(p)):
        raise _partial_exists(_partial(p))
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(
            "the output's directory "
            + ("is not a directory" if os.path.lexists(parent) else "does not exist"),
            path=str(parent),
            hint="create the directory first or choose another --output",
        )
    return p


def _partial(p: Path) -> Path:
    return p.with_name(p.name + ".partial")


def _output_exists(p: Path) -> UsageError:
    return UsageError(
        "the output file exists; calibrate never overwrites a file",
        path=str(p),
        hint="choose a new --output name or remove the old file yourself",
    )


def _partial_exists(tmp: Path) -> UsageError:
    return UsageError(
        "a partial output file of an interrupted run (or of a run still writing) exists",
        path=str(tmp),
        hint="remove it yourself once no other ninfer calibrate is writing it, or choose "
        "another --output",
    )


def check_safetensors_suffix(p: Path) -> None:
    """Refuse (:class:`~ninfer_convert.errors.UsageError`) a name without ``.safetensors``."""
    if p.suffix != ".safetensors":
        raise UsageError(
            "an importance or factor file is a safetensors file and its name must end in "
            ".safetensors",
            path=str(p),
        )


def _check_vector(name: str, dtype: str, shape: tuple[int, ...], where: str) -> None:
    if dtype != "F32" or len(shape) != 1 or shape[0] < 1:
        raise UsageError(
            f"importance vector {name!r} is {dtype} with shape {list(shape)}; "
            "every entry must be a non-empty one-dimensional F32 vector",
            path=where,
            hint="write the file with ninfer calibrate",
        )


def frozen_words(words: npt.NDArray[np.generic]) -> npt.NDArray[np.uint32]:
    """A read-only native uint32 copy of binary32 words."""
    out = np.array(words, dtype=np.uint32, copy=True)
    out.flags.writeable = False
    return out


def load_importance(path: str | os.PathLike[str]) -> ImportanceSet:
    """Read every vector of an importance file (F32, rank one, non-empty).  The path must be
    a regular file: the source reader would also take a directory (as a model directory)."""
    check_safetensors_suffix(Path(path))
    if not Path(path).is_file():
        raise UsageError(
            "the importance file "
            + ("is not a regular file" if os.path.lexists(path) else "does not exist"),
            path=str(path),
            hint="pass the .safetensors file that ninfer calibrate wrote",
        )
    src = open_source(Path(path))
    out: dict[str, npt.NDArray[np.uint32]] = {}
    for name, info in src.tensors.items():
        _check_vector(name, info.dtype, info.shape, str(path))
        out[name] = frozen_words(src.read(name).words)
    return ImportanceSet(str(path), MappingProxyType(out))
