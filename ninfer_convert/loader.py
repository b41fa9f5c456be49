"""Torch loader: an artifact's tensors as a lazy state dict, under artifact or source names.

Contract (docs/cli.md, "Loading an artifact in Python"; docs/container.md section 4.9):

* :func:`load_state_dict` returns a :class:`ArtifactStateDict`, a read-only
  ``Mapping[str, torch.Tensor]`` that decodes **one stored tensor per lookup**: nothing is
  decoded when it is built, and it keeps at most one decoded stored tensor cached (so the
  pieces of a split concat cost one decode).  Peak memory follows the largest tensor, never
  the model.
* Values: each stored tensor is reconstructed per the numeric-format specification (grouped
  formats Section 6.2, NVFP4 Section 3.3, FP8 row Section 3.4) as exact binary32, then
  converted to the asked ``dtype`` (float32, or bfloat16 by round-to-nearest-even).  Direct
  formats are exact: BF16 words come back bit for bit as bfloat16 (or widened exactly to
  float32), FP32 words bit for bit as float32, and I32 stays int32 whatever ``dtype`` says.
* ``names="artifact"``: one key per stored tensor, its stored name and logical shape.
* ``names="source"``: the recipe's derivation is inverted from the recorded provenance, so the
  keys and shapes are the source checkpoint's: a reshape is undone (back to the shape before
  it), a transpose undone, and a concat split back into its sources, in the order and with the
  sizes ``provenance.sources`` records, under their source names.  A copy-path tensor (NVFP4,
  FP8 row) is reported under its stored name, the name of the weight its copied parts encode
  (what a dense model of the source expects).  A provenance that does not reproduce the
  stored shape, or two tensors claiming one source name, is an :class:`ArtifactError`.
* Tensors the recipe skipped are not in the artifact and so not in the mapping.

``torch.nn.Module.load_state_dict`` copies the mapping into a dict first, so with it every value
is decoded at once; :func:`ninfer_convert.evaluate.load_artifact_into` copies tensor by tensor
into an allocated model instead, holding one tensor extra.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from .container import Artifact, open_artifact
from .container.reader import TensorInfo
from .dequant import dequantize_logical
from .errors import ArtifactError, UsageError
from .formats import lookup_format
from .logical import DirectWords, FP8RowWords, GroupedCodes, LogicalTensor, NVFP4Words

if TYPE_CHECKING:
    import torch

__all__ = ["ArtifactStateDict", "load_state_dict"]

Names = Literal["source", "artifact"]
_BLOCK_ELEMENTS = 1 << 22
"""Elements reconstructed per row block (16 MiB of float32)."""


@dataclass(frozen=True)
class _Piece:
    """Where one key's value comes from: a stored tensor, and the inversion to apply."""

    stored: str
    steps: tuple[tuple[str, tuple[int, ...]], ...]
    """Inverse steps in application order: ("reshape", shape) or ("transpose", ())."""
    split: tuple[int, int, int] | None
    """(axis, start, length) of a concat piece, applied after ``steps``; None for no split."""
    shape: tuple[int, ...]


def _normalize_axis(axis: int, rank: int) -> int | None:
    a = axis + rank if axis < 0 else axis
    return a if 0 <= a < rank else None


def _source_pieces(info: TensorInfo, path: str) -> list[tuple[str, _Piece]]:
    """The source keys of one stored tensor, from its provenance (docs/container.md 4.9)."""
    prov = info.provenance
    transforms: list[dict[str, Any]] = list(prov["transforms"])
    sources: list[dict[str, Any]] = list(prov["sources"])

    def bad(why: str) -> ArtifactError:
        return ArtifactError(
            f"provenance cannot be inverted: {why}",
            path=path,
            tensor=info.name,
            hint="names='artifact' loads the stored tensors without inverting the derivation",
        )

    if any(t["op"] == "copy-quantized" for t in transforms):
        if len(transforms) != 1:
            raise bad("a copy-quantized tensor records no other transform")
        return [(info.name, _Piece(info.name, (), None, info.shape))]
    if not sources:
        raise bad("no source tensor is recorded")
    shapes = [tuple(int(d) for d in s["shape"]) for s in sources]
    # Walk forward from the recorded source shapes, remembering the shape before each step.
    concat: tuple[int, list[int]] | None = None
    if transforms and transforms[0]["op"] == "concat":
        rank = len(shapes[0])
        axis = _normalize_axis(int(transforms[0]["axis"]), rank)
        if len(sources) < 2 or axis is None or any(len(s) != rank for s in shapes):
            raise bad(
                f"concat on axis {transforms[0]['axis']} of sources with shapes "
                f"{[list(s) for s in shapes]}"
            )
        for s in shapes[1:]:
            if any(s[d] != shapes[0][d] for d in range(rank) if d != axis):
                raise bad(f"concat sources {[list(x) for x in shapes]} differ off axis {axis}")
        shape = list(shapes[0])
        shape[axis] = sum(s[axis] for s in shapes)
        current = tuple(shape)
        concat = (axis, [s[axis] for s in shapes])
        rest = transforms[1:]
    elif len(sources) == 1:
        current = shapes[0]
        rest = transforms
    else:
        raise bad(f"{len(sources)} sources are recorded but no leading concat")
    inverse: list[tuple[str, tuple[int, ...]]] = []
    for t in rest:
        if t["op"] == "transpose":
            if len(current) != 2:
                raise bad(f"transpose of a tensor of shape {list(current)}")
            inverse.append(("transpose", ()))
            current = (current[1], current[0])
        elif t["op"] == "reshape":
            target = tuple(int(d) for d in t["shape"])
            if math.prod(target) != math.prod(current):
                raise bad(f"reshape of {list(current)} to {list(target)}")
            inverse.append(("reshape", current))
            current = target
        else:
            raise bad(f"transform {t['op']!r} after the first step")
    if current != info.shape:
        raise bad(
            f"the recorded sources and transforms give shape {list(current)}, the tensor is "
            f"{list(info.shape)}"
        )
    steps = tuple(reversed(inverse))
    if concat is None:
        return [(str(sources[0]["name"]), _Piece(info.name, steps, None, shapes[0]))]
    axis, sizes = concat
    out: list[tuple[str, _Piece]] = []
    start = 0
    for src, size, shp in zip(sources, sizes, shapes, strict=True):
        out.append((str(src["name"]), _Piece(info.name, steps, (axis, start, size), shp)))
        start += size
    return out


class ArtifactStateDict(Mapping[str, "torch.Tensor"]):
    """A lazy, read-only state dict over an open artifact (see the module contract).

    Holds the artifact open: use it as a context manager or call :meth:`close`.  Keys are in
    stored order (the pieces of a split concat in their recorded order)."""

    def __init__(
        self,
        artifact: Artifact,
        *,
        names: Names,
        dtype: torch.dtype,
        device: str | torch.device,
        owns: bool,
    ) -> None:
        import torch

        if names not in ("source", "artifact"):
            raise UsageError(f"names must be 'source' or 'artifact', not {names!r}")
        if dtype not in (torch.float32, torch.bfloat16):
            raise UsageError(f"dtype must be torch.float32 or torch.bfloat16, not {dtype!r}")
        self._artifact = artifact
        self._owns = owns
        self.names: Names = names
        self.dtype = dtype
        self.device = torch.device(device)
        where = str(artifact.path)
        pieces: dict[str, _Piece] = {}
        for info in artifact.tensors.values():
            entries = (
                [(info.name, _Piece(info.name, (), None, info.shape))]
                if names == "artifact"
                else _source_pieces(info, where)
            )
            for key, piece in entries:
                if key in pieces:
                    raise ArtifactError(
                        f"source name {key!r} is claimed by both {pieces[key].stored!r} and "
                        f"{info.name!r}",
                        path=where,
                        tensor=info.name,
                        hint="names='artifact' loads the stored tensors by their own names",
                    )
                pieces[key] = piece
        self._pieces = pieces
        self._cached: tuple[str, torch.Tensor] | None = None

    # -- Mapping -----------------------------------------------------------------------------

    def __getitem__(self, key: str) -> torch.Tensor:
        piece = self._pieces[key]
        if piece.split is None:
            # One key per stored tensor: nothing to keep once it is returned.
            whole = decode_tensor(self._artifact, piece.stored, self.dtype)
        else:
            whole = self._stored(piece.stored)
        for op, arg in piece.steps:
            whole = whole.t() if op == "transpose" else whole.reshape(arg)
        if piece.split is not None:
            axis, start, length = piece.split
            # A piece owns its memory, so the whole can be dropped while the piece lives on.
            whole = whole.narrow(axis, start, length).clone()
        return whole.contiguous().to(self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self._pieces)

    def __len__(self) -> int:
        return len(self._pieces)

    def __contains__(self, key: object) -> bool:
        return key in self._pieces

    # -- extras ------------------------------------------------------------------------------

    def shape(self, key: str) -> tuple[int, ...]:
        """The shape of ``key``'s value, without decoding anything."""
        return self._pieces[key].shape

    def stored_name(self, key: str) -> str:
        """The stored tensor ``key`` comes from."""
        return self._pieces[key].stored

    @property
    def artifact(self) -> Artifact:
        return self._artifact

    def close(self) -> None:
        self._cached = None
        if self._owns:
            self._artifact.close()

    def __enter__(self) -> ArtifactStateDict:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- decoding ----------------------------------------------------------------------------

    def _stored(self, name: str) -> torch.Tensor:
        """The decoded stored tensor of a split concat, cached for its other pieces."""
        if self._cached is not None and self._cached[0] == name:
            return self._cached[1]
        self._cached = None  # drop the previous tensor before decoding the next
        tensor = decode_tensor(self._artifact, name, self.dtype)
        self._cached = (name, tensor)
        return tensor


def decode_tensor(artifact: Artifact, name: str, dtype: torch.dtype) -> torch.Tensor:
    """One stored tensor as torch, in its logical shape (the value rules of the module)."""
    import torch

    info = artifact.tensors[name]
    fmt = lookup_format(info.format)
    logical = artifact.read(name)
    if isinstance(logical, DirectWords) and fmt.name in ("BF16", "FP32", "I32"):
        words = np.require(logical.words, requirements="C")  # keeps 0-d tensors 0-d
        if fmt.name == "I32":
            return torch.from_numpy(_writable(words.astype(np.int32, copy=False)))
        if fmt.name == "BF16":
            bf16 = torch.from_numpy(_writable(words.astype(np.uint16, copy=False).view(np.int16)))
            bf16 = bf16.view(torch.bfloat16)
            # BF16 -> binary32 is exact (the word becomes the high half).
            return bf16 if dtype == torch.bfloat16 else bf16.to(torch.float32)
        f32 = torch.from_numpy(_writable(words.astype(np.uint32, copy=False).view(np.float32)))
        return f32 if dtype == torch.float32 else f32.to(dtype)
    # Quantized formats are 2-D [N, K]: reconstruct row blocks into one float32 output so the
    # temporaries (per-element scales, widened codes) stay a block, not a tensor, in size.
    n, k = info.shape
    out = np.empty((n, k), dtype=np.float32)
    step = max(1, _BLOCK_ELEMENTS // max(k, 1))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        out[r0:r1] = dequantize_logical(fmt, _rows(logical, r0, r1))
    del logical
    t = torch.from_numpy(out)
    return t if dtype == torch.float32 else t.to(dtype)


def _writable(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``a`` itself when torch may share it (the reader's arrays are fresh), else a copy."""
    return a if a.flags.writeable else a.copy()


def _rows(logical: LogicalTensor, r0: int, r1: int) -> LogicalTensor:
    """Rows [r0, r1) of a quantized logical tensor (views, no copy)."""
    if isinstance(logical, GroupedCodes):
        return GroupedCodes(logical.codes[r0:r1], logical.scales[r0:r1])
    if isinstance(logical, NVFP4Words):
        return NVFP4Words(logical.codes[r0:r1], logical.scales[r0:r1], logical.divisor)
    if isinstance(logical, FP8RowWords):
        return FP8RowWords(logical.codes[r0:r1], logical.scales[r0:r1])
    raise UsageError(f"{type(logical).__name__} has no rows")  # pragma: no cover


def load_state_dict(
    artifact: str | os.PathLike[str] | Artifact,
    *,
    names: Names = "source",
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> ArtifactStateDict:
    """Public API: a lazy state dict of ``artifact`` (a path, or an open :class:`Artifact`).

    ``names``: ``"source"`` (invert the recipe's derivations, keys of the source checkpoint)
    or ``"artifact"`` (stored names).  ``dtype``: ``torch.float32`` (default) or
    ``torch.bfloat16``; I32 tensors stay int32.  ``device``: where values are placed.
    A path is opened (and closed by :meth:`ArtifactStateDict.close`); an open artifact is
    left open.
    """
    import torch

    owns = not isinstance(artifact, Artifact)
    art = open_artifact(artifact) if not isinstance(artifact, Artifact) else artifact
    try:
        return ArtifactStateDict(
            art,
            names=names,
            dtype=torch.float32 if dtype is None else dtype,
            device=device,
            owns=owns,
        )
    except BaseException:
        if owns:
            art.close()
        raise
