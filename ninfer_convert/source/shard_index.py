"""The shard index of a sharded model directory, cross-checked against every shard header.

Contract: ``model.safetensors.index.json`` must hold a ``weight_map`` object whose shard names
are plain file names; every shard it names is parsed (:func:`~.header.parse_header`), and every
problem (missing shard file, tensor in the index but not in its shard, tensor in a shard but
not in the index, tensor in two shards, unreadable shard) is reported together in one
SourceError before anything else happens.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SourceError
from .checkpoint import SourceTensorInfo, _info
from .header import SafetensorsHeader, parse_header
from .json_files import _read_json


def _check_index(
    root: Path, index_path: Path
) -> tuple[dict[str, SourceTensorInfo], tuple[tuple[str, int], ...]]:
    """Cross-check the index against every shard header; report every problem at once."""
    doc = _read_json(index_path)
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise SourceError('index has no "weight_map" object', path=str(index_path))
    weight_map: dict[str, object] = doc["weight_map"]
    problems: list[str] = []
    shard_names: set[str] = set()
    for tensor, shard in weight_map.items():
        if (
            not isinstance(shard, str)
            or not shard
            or len(shard) > 255
            or shard != Path(shard).name
            or shard in (".", "..")
            or any(ord(c) < 0x20 or ord(c) == 0x7F for c in shard)
        ):
            shown = shard if not isinstance(shard, str) or len(shard) <= 80 else shard[:60] + "..."
            problems.append(f"tensor {tensor!r}: shard {shown!r} is not a plain file name")
            continue
        shard_names.add(shard)

    headers: dict[str, SafetensorsHeader] = {}
    for shard in sorted(shard_names):
        sp = root / shard
        try:
            present = sp.exists()  # parse_header refuses what is not a regular file
        except OSError as exc:  # e.g. a name the file system cannot hold
            problems.append(f"shard file {shard!r}: {exc.strerror or exc}")
            continue
        if not present:
            users = sum(1 for s in weight_map.values() if s == shard)
            problems.append(
                f"shard file {shard!r} is missing ({users} tensors in the index point to it)"
            )
            continue
        try:
            headers[shard] = parse_header(sp)
        except SourceError as exc:
            problems.append(exc.render())

    owners: dict[str, list[str]] = {}
    for shard, header in headers.items():
        for tensor in header.tensors:
            owners.setdefault(tensor, []).append(shard)
    for tensor in sorted(owners):
        shards = owners[tensor]
        if len(shards) > 1:
            problems.append(f"tensor {tensor!r} is in more than one shard: " + ", ".join(shards))
        listed = weight_map.get(tensor)
        if listed is None:
            problems.append(f"tensor {tensor!r} is in shard {shards[0]!r} but not in the index")
        elif isinstance(listed, str) and listed not in shards and listed in headers:
            problems.append(
                f"tensor {tensor!r}: the index says shard {listed!r} but it is in "
                + ", ".join(repr(s) for s in shards)
            )
    for tensor, shard in sorted(weight_map.items()):
        if isinstance(shard, str) and shard in headers and tensor not in owners:
            problems.append(
                f"tensor {tensor!r} is in the index (shard {shard!r}) but not in that shard"
            )
    if problems:
        raise SourceError(
            f"the shard index does not match the shards ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}):\n  " + "\n  ".join(problems),
            path=str(index_path),
            hint="re-download or re-save the checkpoint",
        )
    # No problems: every shard is a plain name with a parsed header, and each header's tensors
    # are exactly the index entries pointing to it.
    tensors: dict[str, SourceTensorInfo] = {}
    for shard, header in headers.items():
        tensors.update(_info(header, shard))
    files = tuple((shard, headers[shard].file_size) for shard in sorted(headers))
    return tensors, files
