"""The header JSON joined from per-entry JSON, and the writer's use of the size plan's entries:
the bytes are canonical_json of the whole header, exactly (docs/container.md section 3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from artifact_fixtures import ALL_FORMATS, DEFAULT_SHAPES, META, make_logical, provenance

import ninfer_convert.container.placement as placement_module
import ninfer_convert.container.writer as writer_module
from ninfer_convert.container import ArtifactWriter
from ninfer_convert.container.placement import (
    PlannedEntry,
    entry_json,
    header_json,
    planned_size,
)
from ninfer_convert.container.schema import (
    ArtifactMeta,
    Header,
    Provenance,
    RuleRef,
    ShardInfo,
    SideFile,
)
from ninfer_convert.container.wire import canonical_json
from ninfer_convert.formats import lookup_format
from ninfer_convert.layouts import lookup_layout

# Names that look like the JSON the writer splits at, or need escaping.
NAMES = [
    'a{"digest":"' + "0" * 32 + '"}',
    '{"digest":"',
    "back\\slash\\",
    'quote"',
    "ünï/códe.weight",
    "x" * 300,
]


def _tensors() -> list[tuple[str, str, tuple[int, ...], str, Provenance]]:
    out = []
    for i, fmt in enumerate(ALL_FORMATS):
        shape = DEFAULT_SHAPES[fmt]
        name = NAMES[i % len(NAMES)] + f".{fmt}"
        prov = Provenance.from_json(provenance(fmt, name=NAMES[-i % len(NAMES)], shape=shape), "p")
        out.append((name, fmt, shape, "weight" if i % 2 else 'ro"le', prov))
    return out


def test_header_json_is_the_canonical_json_of_the_whole_header(tmp_path: Path) -> None:
    planned: dict[str, PlannedEntry] = {}
    planned_size(_tensors(), metadata=META, side_files=[], alignment=64, planned=planned)
    entries = tuple(p.entry for p in planned.values())
    meta = ArtifactMeta.from_json({**META, "alignment": 64}, "metadata")
    files = (SideFile("config.json", 2, "1" * 32), SideFile('q"uote', 0, "2" * 32))
    for tensors in (entries, entries[:1], ()):
        for shard in (ShardInfo(1, 1), ShardInfo(2, 3)):
            whole = canonical_json(Header(meta, files, shard, tensors).to_json())
            assert header_json(meta, files, shard, [entry_json(t) for t in tensors]) == whole


def _with_digests(entry: Any, seed: int) -> Any:
    planes = tuple(
        dataclasses.replace(p, digest=f"{seed * 7919 + i:032x}") for i, p in enumerate(entry.planes)
    )
    return dataclasses.replace(entry, planes=planes)


def test_a_planned_entry_filled_with_digests_is_that_entrys_json() -> None:
    planned: dict[str, PlannedEntry] = {}
    planned_size(_tensors(), metadata=META, side_files=[], alignment=64, planned=planned)
    assert len(planned) == len(ALL_FORMATS)
    for seed, p in enumerate(planned.values()):
        real = _with_digests(p.entry, seed)
        assert p.placed_as(real)
        assert p.filled(real) == entry_json(real)
        moved = dataclasses.replace(real.planes[0], offset=real.planes[0].offset + 64)
        prov = dataclasses.replace(real.provenance, constraints=("c",))
        for other in (
            dataclasses.replace(real, name=real.name + "x"),
            dataclasses.replace(real, role="other"),
            dataclasses.replace(real, shape=(*real.shape, 1)),
            dataclasses.replace(real, planes=(moved, *real.planes[1:])),
            dataclasses.replace(real, provenance=prov),
        ):
            assert not p.placed_as(other)


def _write(
    out: Path, planned: dict[str, PlannedEntry] | None, alignment: int, max_shard: int | None
) -> dict[str, bytes]:
    with ArtifactWriter(out, metadata=META, alignment=alignment, max_shard_size=max_shard,
                        planned=planned) as w:  # fmt: skip
        for i, (name, fmt, shape, role, prov) in enumerate(_tensors()):
            res = w.reserve(name, fmt, shape, role=role, provenance=prov)
            layout = lookup_layout(lookup_format(fmt).layout)
            for plane, packed in zip(
                res.planes, layout.pack(fmt, make_logical(fmt, shape, i)), strict=True
            ):
                plane[:] = memoryview(packed).cast("B")
            w.complete(res)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize(("alignment", "max_shard"), [(64, None), (4096, 3000)])
def test_the_writer_fills_planned_entries_and_writes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alignment: int, max_shard: int | None
) -> None:
    encoded: list[str] = []

    def counted(entry: Any) -> bytes:
        encoded.append(entry.name)
        return entry_json(entry)

    monkeypatch.setattr(writer_module, "entry_json", counted)
    plain = _write(tmp_path / "plain", None, alignment, max_shard)
    assert len(encoded) == len(ALL_FORMATS)  # no plan: commit encodes every entry
    encoded.clear()
    planned: dict[str, PlannedEntry] = {}
    size = planned_size(_tensors(), metadata=META, side_files=[], alignment=alignment,
                        max_shard_size=max_shard, planned=planned)  # fmt: skip
    assert _write(tmp_path / "planned", planned, alignment, max_shard) == plain
    assert encoded == [] and size == sum(len(b) for b in plain.values())
    # Planned for another alignment: every offset differs, each entry is encoded at commit.
    other: dict[str, PlannedEntry] = {}
    planned_size(_tensors(), metadata=META, side_files=[], alignment=alignment * 2,
                 max_shard_size=max_shard, planned=other)  # fmt: skip
    assert _write(tmp_path / "other", other, alignment, max_shard) == plain
    assert len(encoded) >= len(ALL_FORMATS) - 1  # only a tensor at offset 4096 may match


class _Str(str):
    pass


RULE = RuleRef(1, 7, "other.*")


def _kinds() -> list[tuple[str, str, tuple[int, ...], str, Provenance]]:
    """Entries of a few kinds, each kind many times, with values equal under ``==`` but of
    other types (which the fast path must not take for its kind's), and entries of equal
    values but other rule and constraint objects."""
    base = Provenance.from_json(provenance("BF16", shape=(3, 5)), "p")
    src = base.sources[0]

    def prov(**kw: Any) -> Provenance:
        return dataclasses.replace(base, sources=(dataclasses.replace(src, **kw),))

    out: list[tuple[str, str, tuple[int, ...], str, Provenance]] = []
    for i, n in enumerate(NAMES * 3):
        name, srcname = f"{n}.{i}", n if i % 2 else f"{n}.{i}"
        out += [
            (name, "BF16", (3, 5), "weight", prov(name=srcname)),
            (name + "b", "BF16", (3, 5), "weight", prov(name=name + "b")),  # own name
            (name + "k", "BF16", (3, 5), "weight", prov(name=srcname, shape=(1, 5))),
            (name + "c", "BF16", (3, 5), "weight", prov(name=srcname, shape=(True, 5))),
            (name + "d", "BF16", (3, 5), _Str("weight"), prov(name=srcname)),
            (name + "e", "BF16", (3, 5), "weight", prov(name=srcname, dtype=_Str("BF16"))),
            (name + "f", "FP32", (3, 5), "weight", prov(name=srcname)),
            (name + "g", "BF16", (3, 5), "weight",
             dataclasses.replace(prov(name=srcname), rule=dataclasses.replace(base.rule))),
            (name + "l", "BF16", (3, 5), "weight",
             dataclasses.replace(prov(name=srcname), rule=RULE)),
            (name + "h", "BF16", (3, 5), "weight",
             dataclasses.replace(prov(name=srcname), conversion=_Str("bf16-to-f32"))),
            (name + "i", "BF16", (3, 5), "weight",
             dataclasses.replace(prov(name=srcname), constraints=("finite-only",))),
            (name + "j", "Q4G64_F16S", (3, 64), "weight", prov(name=srcname, shape=(3, 64))),
            # Exact values that differ from the first kind's in one field each.
            (name + "m", "BF16", (3, 5), "bias", prov(name=srcname)),
            (name + "n", "BF16", (3, 5), "weight", prov(name=srcname, file="b.safetensors")),
            (name + "o", "BF16", (3, 5), "weight", prov(name=srcname, dtype="F16")),
            (name + "p", "BF16", (3, 5), "weight",
             dataclasses.replace(prov(name=srcname), conversion="bf16-to-f32")),
            (name + "q", "BF16", (3, 5), "weight",
             dataclasses.replace(prov(name=srcname), encoder_profile="P")),
            (name + "r", "BF16", (5, 3), "weight", prov(name=srcname)),
        ]  # fmt: skip
    return out


@pytest.mark.parametrize(("alignment", "max_shard"), [(64, None), (4096, 20_000)])
def test_the_fast_path_plans_what_the_general_path_plans(
    monkeypatch: pytest.MonkeyPatch, alignment: int, max_shard: int | None
) -> None:
    """Entries of a kind seen before are planned from the kind's template: the same size and
    the same planned entries, field for field and byte for byte, as the entry-by-entry path,
    which they do not take."""
    fast: dict[str, PlannedEntry] = {}
    size = planned_size(_kinds(), metadata=META, side_files=[("a", 3)], alignment=alignment,
                        max_shard_size=max_shard, planned=fast)  # fmt: skip
    built = []
    real_entry = placement_module.TensorEntry

    def counted(*args: Any, **kw: Any) -> Any:
        built.append(kw.get("name"))
        return real_entry(*args, **kw)

    monkeypatch.setattr(placement_module, "TensorEntry", counted)
    planned_size(_kinds(), metadata=META, side_files=[("a", 3)], alignment=alignment,
                 max_shard_size=max_shard, planned={})  # fmt: skip
    # Some variants are of inexact types or fresh rules: only the others are fast.
    assert 0 < len(built) < len(_kinds()) * 0.6
    built.clear()
    monkeypatch.setattr(placement_module, "_fast_key", lambda *a: None)
    slow: dict[str, PlannedEntry] = {}
    again = planned_size(_kinds(), metadata=META, side_files=[("a", 3)], alignment=alignment,
                         max_shard_size=max_shard, planned=slow)  # fmt: skip
    assert again == size
    assert len(built) == len(_kinds())
    assert list(fast) == list(slow)
    for name, p in fast.items():
        q = slow[name]
        assert p == q and [type(v) for v in p] == [type(v) for v in q], name
        assert p.pieces and placement_module._PLACEHOLDER_MARK.join(p.pieces) == entry_json(p.entry)
