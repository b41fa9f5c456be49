"""Checks of an opened artifact beyond the reader's own, needing no source.

Contract: :func:`artifact_level_findings` are ``structure`` findings (container-like files in
the artifact's directory that are not part of it); :func:`recipe_digest_findings` and
:func:`importance_findings` are ``integrity`` findings (``recipe.digest`` against the recorded
recipe text; the ``importance.safetensors`` and ``compensation.safetensors`` side files against
the provenance that records their entries' digests).
:func:`stored_importance` and :func:`stored_factor_set` read the importance vectors and
compensation factors the source checks re-derive with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt

from ..container import Artifact
from ..errors import ArtifactError, IntegrityError, NinferError
from ..factors import FACTOR_FILE, SideFileFactors, factor_digest
from ..importance import IMPORTANCE_FILE, vector_digest, vectors_from_artifact
from .report import Finding

__all__ = [
    "artifact_level_findings",
    "importance_findings",
    "recipe_digest_findings",
    "stored_factor_set",
    "stored_importance",
]


def stored_importance(art: Artifact) -> Mapping[str, npt.NDArray[np.uint32]] | None:
    """The artifact's importance vectors (its side file, digest-checked on read), or None."""
    if IMPORTANCE_FILE not in art.side_files:
        return None
    return vectors_from_artifact(art.read_side_file(IMPORTANCE_FILE), str(art.path))


def stored_factor_set(art: Artifact) -> Mapping[str, npt.NDArray[np.uint32]] | None:
    """The artifact's compensation factors, or None: its side file is digest-checked here in
    chunks (the :class:`~ninfer_convert.errors.IntegrityError` of ``read_side_file``), and
    each factor is read from it when it is asked for (one at a time: the side file can be
    many times the largest factor)."""
    if FACTOR_FILE not in art.side_files:
        return None
    art.check_side_file(FACTOR_FILE)
    size = art.side_files[FACTOR_FILE].size
    return SideFileFactors(
        lambda offset, n: art.read_side_range(FACTOR_FILE, offset, n), size, str(art.path)
    )


def artifact_level_findings(art: Artifact) -> list[Finding]:
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


def importance_findings(art: Artifact) -> list[Finding]:
    """docs/container.md (side file entries): ``importance.safetensors`` exists exactly when
    some tensor's provenance records an ``importance`` digest, holds exactly those tensors'
    entries, and each entry's digest is the recorded one; ``compensation.safetensors`` the
    same for ``provenance.factor`` (and each entry's width is ``provenance.factor_block``).
    Needs no source, so it runs with ``--no-source`` too.  A side file whose own digest fails
    is reported by ``integrity_problems`` already (nothing is added here)."""
    return _side_file_findings(
        art, IMPORTANCE_FILE, "importance", stored_importance, vector_digest
    ) + _side_file_findings(art, FACTOR_FILE, "factor", stored_factor_set, factor_digest)


def _side_file_findings(
    art: Artifact,
    file: str,
    key: str,
    read: Callable[[Artifact], Mapping[str, npt.NDArray[np.uint32]] | None],
    digest_of: Callable[[npt.NDArray[np.uint32]], str],
) -> list[Finding]:
    where = str((art.path if art.path.is_dir() else art.path.parent) / file)
    recorded: dict[str, str] = {}
    blocks: dict[str, int | None] = {}
    for name, info in art.tensors.items():
        value = getattr(info.entry.provenance, key)
        if value is not None:
            recorded[name] = value
            blocks[name] = info.entry.provenance.factor_block

    def problem(message: str, tensor: str | None) -> Finding:
        hint = "the header or the side file was edited after conversion; convert again"
        return Finding.of(
            "integrity", IntegrityError(message, path=where, tensor=tensor, hint=hint)
        )

    if file not in art.side_files:
        if not recorded:
            return []
        first = next(iter(recorded))
        return [
            problem(
                f"{len(recorded)} tensors record a {key} digest (first: {first}) but the "
                f"artifact has no side file {file}",
                first,
            )
        ]
    try:
        stored = read(art) or {}
    except IntegrityError:
        return []
    except NinferError as exc:
        return [problem(exc.message, None)]
    out = []
    for name, digest in recorded.items():
        if name not in stored:
            out.append(problem(f"provenance.{key} is {digest} but the side file has no "
                               f"entry named {name!r}", name))  # fmt: skip
            continue
        try:  # one entry at a time (a factor is read here, then dropped)
            value = stored[name]
        except NinferError as exc:  # the side file changed since its digest was checked
            out.append(problem(exc.message, name))
            break
        got, width = digest_of(value), int(value.shape[-1])
        del value
        if got != digest:
            out.append(problem(f"provenance.{key} is {digest} but the side file's entry "
                               f"has digest {got}", name))  # fmt: skip
        elif key == "factor" and blocks[name] != width:
            out.append(problem(f"provenance.factor_block is {blocks[name]} but the side "
                               f"file's factor is {width} wide", name))  # fmt: skip
    for name in sorted(set(stored) - set(recorded)):
        out.append(problem(f"the side file has an entry {name!r} for a tensor that records no "
                           f"{key} digest", name))  # fmt: skip
    return out


def recipe_digest_findings(art: Artifact) -> list[Finding]:
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
