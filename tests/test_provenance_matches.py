"""``derive.provenance_matches``: verify's comparison of a stored provenance with the one
convert records, made without building the expected value for the common entry.  It must
answer exactly what ``provenance_of(entry) == stored`` answers: every entry of a plan with
every op against every other entry's provenance, and each field of each provenance replaced by
a different value, an equal value of another type, or a foreign object."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from test_pinned_outputs import _copy_source
from test_pinned_plan_json import every_op_source

from ninfer_convert.container.schema import Provenance, RuleRef, SourceRef
from ninfer_convert.container.wire import canonical_json
from ninfer_convert.derive import provenance_matches, provenance_of, provenances
from ninfer_convert.recipe import PlanEntry, build_plan, load_recipe
from ninfer_convert.source import open_source


def _entries(tmp_path: Path) -> list[PlanEntry]:
    source, recipe = every_op_source(tmp_path / "ops")
    entries = list(build_plan(load_recipe(recipe), open_source(source)).entries)
    (tmp_path / "nv").mkdir()
    (tmp_path / "nv" / "r.yaml").write_text(
        _copy_source(tmp_path / "nv" / "src", "compressed-tensors-nvfp4")
    )
    nv = build_plan(load_recipe(tmp_path / "nv" / "r.yaml"), open_source(tmp_path / "nv" / "src"))
    entries += nv.entries
    plain = next(e for e in entries if not e.transforms and e.copy is None)
    entries.append(dataclasses.replace(plain, importance=np.arange(4, dtype=np.uint32)))
    return entries


def _variants(prov: Provenance) -> list[Any]:
    """``prov`` with one field changed at a time (to a different value, to an equal value of
    another type, to a foreign object), and objects that are not a Provenance."""
    rule, src = prov.rule, prov.sources[0]
    rules = [
        dataclasses.replace(rule, index=rule.index + 1),
        dataclasses.replace(rule, line=rule.line + 1),
        dataclasses.replace(rule, pattern=rule.pattern + "x"),
        (rule.index, rule.line, rule.pattern),
    ]
    sources = [
        dataclasses.replace(src, name=src.name + "x"),
        dataclasses.replace(src, dtype="F32" if src.dtype != "F32" else "BF16"),
        dataclasses.replace(src, shape=(*src.shape, 1)),
        dataclasses.replace(src, shape=list(src.shape)),  # equal items, another type
        dataclasses.replace(src, file=src.file + "x"),
        (src.name, src.dtype, src.shape, src.file),
    ]
    out: list[Any] = [dataclasses.replace(prov, rule=r) for r in rules]
    out += [dataclasses.replace(prov, sources=(s, *prov.sources[1:])) for s in sources]
    out += [
        dataclasses.replace(prov, sources=prov.sources[:-1]),
        dataclasses.replace(prov, sources=(*prov.sources, src)),
        dataclasses.replace(prov, sources=list(prov.sources)),
        dataclasses.replace(prov, conversion="bf16-to-f32" if prov.conversion is None else None),
        dataclasses.replace(prov, encoder_profile=None if prov.encoder_profile else "X"),
        dataclasses.replace(prov, constraints=(*prov.constraints, "finite-only")),
        dataclasses.replace(prov, constraints=list(prov.constraints)),
        dataclasses.replace(prov, transforms=prov.transforms[:1] * 2),
        dataclasses.replace(prov, importance="xxh3-128:" + "0" * 32),
        dataclasses.replace(prov, importance=None),
        dataclasses.replace(prov, factor="xxh3-128:" + "0" * 32),
        dataclasses.replace(prov, factor_block=8),
        prov.to_json(),
        None,
    ]
    return out


def test_it_answers_what_the_typed_equality_answers(tmp_path: Path) -> None:
    entries = _entries(tmp_path)
    assert any(not e.transforms and e.copy is None for e in entries)
    assert any(e.transforms for e in entries) and any(e.copy for e in entries)
    provs = [provenance_of(e) for e in entries]
    checked = matched = 0
    for entry in entries:
        for stored in provs + [v for p in provs for v in _variants(p)]:
            want = provenance_of(entry) == stored
            assert provenance_matches(entry, stored) is want, (entry.output, stored)
            checked += 1
            matched += want
    assert matched >= len(entries) and checked > 20 * len(entries)


def test_a_fresh_but_equal_provenance_matches(tmp_path: Path) -> None:
    """Equal values, not the same objects: the comparison is by value."""
    entry = next(e for e in _entries(tmp_path) if not e.transforms and e.copy is None)
    prov = provenance_of(entry)
    fresh = dataclasses.replace(
        prov,
        rule=RuleRef(int(prov.rule.index), int(prov.rule.line), "".join(prov.rule.pattern)),
        sources=tuple(SourceRef("".join(s.name), s.dtype, tuple(s.shape), s.file)
                      for s in prov.sources),
    )  # fmt: skip
    assert fresh == prov and fresh is not prov
    assert provenance_matches(entry, fresh)


def test_provenances_builds_what_provenance_of_builds(tmp_path: Path) -> None:
    """The bulk builder (slot fillers, one rule reference per plan rule) gives equal values of
    the same types, field for field, for every kind of entry; rules are told apart by object,
    not by a reused id."""
    entries = _entries(tmp_path)
    plain = next(e for e in entries if not e.transforms and e.copy is None)
    rule = plain.rule
    rules = [dataclasses.replace(rule, index=rule.index + 10), dataclasses.replace(rule, line=0),
             dataclasses.replace(rule, pattern=rule.pattern + "x")]  # fmt: skip
    entries += [dataclasses.replace(plain, output=f"x.{i}", rule=r) for i, r in enumerate(rules)]
    wanted = {e.output: provenance_of(e) for e in entries}  # the last of a name wins

    def fresh() -> Iterator[PlanEntry]:  # entries (and rules) dropped once used
        for e in entries:
            yield dataclasses.replace(e, rule=dataclasses.replace(e.rule))

    assert provenances(fresh()) == wanted
    got = provenances(entries)
    assert list(got) == list(wanted)
    for name, want in wanted.items():
        have = got[name]
        assert type(have) is Provenance and have == want
        assert canonical_json(have.to_json()) == canonical_json(want.to_json())
        for f in dataclasses.fields(Provenance):
            assert type(getattr(have, f.name)) is type(getattr(want, f.name)), f.name
        assert [type(s) for s in have.sources] == [SourceRef] * len(want.sources)
