"""metadata_json is canonical_json of the artifact metadata, byte for byte, and raises what it
raises (ninfer_convert/container/metadata_json.py)."""

from __future__ import annotations

import enum
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from test_recipe_plan import make_source, plan_text

from ninfer_convert.artifact_metadata import artifact_metadata, planned_metadata_size
from ninfer_convert.container import metadata_json as mj
from ninfer_convert.container.schema import ArtifactMeta
from ninfer_convert.container.wire import canonical_json


class _Int(enum.IntEnum):
    ONE = 1


class _Str(str):
    pass


def _meta(tensors: Any, **config: Any) -> dict[str, Any]:
    return {
        "alignment": 64,
        "producer": {"name": "p", "version": "1"},
        "source": {"config": config or None, "files": [], "kind": "k", "path": "/p",
                   "tensors": tensors},
    }  # fmt: skip


def _t(digest: Any = "d" * 32, dtype: Any = "BF16", shape: Any = None) -> dict[str, Any]:
    return {"digest": digest, "dtype": dtype, "shape": [4, 2] if shape is None else shape}


ODD_NAMES = ["b", "a", "é\u2028x", 'q"\\\n\t', "\x00\x01", "Z", "a.b", "😀", "a\u0000"]

CASES = [
    _meta({}),
    _meta({"w": _t()}),
    _meta({n: _t(shape=[i]) for i, n in enumerate(ODD_NAMES)}),
    _meta({"w": _t(), "v": _t(dtype="F32", shape=[])}, a=[1, 2.5, None, True]),
    _meta({"w": _t(shape=[True])}),  # a bool dimension: json spells it true
    _meta({"a": _t(shape=[1]), "b": _t(shape=[True])}),  # ... after the same shape as an int
    _meta({"a": _t(shape=[1]), "b": _t(shape=[1.0])}),
    _meta({"w": _t(shape=[_Int.ONE])}),
    _meta({"w": _t(digest=_Str("x"))}),
    _meta({"w": _t(dtype=_Str("BF16"))}),
    _meta({_Str("w"): _t()}),
    _meta({"w": {"digest": "x", "dtype": "BF16"}}),
    _meta({"w": {**_t(), "extra": 1}}),
    _meta({"w": _t(shape=(4, 2))}),
    _meta({"w": _t(shape=[1.0])}),
    _meta({"w": _t()}, marker=mj._MARK),  # the marker's text elsewhere: the whole path
    _meta({"w": _t(digest=mj._MARK)}),
    _meta({"w": _t()}, **{"\x00": "\u00e9"}),
]


@pytest.mark.parametrize("value", CASES)
def test_metadata_json_is_canonical_json(value: dict[str, Any]) -> None:
    assert mj.metadata_json(value) == canonical_json(value)


def test_the_tensor_map_takes_the_template_path(monkeypatch: pytest.MonkeyPatch) -> None:
    value = _meta({n: _t(shape=[i]) for i, n in enumerate(ODD_NAMES)})
    whole = canonical_json(value)
    calls: list[object] = []

    def counted(v: object) -> bytes:
        calls.append(v)
        return canonical_json(v)

    monkeypatch.setattr(mj, "canonical_json", counted)
    assert mj.metadata_json(value) == whole
    # One call for the frame and one per kind of (dtype, shape): never the whole map.
    assert all(v is not value for v in calls) and len(calls) == 1 + len(ODD_NAMES)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (_meta({"w": _t(digest="\ud800")}), UnicodeEncodeError),
        (_meta({"\ud800": _t()}), UnicodeEncodeError),
        (_meta({"w": _t()}, x=math.nan), ValueError),
        (_meta({"w": _t(digest=object())}), TypeError),
        (_meta({"w": _t(), 1: _t()}), TypeError),
        # After the map in sorted order: the position counts the map's bytes.
        ({**_meta({"w": _t()}), "z": "\ud800"}, UnicodeEncodeError),
        # A bad value before the map and one in it: the first in the whole's order is raised.
        (_meta({"w": _t(shape=[10**5000])}, x=math.nan), ValueError),
    ],
)
def test_metadata_json_raises_what_canonical_json_raises(value: Any, error: type) -> None:
    with pytest.raises(error) as want:
        canonical_json(value)
    with pytest.raises(error) as got:
        mj.metadata_json(value)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("count", [0, 1, len(ODD_NAMES)])
def test_source_tensors_size_is_the_maps_length(count: int) -> None:
    digest = "xxh3-128:" + "0" * 32
    dtypes = ["BF16", "F32", "é", 'q"']
    tensors = [(n, dtypes[i % 4], (i,) * (i % 3)) for i, n in enumerate(ODD_NAMES[:count])]
    whole = {n: {"digest": digest, "dtype": t, "shape": list(s)} for n, t, s in tensors}
    assert mj.source_tensors_size(tensors, digest) == len(canonical_json(whole))


def test_the_planned_metadata_size_is_the_written_metadatas(tmp_path: Path) -> None:
    """The size plan's metadata length (no map built) is the length of the metadata the
    writer checks and every shard header holds, real digests and all."""
    from test_planned_header import NAMES  # names that need escaping, or look like JSON

    tensors = {n: torch.ones(2, 3, dtype=torch.bfloat16) for n in NAMES[:6]}
    tensors["skipped"] = torch.ones(1, dtype=torch.float32)
    src = make_source(tmp_path / "m", tensors)
    rules = "- skip: skipped\n  reason: r\n- match: 're:.*'\n  format: BF16\n  role: r\n"
    plan = plan_text(rules, src)
    digested = {s.name for e in plan.entries for s in e.sources} | {s.name for s in plan.skipped}
    real = {name: f"xxh3-128:{i:032x}" for i, name in enumerate(sorted(digested))}
    meta = ArtifactMeta.from_json(artifact_metadata(plan, src, real, 64), "metadata")
    want = len(canonical_json(meta.to_json()))
    assert planned_metadata_size(plan, src, digested, "xxh3-128:" + "0" * 32, 64) == want
    assert len(meta.source.tensors) == len(tensors)
