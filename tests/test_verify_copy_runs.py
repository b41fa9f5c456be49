"""verify's direct copies checked a batch at a time (:mod:`ninfer_convert.verify.copy_runs`):
every tensor of a clean run is proven equal without the per-tensor path, and a byte changed
anywhere (the first, a middle or the last tensor of a run, the gap between two of them, the
source) is reported for exactly that tensor with the per-tensor path's findings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from artifact_fixtures import rewrite_header
from st_helpers import write_safetensors

import ninfer_convert.verify.runner as runner
from ninfer_convert.container import open_artifact
from ninfer_convert.container.wire import SINGLE_NAME, digest_hex
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.source import open_source
from ninfer_convert.verify import verify_artifact
from ninfer_convert.verify.copy_runs import checked_copies
from ninfer_convert.verify.report import VerifyReport

COUNT = 24
RECIPE = """\
ninfer_recipe: 1
name: copy-runs
version: "1"
source:
  model_type: [llama]
rules:
  - match: "re:.*\\\\.weight"
    format: BF16
    role: weight
  - match: "re:.*\\\\.bias"
    format: FP32
    role: bias
  - match: "re:.*\\\\.scale"
    format: FP32
    conversion: bf16-to-f32
    role: norm
"""


def _source(root: Path) -> Path:
    """Tiny tensors in one file: BF16 weights (some [2, 3]), FP32 biases stored bitwise, and
    BF16 scales converted to FP32 (not a direct copy: checked on their own)."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    header: dict[str, object] = {}
    data = bytearray()
    rng = np.random.default_rng(5)
    for i in range(COUNT):
        kind = ("weight", "bias", "weight", "scale")[i % 4]
        dtype, shape = {"weight": ("BF16", [2, 3] if i % 3 else [1]), "bias": ("F32", [4]),
                        "scale": ("BF16", [2])}[kind]  # fmt: skip
        n = int(np.prod(shape)) * (4 if dtype == "F32" else 2)
        words = rng.integers(0, 0x3F00, size=n // 2, dtype=np.uint16).tobytes()
        header[f"layers.{i:02d}.{kind}"] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + n],
        }
        data += words
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (root / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(data))
    return root


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("copy-runs")
    src = _source(tmp / "src")
    recipe = tmp / "r.yaml"
    recipe.write_text(RECIPE)
    out = tmp / "out"
    convert_checkpoint(src, recipe, out, device="cpu", jobs=2)
    return src, out


def _findings(report: VerifyReport) -> list[tuple[str, str, str | None, str | None]]:
    return [(c.name, f.message, f.tensor, f.path) for c in report.checks for f in c.findings]


def _both(
    monkeypatch: pytest.MonkeyPatch, out: Path, src: Path
) -> tuple[VerifyReport, VerifyReport, list[str]]:
    """The report with the batched copies, the report of the per-tensor path alone, and the
    tensors the batches proved equal."""
    proven: list[str] = []

    def counted(*args: object) -> dict[str, object]:
        done = checked_copies(*args)  # type: ignore[arg-type]
        proven.extend(done)
        return done  # type: ignore[return-value]

    monkeypatch.setattr(runner, "checked_copies", counted)
    batched = verify_artifact(out, source=src, jobs=2)
    monkeypatch.setattr(runner, "checked_copies", lambda *args: {})
    alone = verify_artifact(out, source=src, jobs=2)
    monkeypatch.undo()
    return batched, alone, proven


def _names(out: Path) -> list[str]:
    with open_artifact(out) as art:
        return list(art.tensors)


def _copies(names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith(".scale")]


def test_a_clean_run_is_proven_equal_a_batch_at_a_time(
    converted: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = converted
    batched, alone, proven = _both(monkeypatch, out, src)
    assert batched.exit_code == 0 and alone.exit_code == 0
    assert _findings(batched) == _findings(alone) == []
    # Every direct copy (BF16 and FP32 stored bitwise), and only those.
    assert sorted(proven) == sorted(_copies(_names(out)))
    summary = [(c.name, c.status, c.tensors, c.note) for c in batched.checks]
    assert summary == [(c.name, c.status, c.tensors, c.note) for c in alone.checks]


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x40]))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_stored_byte_is_reported_for_exactly_its_tensor(
    converted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    src, clean = converted
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    names = _copies(_names(out))
    victim = {"first": names[0], "middle": names[len(names) // 2], "last": names[-1]}[where]
    with open_artifact(out) as art:
        info = art.tensors[victim]
        plane = info.planes[0]
        _flip(info.file, plane.offset + plane.nbytes - 1)
    batched, alone, proven = _both(monkeypatch, out, src)
    assert victim not in proven
    assert sorted(proven) == sorted(n for n in names if n != victim)
    found = _findings(batched)
    assert found == _findings(alone)
    assert {check for check, *_ in found} == {"integrity", "source-words"}
    assert {tensor for _, _, tensor, _ in found} == {victim}
    assert any("digest mismatch" in message for _, message, *_ in found)
    assert any("differs from its re-derivation" in message for _, message, *_ in found)


def test_a_flipped_gap_byte_between_two_tensors_is_a_gap_finding(
    converted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, clean = converted
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    names = _names(out)
    with open_artifact(out) as art:
        a, b = art.tensors[names[5]].planes[-1], art.tensors[names[6]].planes[0]
        assert b.offset > a.offset + a.nbytes  # an alignment gap
        _flip(art.tensors[names[6]].file, (a.offset + a.nbytes + b.offset) // 2)
    batched, alone, proven = _both(monkeypatch, out, src)
    assert sorted(proven) == sorted(_copies(names))  # the words themselves are intact
    found = _findings(batched)
    assert found == _findings(alone)
    assert len(found) == 1
    check, message, tensor, _ = found[0]
    assert (check, tensor) == ("integrity", names[6])
    assert message.startswith("1 non-zero byte(s) in the gap [")


def test_a_changed_source_tensor_is_reported_for_exactly_its_tensor(
    converted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean_src, out = converted
    src = tmp_path / "src"
    shutil.copytree(clean_src, src)
    names = _copies(_names(out))
    victim = names[len(names) // 2]
    info = open_source(src).tensors[victim]
    _flip(src / info.file, info.offset)
    batched, alone, proven = _both(monkeypatch, out, src)
    assert sorted(proven) == sorted(n for n in names if n != victim)
    found = _findings(batched)
    assert found == _findings(alone)
    assert [(check, tensor) for check, _, tensor, _ in found] == [("source-identity", victim)]
    assert "changed since conversion" in found[0][1]


@pytest.mark.parametrize("digest", ["plane", "source"])
def test_a_recorded_digest_that_differs_is_reported_for_exactly_its_tensor(
    converted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digest: str
) -> None:
    """The bytes are intact but the header records another plane or source digest (header
    digest rewritten to match): one digest serves both equalities, each still checked."""
    src, clean = converted
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    names = _copies(_names(out))
    victim = names[len(names) // 2]
    other = "0" * 32

    def edit(header: dict[str, Any]) -> None:
        if digest == "plane":
            [entry] = [t for t in header["tensors"] if t["name"] == victim]
            entry["planes"][0]["digest"] = other
        else:
            header["artifact"]["source"]["tensors"][victim]["digest"] = "xxh3-128:" + other

    rewrite_header(out / SINGLE_NAME, edit)
    batched, alone, proven = _both(monkeypatch, out, src)
    assert sorted(proven) == sorted(n for n in names if n != victim)
    found = _findings(batched)
    assert found == _findings(alone)
    assert found and {tensor for _, _, tensor, _ in found} == {victim}
    check = "integrity" if digest == "plane" else "source-identity"
    assert {c for c, *_ in found} == {check}


@pytest.mark.parametrize("kind", ["weight", "bias"])
def test_a_finite_only_copy_holding_a_nan_is_left_to_the_per_tensor_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Under finite-only a BF16 or FP32 copy is not its bytes alone: the per-tensor path tests
    every value.  A NaN written into the source and the stored plane, with the plane and
    source digests rewritten to match (a forged artifact), is that path's refusal, for that
    tensor: no finite-only copy is proven by the batch, the other copies still are."""
    src = _source(tmp_path / "src")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        RECIPE.replace(f"role: {kind}", f"role: {kind}\n    constraints: [finite-only]")
    )
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", jobs=2)
    names = _names(out)
    victim = [n for n in names if n.endswith("." + kind)][2]
    nan = b"\xc0\x7f" if kind == "weight" else b"\x00\x00\xc0\x7f"  # BF16 / F32 quiet NaN
    sinfo = open_source(src).tensors[victim]
    with (src / sinfo.file).open("r+b") as f:
        f.seek(sinfo.offset)
        f.write(nan)
        f.seek(sinfo.offset)
        forged = f.read(sinfo.nbytes)
    with open_artifact(out) as art:
        plane = art.tensors[victim].planes[0]
    with (out / SINGLE_NAME).open("r+b") as f:
        f.seek(plane.offset)
        f.write(forged)
    digest = digest_hex(forged)

    def edit(header: dict[str, Any]) -> None:
        [entry] = [t for t in header["tensors"] if t["name"] == victim]
        entry["planes"][0]["digest"] = digest
        header["artifact"]["source"]["tensors"][victim]["digest"] = "xxh3-128:" + digest

    rewrite_header(out / SINGLE_NAME, edit)
    batched, alone, proven = _both(monkeypatch, out, src)
    # The other kind's copies are still proven a batch at a time; no finite-only one is.
    assert sorted(proven) == sorted(n for n in _copies(names) if not n.endswith("." + kind))
    found = _findings(batched)
    assert found == _findings(alone)
    assert [(check, tensor) for check, _, tensor, _ in found] == [("source-words", victim)]
    assert "finite-only" in found[0][1]
    assert batched.exit_code == alone.exit_code == 6


def test_a_transposed_copy_stored_untransposed_is_the_per_tensor_path_s_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A square BF16 tensor stored transposed keeps its shape and size, but its words are not
    the source bytes: a forged plane holding the source bytes as they are (plane digest
    rewritten to theirs, so every digest agrees with the bytes) differs from the
    re-derivation, found by the per-tensor path and never proven by the batch."""
    root = tmp_path / "src"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rng = np.random.default_rng(9)
    tensors = {
        f"layers.{i:02d}.{kind}": ("BF16", rng.integers(0, 0x3F00, size=shape, dtype=np.uint16))
        for i in range(8)
        for kind, shape in (("weight", (2, 3)), ("sq", (4, 4)))
    }
    write_safetensors(root / "model.safetensors", tensors)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        RECIPE.split('  - match: "re:.*\\\\.bias"')[0]
        + '  - match: "re:.*\\\\.sq"\n    format: BF16\n    transforms: [transpose]\n'
        + "    role: weight\n"
    )
    out = tmp_path / "out"
    convert_checkpoint(root, recipe, out, device="cpu", jobs=2)
    victim = "layers.03.sq"
    raw = tensors[victim][1].astype("<u2").tobytes()
    with open_artifact(out) as art:
        plane = art.tensors[victim].planes[0]
    with (out / SINGLE_NAME).open("r+b") as f:
        f.seek(plane.offset)
        assert f.read(plane.nbytes) != raw  # stored transposed
        f.seek(plane.offset)
        f.write(raw)

    def edit(header: dict[str, Any]) -> None:
        [entry] = [t for t in header["tensors"] if t["name"] == victim]
        entry["planes"][0]["digest"] = digest_hex(raw)

    rewrite_header(out / SINGLE_NAME, edit)
    batched, alone, proven = _both(monkeypatch, out, src=root)
    assert sorted(proven) == sorted(n for n in tensors if n.endswith(".weight"))
    found = _findings(batched)
    assert found == _findings(alone)
    assert [(check, tensor) for check, _, tensor, _ in found] == [("source-words", victim)]
    assert "differs from its re-derivation" in found[0][1]


def test_a_source_tensor_without_a_recorded_digest_is_the_per_tensor_path_s_finding(
    converted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metadata lists no digest for one copy's source tensor (header digest rewritten):
    that tensor is not proven by the batch (nothing to compare its digest with), and the
    report is the per-tensor path's, no crash."""
    src, clean = converted
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    names = _copies(_names(out))
    victim = names[len(names) // 2]

    def edit(header: dict[str, Any]) -> None:
        del header["artifact"]["source"]["tensors"][victim]

    rewrite_header(out / SINGLE_NAME, edit)
    batched, alone, proven = _both(monkeypatch, out, src)
    assert sorted(proven) == sorted(n for n in names if n != victim)
    found = _findings(batched)
    assert found == _findings(alone)
    assert found and {tensor for _, _, tensor, _ in found} == {victim}
    assert any("records no digest" in message for _, message, *_ in found)


@pytest.mark.parametrize(
    ("kind", "edit", "words"),
    [
        ("weight", lambda t: t.update(shape=[3, 2], physical=[3, 2]),
         "shape [3, 2], the recipe gives [2, 3]"),
        ("bias", lambda t: t.update(format="I32"), "format I32, the recipe gives FP32"),
        ("weight", lambda t: t["provenance"].update(conversion="bf16-to-f32"),
         "conversion bf16-to-f32, the recipe gives None"),
        ("weight", lambda t: t["provenance"]["sources"][0].update(name="layers.00.weight"),
         "made from ['layers.00.weight'], the recipe makes it from"),
    ],
)  # fmt: skip
def test_a_word_deciding_header_field_that_differs_is_one_inventory_finding(
    converted: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    edit: Any,
    words: str,
) -> None:
    """A stored tensor whose format, shape, conversion or source names differ
    from its plan entry (header digest rewritten, so only this check can tell) is the
    inventory's finding for that tensor, whatever the quick agreement test decides; the
    batch path reports what the per-tensor path reports."""
    src, clean = converted
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    names = _names(out)
    victim = [n for n in names if n.endswith("." + kind) and n != "layers.00.weight"]
    if kind == "weight":
        victim = [n for n in victim if _stored_shape(out, n) == (2, 3)]
    target = victim[1]

    def forge(h: dict[str, Any]) -> None:
        [tensor] = [t for t in h["tensors"] if t["name"] == target]
        edit(tensor)

    rewrite_header(out / SINGLE_NAME, forge)
    batched, alone, proven = _both(monkeypatch, out, src)
    assert target not in proven
    found = _findings(batched)
    assert found == _findings(alone)
    mine = [m for check, m, tensor, _ in found if check == "source-words" and tensor == target]
    assert any(m.startswith("the header disagrees with the recorded recipe: ") and words in m
               for m in mine), found  # fmt: skip
    assert batched.exit_code == 6


def _stored_shape(out: Path, name: str) -> tuple[int, ...]:
    with open_artifact(out) as art:
        return tuple(art.tensors[name].shape)
