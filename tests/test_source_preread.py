"""SourceCheckpoint.preread: a batch of small tensors read with a few preads gives exactly what
read gives alone (words, digest, errors), and convert reads tiny tensors a batch at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_scaling import _many_tensors

import ninfer_convert.source.checkpoint as checkpoint
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import SourceError
from ninfer_convert.source import open_source

RECIPE = """\
ninfer_recipe: 1
name: preread
version: "1"
source:
  model_type: [llama]
rules:
  - match: "re:.*\\\\.weight"
    format: BF16
    role: weight
"""


def _mixed(root: Path) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    g = torch.Generator().manual_seed(7)
    tensors = {
        f"t{i:03d}.{kind}": t
        for i, (kind, t) in enumerate(
            (k, v)
            for _ in range(6)
            for k, v in (
                ("bf16", torch.randn(3, 5, generator=g).to(torch.bfloat16)),
                ("f32", torch.randn(7, generator=g)),
                ("i64", torch.arange(4, dtype=torch.int64)),
                ("bool", torch.tensor([True, False, True])),
                ("empty", torch.zeros(0, 3, dtype=torch.float16)),
                ("big", torch.randn(40_000, generator=g)),  # 160 KB: mapped, not preread
            )
        )
    }
    save_file(tensors, str(root / "model.safetensors"))
    return root


def _same(a: checkpoint.SourceArray, b: checkpoint.SourceArray) -> None:
    assert a.digest == b.digest
    assert a.words.dtype == b.words.dtype and a.words.shape == b.words.shape
    assert a.words.tobytes() == b.words.tobytes()
    assert a.words.flags.writeable == b.words.flags.writeable


def test_preread_reads_what_read_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = open_source(_mixed(tmp_path / "m"))
    names = list(src.tensors)
    alone = {n: src.read(n) for n in names}
    calls = []
    real = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        calls.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(checkpoint.os, "pread", counted)
    with src.preread(names):
        for n in names:
            _same(src.read(n), alone[n])
        for n in names[:5]:  # read twice: the second read is an ordinary one
            _same(src.read(n), alone[n])
    # Each group of small tensors between two big ones (in file order) is one pread, a lone
    # one is read as usual, then the ordinary reads of the second pass (four: the empty
    # tensor reads nothing).
    groups, run = [], 0
    for info in sorted(src.tensors.values(), key=lambda i: i.offset):
        if 0 < info.nbytes <= checkpoint.SMALL_READ_BYTES:
            run += 1
        elif info.nbytes:
            groups.append(run)
            run = 0
    groups.append(run)
    assert len(calls) == sum(1 for g in groups if g) + 4, (calls, groups)
    assert len(calls) < len(names) // 2
    assert max(calls) < 10_000, calls  # no big tensor's bytes read along
    for n in names:  # outside the block: ordinary reads again
        _same(src.read(n), alone[n])


def test_preread_bytes_are_the_raw_bytes_read_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _mixed(tmp_path / "m")
    src = open_source(root)
    infos = list(src.tensors.values())
    calls = []
    real = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        calls.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(checkpoint.os, "pread", counted)
    got = src.preread_bytes(infos)
    monkeypatch.undo()
    small = [i.name for i in infos if 0 < i.nbytes <= checkpoint.SMALL_READ_BYTES]
    # Not the empty ones, not the mapped big ones, not one alone between two big ones.
    assert set(got) <= set(small) and len(got) > len(small) // 2
    assert len(calls) < len(got) // 4
    for name, raw in got.items():
        assert bytes(raw) == src.read(name).words.tobytes()
    with open(root / "model.safetensors", "ab") as fh:
        fh.write(b"\0" * 8)  # the file grew after it was opened: left to read, which reports
    assert src.preread_bytes(infos) == {}


def test_preread_leaves_a_changed_file_to_read(tmp_path: Path) -> None:
    root = _mixed(tmp_path / "m")
    src = open_source(root)
    with open(root / "model.safetensors", "ab") as fh:
        fh.write(b"\0" * 8)  # the file grew after it was opened
    with src.preread(list(src.tensors)), pytest.raises(SourceError, match="changed during"):
        src.read("t000.bf16")


def test_preread_keeps_the_bool_check(tmp_path: Path) -> None:
    root = _mixed(tmp_path / "m")
    src = open_source(root)
    info = src.tensors["t003.bool"]
    with open(root / "model.safetensors", "r+b") as fh:
        fh.seek(info.offset + 1)
        fh.write(b"\x02")
    with src.preread(list(src.tensors)), pytest.raises(SourceError, match="BOOL element 1"):
        src.read("t003.bool")


def test_convert_reads_tiny_tensors_a_batch_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 1_000
    root = tmp_path / "src"
    _many_tensors(root, count)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    calls = []
    real = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        calls.append(n)
        return real(fd, n, offset)

    monkeypatch.setattr(checkpoint.os, "pread", counted)
    convert_checkpoint(root, recipe, tmp_path / "out", device="cpu", jobs=2)
    # Batches of up to 256 tensors: a few preads, not one per tensor.
    assert len(calls) <= 2 * count // 256 + 2, len(calls)
