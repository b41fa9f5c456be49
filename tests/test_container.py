"""The .ninfer container: writer/reader round trips, sharding, reproducibility, crash safety,
schema round trips and the public reader API."""

from __future__ import annotations

import json
import mmap
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from artifact_fixtures import (
    ALL_FORMATS,
    DEFAULT_SHAPES,
    GROUPED,
    META,
    header_of,
    logical_equal,
    make_logical,
    provenance,
    write_small,
)

import ninfer_convert
from ninfer_convert.container import (
    INDEX_NAME,
    SINGLE_NAME,
    ArtifactMeta,
    ArtifactWriter,
    Header,
    IndexFile,
    Provenance,
    open_artifact,
    shard_name,
)
from ninfer_convert.container.schema import SchemaError, TensorEntry
from ninfer_convert.container.wire import PRELUDE_SIZE, align_up
from ninfer_convert.errors import ArtifactError, FormatError, UsageError
from ninfer_convert.layouts import layout_for
from ninfer_convert.logical import DirectWords, GroupedCodes


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _siblings(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.parent.iterdir())


# ---------------------------------------------------------------------------------------------
# Round trips


def test_all_formats_roundtrip(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m")
    assert sorted(os.listdir(out)) == [SINGLE_NAME]
    with open_artifact(out) as art:
        assert list(art.tensors) == [f"t.{f}" for f in ALL_FORMATS]
        for i, fmt in enumerate(ALL_FORMATS):
            info = art.tensors[f"t.{fmt}"]
            shape = DEFAULT_SHAPES[fmt]
            assert info.format == fmt and type(info.format) is str
            assert info.layout == layout_for(fmt).name
            assert info.shape == shape
            assert info.nbytes == layout_for(fmt).encoded_size(fmt, shape)
            assert info.role == "weight"
            assert info.provenance == Provenance.from_json(provenance(fmt, shape=shape)).to_json()
            assert info.shard == 1 and info.file == out / SINGLE_NAME
            for p in info.planes:
                assert p.offset % 64 == 0
            assert logical_equal(art.read(info.name), make_logical(fmt, shape, seed=i))
        assert art.metadata == {**META, "alignment": 64}
        assert art.integrity_problems() == []
        assert art.padding_problems() == []
        assert art.files == (out / SINGLE_NAME,)


def test_read_after_close_result_stays_valid(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", ["BF16", "Q4G64_F16S"])
    art = open_artifact(out)
    words = art.read("t.BF16")
    art.close()
    art.close()  # idempotent
    assert isinstance(words, DirectWords)
    assert logical_equal(words, make_logical("BF16", DEFAULT_SHAPES["BF16"], 0))
    with pytest.raises(UsageError, match="closed"):
        art.read("t.BF16")


def test_read_rows_and_errors(tmp_path: Path) -> None:
    fmt, shape = "Q6G64_F16S", (40, 150)
    logical = make_logical(fmt, shape, 9)
    assert isinstance(logical, GroupedCodes)
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        w.add("emb", fmt, logical, role="embedding", provenance=provenance(fmt, shape=shape))
        w.add("n", "BF16", make_logical("BF16", (4,)), role="norm", provenance=provenance("BF16"))
    with open_artifact(tmp_path / "m") as art:
        got = art.read_rows("emb", [39, 0, 17, 17])
        assert np.array_equal(got.codes, logical.codes[[39, 0, 17, 17]])
        assert np.array_equal(got.scales, logical.scales[[39, 0, 17, 17]])
        got = art.read_rows("emb", slice(10, 20))
        assert np.array_equal(got.codes, logical.codes[10:20])
        with pytest.raises(UsageError, match="row-split"):
            art.read_rows("n", [0])
        with pytest.raises(UsageError, match="no tensor 'missing'"):
            art.read("missing")
        with pytest.raises(UsageError, match="has 40 rows"):
            art.read_rows("emb", [40])
        view = art.plane_buffer("emb", "hi2")
        assert len(view) == 40 * 256 // 4
        view.release()


def test_dequantize_uses_numeric_core(tmp_path: Path) -> None:
    dequant = pytest.importorskip("ninfer_convert.dequant")
    out = write_small(tmp_path / "m", ["Q4G64_F16S", "BF16"])
    with open_artifact(out) as art:
        for name in art.tensors:
            got = art.dequantize(name)
            want = dequant.dequantize_logical(art.tensors[name].format, art.read(name))
            assert got.dtype == np.float32
            assert got.shape == art.tensors[name].shape
            assert np.array_equal(got, want, equal_nan=True)


def test_empty_artifact_and_zero_size_tensor(tmp_path: Path) -> None:
    with ArtifactWriter(tmp_path / "empty", metadata=META):
        pass
    with open_artifact(tmp_path / "empty") as art:
        assert len(art.tensors) == 0 and art.integrity_problems() == []
    with ArtifactWriter(tmp_path / "z", metadata=META, alignment=64) as w:
        w.add(
            "a",
            "FP32",
            DirectWords(np.zeros((0, 3), np.uint32)),
            role="r",
            provenance=provenance("FP32"),
        )
        w.add(
            "b",
            "I32",
            DirectWords(np.arange(3, dtype=np.int32)),
            role="r",
            provenance=provenance("I32"),
        )
    with open_artifact(tmp_path / "z") as art:
        a = art.read("a")
        assert isinstance(a, DirectWords) and a.words.shape == (0, 3)
        assert art.tensors["a"].planes[0].offset == 64 and art.tensors["b"].planes[0].offset == 64
        assert art.integrity_problems() == []


# ---------------------------------------------------------------------------------------------
# Sharding


def test_sharded_layout_and_index(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", max_shard_size=300)
    names = sorted(os.listdir(out))
    shards = [n for n in names if n.endswith(".ninfer")]
    count = len(shards)
    assert count > 2
    assert shards == [shard_name(i, count) for i in range(1, count + 1)]
    assert shards[0] == f"model-00001-of-{count:05d}.ninfer"
    assert INDEX_NAME in names
    index = json.loads((out / INDEX_NAME).read_bytes())
    assert index["format"] == "ninfer-index" and index["version"] == 1
    assert [s["file"] for s in index["shards"]] == shards
    for s in index["shards"]:
        assert (out / s["file"]).stat().st_size == s["size"]
    for target in (out, out / INDEX_NAME):
        with open_artifact(target) as art:
            assert list(art.tensors) == [f"t.{f}" for f in ALL_FORMATS]
            assert index["total_size"] == sum(t.nbytes for t in art.tensors.values())
            assert art.shard_count == count
            for i, fmt in enumerate(ALL_FORMATS):
                info = art.tensors[f"t.{fmt}"]
                assert index["weight_map"][info.name] == info.file.name
                assert logical_equal(art.read(info.name), make_logical(fmt, info.shape, i))
            assert art.integrity_problems() == []
    # Every shard is a valid container by itself.
    seen = []
    for i, s in enumerate(shards, start=1):
        with open_artifact(out / s) as art:
            assert art.shard_count == count
            assert all(t.shard == i for t in art.tensors.values())
            assert art.integrity_problems() == []
            seen += list(art.tensors)
        assert header_of(out / s)["shard"] == {"index": i, "count": count}
    assert seen == [f"t.{f}" for f in ALL_FORMATS]


def test_shard_size_bound(tmp_path: Path) -> None:
    """A shard's payload stays under max_shard_size unless a single tensor is bigger."""
    limit = 4096
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64, max_shard_size=limit) as w:
        for i in range(12):
            shape = (1, 1000 * (i % 4 + 1))
            w.add(
                f"w{i}",
                "BF16",
                make_logical("BF16", shape, i),
                role="r",
                provenance=provenance("BF16"),
            )
    with open_artifact(tmp_path / "m") as art:
        for c_path in art.files:
            h = header_of(c_path)
            ends = [p["offset"] + p["nbytes"] for t in h["tensors"] for p in t["planes"]]
            assert ends and (max(ends) <= limit or len(h["tensors"]) == 1)


def test_single_shard_when_everything_fits(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", max_shard_size=1 << 30)
    assert os.listdir(out) == [SINGLE_NAME]
    assert header_of(out / SINGLE_NAME)["shard"] == {"index": 1, "count": 1}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_writer_hands_each_tensor_to_writeback_as_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every whole page of payload is handed to the kernel's writeback once, in order, right
    after its tensor is written (not only at the final fsync); the artifact is unchanged."""
    calls: list[tuple[str, int, int, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, os.fstat(fd).st_size))
        real(fd, offset, length, advice)

    def write(out: Path) -> Path:
        page = mmap.PAGESIZE
        with ArtifactWriter(out, metadata=META, alignment=64, max_shard_size=4 * page) as w:
            for i in range(8):  # tensors of 1.5 pages: whole and partial pages, 3 shards
                logical = make_logical("BF16", (1, 3 * page // 4), i)
                w.add(f"w{i}", "BF16", logical, role="r", provenance=provenance("BF16"))
        return out

    from ninfer_convert.container import shardfile

    # Tiny tensors: every new page is handed over at once (the default waits for 8 MiB).
    monkeypatch.setattr(shardfile, "_WRITEBACK_BATCH", 1)
    monkeypatch.setattr(os, "posix_fadvise", record)
    out = write(tmp_path / "m")
    monkeypatch.undo()
    assert _files(out) == _files(write(tmp_path / "ref"))
    by_file: dict[str, list[tuple[int, int, int]]] = {}
    for path, offset, length, size in calls:
        by_file.setdefault(path, []).append((offset, length, size))
    assert len(by_file) == len(list(out.glob("*.ninfer"))) > 1  # every shard
    page = mmap.PAGESIZE
    for ranges in by_file.values():
        end = 0
        for offset, length, size in ranges:
            assert offset == end and length > 0  # contiguous, each page once
            assert (offset + length) % page == 0  # whole pages: the last one is still growing
            assert size - page < offset + length <= size  # all written so far, flushed first
            end = offset + length


def test_writer_batches_the_writeback_of_tiny_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush and an fadvise per one-page tensor cost about 0.8 ms each (20,000 tensors:
    16 s of a 30 s convert): writeback starts once 8 MiB of new pages have gathered."""
    calls: list[int] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            calls.append(length)
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=4096) as w:
        for i in range(300):  # one page each
            logical = make_logical("BF16", (1, 16), i)
            w.add(f"w{i}", "BF16", logical, role="r", provenance=provenance("BF16"))
        big = make_logical("BF16", (1, 5 << 20), 0)  # 10 MiB: handed over at once
        w.add("big", "BF16", big, role="r", provenance=provenance("BF16"))
    assert len(calls) == 1 and calls[0] >= 10 << 20


# ---------------------------------------------------------------------------------------------
# Reproducibility


@pytest.mark.parametrize("max_shard_size", [None, 300])
def test_reproducible_bytes(tmp_path: Path, max_shard_size: int | None) -> None:
    a = write_small(
        tmp_path / "a",
        max_shard_size=max_shard_size,
        side_files={"config.json": b"{}", "tokenizer.json": b"[1]"},
        tmp_src=tmp_path,
    )
    b = write_small(
        tmp_path / "b",
        max_shard_size=max_shard_size,
        side_files={"tokenizer.json": b"[1]", "config.json": b"{}"},
        tmp_src=tmp_path,
    )
    assert _files(a) == _files(b)


def test_header_is_canonical_json(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m")
    data = (out / SINGLE_NAME).read_bytes()
    h_off, h_len = int.from_bytes(data[16:24], "little"), int.from_bytes(data[24:32], "little")
    raw = data[h_off : h_off + h_len]
    assert h_off + h_len == len(data)
    value = json.loads(raw)
    assert (
        json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() == raw
    )
    assert b"time" not in raw  # no timestamps


def test_tensor_order_is_add_order(tmp_path: Path) -> None:
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        for name in ("z", "a", "m"):
            w.add(
                name,
                "I32",
                DirectWords(np.arange(2, dtype=np.int32)),
                role="r",
                provenance=provenance("I32"),
            )
    assert [t["name"] for t in header_of(tmp_path / "m" / SINGLE_NAME)["tensors"]] == [
        "z",
        "a",
        "m",
    ]


# ---------------------------------------------------------------------------------------------
# Crash safety


class Boom(Exception):
    pass


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
@pytest.mark.parametrize("max_shard_size", [None, 200])
def test_interrupted_write_leaves_nothing(
    tmp_path: Path, exc: type[BaseException], max_shard_size: int | None
) -> None:
    out = tmp_path / "m"
    src = tmp_path / "cfg"
    src.write_text("{}")
    writer = ArtifactWriter(out, metadata=META, alignment=64, max_shard_size=max_shard_size)
    with pytest.raises(exc), writer as w:
        for fmt in ALL_FORMATS:
            w.add(
                fmt,
                fmt,
                make_logical(fmt, DEFAULT_SHAPES[fmt]),
                role="r",
                provenance=provenance(fmt),
            )
        w.add_file(src, "config.json")
        assert not out.exists()  # nothing under the final name while writing
        assert w.staging.is_dir()
        raise exc()
    assert not out.exists()
    assert _siblings(out) == ["cfg"]


def test_interrupted_overwrite_keeps_old_output(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", ["BF16"])
    before = _files(out)
    writer = ArtifactWriter(out, metadata=META, alignment=64, overwrite=True)
    with pytest.raises(KeyboardInterrupt), writer as w:
        w.add("x", "BF16", make_logical("BF16", (9,)), role="r", provenance=provenance("BF16"))
        raise KeyboardInterrupt
    assert _files(out) == before
    assert _siblings(out) == ["m"]


def test_failure_inside_commit_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "m"
    w = ArtifactWriter(out, metadata=META, alignment=64)
    w.add("x", "BF16", make_logical("BF16", (9,)), role="r", provenance=provenance("BF16"))
    out.mkdir()
    (out / "blocker").write_text("someone else's file")
    with pytest.raises(UsageError, match="not empty"):
        w.commit()
    assert _files(out) == {"blocker": b"someone else's file"}
    assert _siblings(out) == ["m"]


def test_existing_output_refused_without_overwrite(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", ["BF16"])
    before = _files(out)
    with pytest.raises(UsageError, match="already exists"):
        ArtifactWriter(out, metadata=META)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        ArtifactWriter(tmp_path / "file", metadata=META, overwrite=True)
    assert _files(out) == before
    # overwrite=True replaces it completely.
    write_small_over = ArtifactWriter(out, metadata=META, alignment=64, overwrite=True)
    with write_small_over as w:
        w.add(
            "new",
            "I32",
            DirectWords(np.arange(3, dtype=np.int32)),
            role="r",
            provenance=provenance("I32"),
        )
    with open_artifact(out) as art:
        assert list(art.tensors) == ["new"]
    assert _siblings(out) == ["file", "m"]


def test_empty_existing_directory_is_used(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    write_small(out, ["I32"])
    assert os.listdir(out) == [SINGLE_NAME]


def test_usage_errors_keep_writer_usable(tmp_path: Path) -> None:
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        good = make_logical("Q4G64_F16S", (2, 64))
        prov = provenance("Q4G64_F16S")
        w.add("a", "Q4G64_F16S", good, role="r", provenance=prov)
        with pytest.raises(UsageError, match="added twice"):
            w.add("a", "Q4G64_F16S", good, role="r", provenance=prov)
        with pytest.raises(FormatError, match="unknown numeric format"):
            w.add("b", "Q4G32_F16S", good, role="r", provenance=prov)
        with pytest.raises(UsageError, match="encoder_profile"):
            w.add("b", "BF16", make_logical("BF16", (2,)), role="r", provenance=prov)
        with pytest.raises(UsageError, match="unknown key"):
            w.add("b", "Q4G64_F16S", good, role="r", provenance={**prov, "extra": 1})
        with pytest.raises(UsageError, match="packs GroupedCodes, not DirectWords"):
            w.add("b", "Q4G64_F16S", make_logical("BF16", (2,)), role="r", provenance=prov)
        with pytest.raises(UsageError, match="control character"):
            w.add("b\n", "Q4G64_F16S", good, role="r", provenance=prov)
        with pytest.raises(UsageError, match="reserved"):
            w.add_file(__file__, "model.ninfer")
        with pytest.raises(UsageError, match="plain file name"):
            w.add_file(__file__, "../x")
        w.add("b", "Q4G64_F16S", good, role="r", provenance=prov)
    with open_artifact(tmp_path / "m") as art:
        assert list(art.tensors) == ["a", "b"]
        assert art.integrity_problems() == []


def test_add_packed(tmp_path: Path) -> None:
    fmt, shape = "W8G32_F16S", (3, 70)
    logical = make_logical(fmt, shape)
    planes = layout_for(fmt).pack(fmt, logical)
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        w.add_packed(
            "w", fmt, shape, [memoryview(p) for p in planes], role="r", provenance=provenance(fmt)
        )
        bad = [p.copy() for p in planes]
        bad[0][-1] = 1  # padding byte of the last row
        with pytest.raises(UsageError, match="non-canonical padding"):
            w.add_packed("w2", fmt, shape, bad, role="r", provenance=provenance(fmt))
        with pytest.raises(UsageError, match="needs 2 planes"):
            w.add_packed("w2", fmt, shape, planes[:1], role="r", provenance=provenance(fmt))
        with pytest.raises(UsageError, match="holds"):
            w.add_packed(
                "w2", fmt, shape, [planes[0][:-1], planes[1]], role="r", provenance=provenance(fmt)
            )
        with pytest.raises(UsageError, match="rank-two"):
            w.add_packed("w2", fmt, (210,), planes, role="r", provenance=provenance(fmt))
    with open_artifact(tmp_path / "m") as art:
        assert logical_equal(art.read("w"), logical)


@pytest.mark.parametrize("via", ["planes", "sink"])
@pytest.mark.parametrize("max_shard_size", [None, 600 << 10])
def test_reserved_tensors_give_the_bytes_of_add_packed(
    tmp_path: Path, max_shard_size: int | None, via: str
) -> None:
    """Reserve in order, fill the planes in any order (mapped file pages for large tensors,
    process memory for small ones), directly or in pieces through ``res.sink`` (a ``pwrite``
    into the reserved bytes), complete in order: byte-identical files to add_packed."""
    tensors = [
        ("a", "W8G32_F16S", (3, 70)),  # small: inline
        ("b", "BF16", (512, 512)),  # 512 KiB: mapped
        ("c", "Q4G64_F16S", (300, 1024)),  # 160 KiB: inline, several planes
        ("f", "Q4G64_F16S", (640, 1024)),  # 340 KiB: mapped, several planes
        ("d", "FP32", (0, 5)),  # empty
        ("e", "I32", (7,)),
    ]
    packed = {
        name: layout_for(fmt).pack(fmt, make_logical(fmt, shape, i))
        for i, (name, fmt, shape) in enumerate(tensors)
    }

    def write(out: Path, reserve: bool) -> Path:
        with ArtifactWriter(out, metadata=META, alignment=64, max_shard_size=max_shard_size) as w:
            if not reserve:
                for name, fmt, shape in tensors:
                    w.add_packed(name, fmt, shape, packed[name], role="r",
                                 provenance=provenance(fmt))  # fmt: skip
                return out
            held = [
                w.reserve(name, fmt, shape, role="r", provenance=provenance(fmt))
                for name, fmt, shape in tensors
            ]
            with pytest.raises(UsageError, match="pending reservations"):
                w.add_packed("x", "I32", (1,), [np.zeros(4, np.uint8)], role="r",
                             provenance=provenance("I32"))  # fmt: skip
            with pytest.raises(UsageError, match="in the order"):
                w.complete(held[1])
            for res in reversed(held):  # filled in any order
                for i, (dst, src) in enumerate(zip(res.planes, packed[res.name], strict=True)):
                    data = np.asarray(src).reshape(-1).view(np.uint8)
                    if via == "planes":
                        dst[...] = data
                        continue
                    cut = data.size // 3  # two pieces, the later one first
                    res.sink.write(i, cut, data[cut:])
                    res.sink.write(i, 0, data[:cut])
            for res in held:
                w.complete(res)
        return out

    assert _files(write(tmp_path / "r", True)) == _files(write(tmp_path / "p", False))


RUN_TENSORS = [
    ("a", "W8G32_F16S", (3, 70)),  # several planes, padding bits
    ("b", "BF16", (1,)),
    ("c", "Q4G64_F16S", (300, 1024)),  # 160 KiB: the run is placed plane by plane
    ("d", "FP32", (0, 5)),  # empty
    ("e", "I32", (7,)),
    ("f", "NVFP4", (130, 16)),
    ("g", "BF16", (2, 3)),
]


@pytest.mark.parametrize("tensors", [RUN_TENSORS, [t for t in RUN_TENSORS if t[0] != "c"]])
@pytest.mark.parametrize("max_shard_size", [None, 1 << 12, 200 << 10])
@pytest.mark.parametrize("alignment", [64, 4096])
def test_reserved_runs_give_the_bytes_of_add_packed(
    tmp_path: Path,
    tensors: list[tuple[str, str, tuple[int, ...]]],
    max_shard_size: int | None,
    alignment: int,
) -> None:
    """reserve_run takes the longest prefix that lies in one shard; its planes (views of one
    buffer) are filled in any order and complete_run writes the run in one go: the files are
    byte-identical to add_packed's, shards split where add_packed splits them."""
    packed = {
        name: layout_for(fmt).pack(fmt, make_logical(fmt, shape, i))
        for i, (name, fmt, shape) in enumerate(tensors)
    }

    def write(out: Path, runs: bool) -> Path:
        with ArtifactWriter(out, metadata=META, alignment=alignment,
                            max_shard_size=max_shard_size) as w:  # fmt: skip
            if not runs:
                for name, fmt, shape in tensors:
                    w.add_packed(name, fmt, shape, packed[name], role="r",
                                 provenance=provenance(fmt))  # fmt: skip
                return out
            todo = [(name, fmt, shape, "r", provenance(fmt)) for name, fmt, shape in tensors]
            held = []
            while todo:
                run = w.reserve_run(todo)
                held.append(run)
                todo = todo[len(run.names) :]
            with pytest.raises(UsageError, match="pending reservations"):
                w.add_packed("x", "I32", (1,), [np.zeros(4, np.uint8)], role="r",
                             provenance=provenance("I32"))  # fmt: skip
            if len(held) > 1:
                with pytest.raises(UsageError, match="in the order"):
                    w.complete_run(held[1])
            for run in reversed(held):  # filled in any order
                for name, planes in zip(run.names, run.planes, strict=True):
                    for dst, src in zip(planes, packed[name], strict=True):
                        dst[...] = np.asarray(src).reshape(-1).view(np.uint8)
            for run in held:
                entries = w.complete_run(run)
                assert [e.name for e in entries] == run.names
        return out

    assert _files(write(tmp_path / "r", True)) == _files(write(tmp_path / "p", False))


def test_run_spread_wide_by_its_alignment_is_written_plane_by_plane(tmp_path: Path) -> None:
    """A run whose gaps span more than 16 MiB is not gathered into one buffer: its planes are
    written one by one (the gaps holes), with the bytes of add_packed."""
    tensors = [(f"t{i}", "BF16", (3,)) for i in range(4)]  # 8 MiB apart: a 24 MiB span
    packed = {
        n: layout_for(f).pack(f, make_logical(f, s, i)) for i, (n, f, s) in enumerate(tensors)
    }

    def write(out: Path, runs: bool) -> Path:
        with ArtifactWriter(out, metadata=META, alignment=8 << 20) as w:
            if not runs:
                for name, fmt, shape in tensors:
                    w.add_packed(name, fmt, shape, packed[name], role="r",
                                 provenance=provenance(fmt))  # fmt: skip
                return out
            run = w.reserve_run([(n, f, s, "r", provenance(f)) for n, f, s in tensors])
            for name, planes in zip(run.names, run.planes, strict=True):
                planes[0][...] = np.asarray(packed[name][0]).reshape(-1).view(np.uint8)
            w.complete_run(run)
        return out

    assert _files(write(tmp_path / "r", True)) == _files(write(tmp_path / "p", False))


def test_reserved_run_refuses_what_reserve_refuses_and_leaves_the_writer_usable(
    tmp_path: Path,
) -> None:
    bf16 = provenance("BF16")
    with ArtifactWriter(tmp_path / "m", metadata=META) as w:
        with pytest.raises(UsageError, match="at least one tensor"):
            w.reserve_run([])
        with pytest.raises(UsageError, match="added twice") as twice:
            w.reserve_run([("a", "BF16", (2,), "r", bf16), ("a", "BF16", (2,), "r", bf16)])
        assert twice.value.tensor == "a"
        with pytest.raises(UsageError, match="control character"):
            w.reserve_run([("a", "BF16", (2,), "r", bf16), ("b\n", "BF16", (2,), "r", bf16)])
        with pytest.raises(UsageError) as shape:
            w.reserve_run([("a", "BF16", (2,), "r", bf16), ("b", "BF16", (-1,), "r", bf16)])
        assert shape.value.tensor == "b"
        run = w.reserve_run([("a", "BF16", (2,), "r", bf16)])  # nothing of the refused ones
        assert run.names == ["a"] and run.plane_offsets == [align_up(PRELUDE_SIZE, 4096)]
        with pytest.raises(UsageError, match="added twice"):
            w.reserve("a", "BF16", (2,), role="r", provenance=bf16)
        run.planes[0][0][...] = 7
        w.complete_run(run)
        w.commit()
    with open_artifact(tmp_path / "m") as art:
        assert list(art.tensors) == ["a"]
        assert bytes(art.plane_buffer("a", "words")) == bytes([7, 7, 7, 7])


def test_refused_run_leaves_no_new_shard_behind(tmp_path: Path) -> None:
    """A run whose first tensor would start a new shard and whose second is refused leaves
    the writer as it was: committing then gives the files of a writer that never saw it."""
    bf16 = provenance("BF16")
    words = layout_for("BF16").pack("BF16", make_logical("BF16", (64,)))

    def write(out: Path, attempt: bool) -> Path:
        with ArtifactWriter(out, metadata=META, alignment=64, max_shard_size=300) as w:
            w.add_packed("a", "BF16", (64,), words, role="r", provenance=bf16)
            if attempt:
                with pytest.raises(UsageError) as refused:
                    w.reserve_run(
                        [("b", "BF16", (64,), "r", bf16), ("c", "BF16", (-1,), "r", bf16)]
                    )
                assert refused.value.tensor == "c"
        return out

    assert _files(write(tmp_path / "r", True)) == _files(write(tmp_path / "p", False))


@pytest.mark.parametrize("fmt", ["W8G32_F16S", "NVFP4"])  # row-split, blockscale
def test_completed_run_with_padding_bits_set_is_refused(tmp_path: Path, fmt: str) -> None:
    shape = (3, 70) if fmt != "NVFP4" else (130, 16)
    planes = layout_for(fmt).pack(fmt, make_logical(fmt, shape))
    with ArtifactWriter(tmp_path / "m", metadata=META) as w:
        prov = provenance(fmt)
        run = w.reserve_run([("a", fmt, shape, "r", prov), ("w", fmt, shape, "r", prov)])
        for views in run.planes:
            for dst, src in zip(views, planes, strict=True):
                dst[:] = np.asarray(src).reshape(-1).view(np.uint8)
        plane, byte = (1, 1) if fmt == "NVFP4" else (-1, -1)
        run.planes[1][plane][byte] = 0xFF
        with pytest.raises(UsageError, match="non-canonical padding") as refused:
            w.complete_run(run)
        assert refused.value.tensor == "w"
        w.abort()


@pytest.mark.parametrize("fmt", ["W8G32_F16S", "NVFP4"])  # row-split, blockscale
@pytest.mark.parametrize("big", [False, True])  # inline, mapped
def test_completed_reservation_with_padding_bits_set_is_refused(
    tmp_path: Path, fmt: str, big: bool
) -> None:
    """complete() skips the padding check only for layouts without padding bits."""
    shape = ((640, 1030) if big else (3, 70)) if fmt != "NVFP4" else (40000 if big else 130, 16)
    planes = layout_for(fmt).pack(fmt, make_logical(fmt, shape))
    with ArtifactWriter(tmp_path / "m", metadata=META) as w:
        res = w.reserve("w", fmt, shape, role="r", provenance=provenance(fmt))
        for dst, src in zip(res.planes, planes, strict=True):
            dst[:] = src
        # Padding: row-split's last scale byte (slot 3 of the last row), blockscale's scale of
        # row 0, column 1 (K = 16: one scale column of the four a tile holds).
        plane, byte = (1, 1) if fmt == "NVFP4" else (-1, -1)
        res.planes[plane][byte] = 0xFF
        with pytest.raises(UsageError, match="non-canonical padding"):
            w.complete(res)
        w.abort()


@pytest.mark.parametrize("shape", [(3, 70), (640, 1024)])  # inline, mapped
def test_reservation_sink_refuses_bytes_outside_a_plane(
    tmp_path: Path, shape: tuple[int, int]
) -> None:
    with ArtifactWriter(tmp_path / "m", metadata=META) as w:
        res = w.reserve("w", "Q4G64_F16S", shape, role="r", provenance=provenance("Q4G64_F16S"))
        size = int(res.planes[1].size)
        with pytest.raises(ValueError, match="outside plane 1"):
            res.sink.write(1, size - 1, np.zeros(2, np.uint8))
        with pytest.raises(ValueError, match="outside plane 0"):
            res.sink.write(0, -1, np.zeros(1, np.uint8))
        w.abort()


def test_small_reserved_tensors_reach_the_file_in_few_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One write per one-page tensor cost about 230 us (each extends the file): consecutive
    small tensors are written together, with the same bytes as add_packed."""
    from ninfer_convert.container import writer as writer_module

    calls: list[int] = []
    real = writer_module.ArtifactWriter._flush_inline

    def count(self: ArtifactWriter) -> None:
        pending = self._inline
        if pending is not None and pending[2]:
            calls.append(len(pending[2]))
        real(self)

    def write(out: Path, reserve: bool) -> Path:
        with ArtifactWriter(out, metadata=META, alignment=4096) as w:
            for i in range(300):
                logical = make_logical("BF16", (1, 16), i)
                if not reserve:
                    w.add(f"w{i}", "BF16", logical, role="r", provenance=provenance("BF16"))
                    continue
                res = w.reserve(f"w{i}", "BF16", (1, 16), role="r", provenance=provenance("BF16"))
                res.planes[0][...] = layout_for("BF16").pack("BF16", logical)[0]
                w.complete(res)
        return out

    monkeypatch.setattr(writer_module.ArtifactWriter, "_flush_inline", count)
    out = write(tmp_path / "r", True)
    monkeypatch.undo()
    # 300 one-page tensors: one write at 1 MiB and one at commit, not one per tensor.
    assert len(calls) == 2 and calls[0] >= 1 << 20
    assert _files(out) == _files(write(tmp_path / "p", False))


@pytest.mark.parametrize("max_shard_size", [None, 600 << 10])
def test_add_packed_after_small_reservations_writes_at_the_cursor(
    tmp_path: Path, max_shard_size: int | None
) -> None:
    """Small reservations move the shard's cursor, not its file handle (no seek per tiny
    tensor): a tensor added with add_packed afterwards, then a mapped reservation, still land
    at their planned offsets, byte-identical to add_packed throughout."""
    tensors = [(f"s{i}", "BF16", (1, 16)) for i in range(5)] + [
        ("big", "BF16", (512, 512)),
        ("t", "I32", (7,)),
        ("u", "BF16", (256, 512)),
    ]
    packed = {
        name: layout_for(fmt).pack(fmt, make_logical(fmt, shape, i))
        for i, (name, fmt, shape) in enumerate(tensors)
    }

    def write(out: Path, reserve: bool) -> Path:
        with ArtifactWriter(out, metadata=META, alignment=64, max_shard_size=max_shard_size) as w:
            for name, fmt, shape in tensors:
                if reserve and name != "big":  # "big" is added in between
                    res = w.reserve(name, fmt, shape, role="r", provenance=provenance(fmt))
                    for dst, src in zip(res.planes, packed[name], strict=True):
                        dst[...] = np.asarray(src).reshape(-1).view(np.uint8)
                    w.complete(res)
                else:
                    w.add_packed(name, fmt, shape, packed[name], role="r",
                                 provenance=provenance(fmt))  # fmt: skip
        return out

    assert _files(write(tmp_path / "r", True)) == _files(write(tmp_path / "p", False))


def test_commit_refuses_reservations_never_completed(tmp_path: Path) -> None:
    w = ArtifactWriter(tmp_path / "m", metadata=META)
    with pytest.raises(UsageError, match="never completed"), w:
        w.reserve("a", "I32", (4,), role="r", provenance=provenance("I32"))
    assert not (tmp_path / "m").exists()


def test_metadata_validation(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="missing key"):
        ArtifactWriter(tmp_path / "a", metadata={"producer": META["producer"]})
    bad = json.loads(json.dumps(META))
    bad["source"]["files"][0]["size"] = True
    with pytest.raises(UsageError, match=r"files\[0\].size: artifact metadata: expected an int"):
        ArtifactWriter(tmp_path / "a", metadata=bad)
    bad = json.loads(json.dumps(META))
    bad["source"]["config"] = {"x": float("nan")}
    with pytest.raises(UsageError, match="non-finite"):
        ArtifactWriter(tmp_path / "a", metadata=bad)
    with pytest.raises(UsageError, match="alignment"):
        ArtifactWriter(tmp_path / "a", metadata={**META, "alignment": 64}, alignment=128)
    with pytest.raises(UsageError, match="power of two"):
        ArtifactWriter(tmp_path / "a", metadata=META, alignment=100)
    with pytest.raises(UsageError, match="max_shard_size"):
        ArtifactWriter(tmp_path / "a", metadata=META, max_shard_size=0)
    assert sorted(os.listdir(tmp_path)) == []


def test_set_metadata_before_commit(tmp_path: Path) -> None:
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        w.add(
            "x",
            "I32",
            DirectWords(np.arange(2, dtype=np.int32)),
            role="r",
            provenance=provenance("I32"),
        )
        later = json.loads(json.dumps(META))
        later["source"]["tensors"]["x"] = {"dtype": "I32", "shape": [2], "digest": "ab"}
        w.set_metadata(later)
    with open_artifact(tmp_path / "m") as art:
        assert art.metadata["source"]["tensors"]["x"]["digest"] == "ab"


def test_side_files(tmp_path: Path) -> None:
    out = write_small(
        tmp_path / "m", ["BF16"], side_files={"config.json": b'{"a": 1}'}, tmp_src=tmp_path
    )
    assert (out / "config.json").read_bytes() == b'{"a": 1}'
    with open_artifact(out) as art:
        assert list(art.side_files) == ["config.json"]
        assert art.side_files["config.json"].size == 8
        assert art.integrity_problems() == []
        (out / "config.json").write_bytes(b'{"a": 2}')
        problems = art.integrity_problems()
        assert len(problems) == 1 and "side file 'config.json'" in str(problems[0])
        # The side files are part of the snapshot taken at open: the open artifact keeps
        # reading the file it opened, and a fresh open finds it missing.
        (out / "config.json").unlink()
        assert len(art.integrity_problems()) == 1
    with open_artifact(out) as art:
        problems = art.integrity_problems()
        assert len(problems) == 1 and "no such file" in str(problems[0])


# ---------------------------------------------------------------------------------------------
# Opening


def test_open_variants(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", ["BF16"])
    for target in (out, out / SINGLE_NAME, str(out)):
        with open_artifact(target) as art:
            assert list(art.tensors) == ["t.BF16"]
    assert ninfer_convert.open_artifact is open_artifact
    with pytest.raises(ArtifactError, match="no artifact here"):
        open_artifact(tmp_path)
    with pytest.raises(ArtifactError, match="no such file"):
        open_artifact(tmp_path / "nope")
    (out / INDEX_NAME).write_text("{}")
    with pytest.raises(ArtifactError, match="ambiguous"):
        open_artifact(out)


# ---------------------------------------------------------------------------------------------
# Schema round trips


def test_schema_roundtrip(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", max_shard_size=300)
    for path in sorted(out.glob("*.ninfer")):
        value = header_of(path)
        header = Header.from_json(value)
        assert header.to_json() == value
        assert Header.from_json(header.to_json()) == header
    index = json.loads((out / INDEX_NAME).read_bytes())
    assert IndexFile.from_json(index).to_json() == index
    meta = ArtifactMeta.from_json({**META, "alignment": 64})
    assert ArtifactMeta.from_json(meta.to_json()) == meta
    prov = {
        **provenance("Q4G64_F16S"),
        "transforms": [
            {"op": "concat", "axis": 0},
            {"op": "transpose"},
            {"op": "reshape", "shape": [4, 8]},
            {"op": "copy-quantized", "scheme": "nvfp4-pack-quantized"},
        ],
        "conversion": "fp32-to-bf16-rne",
        "constraints": ["finite"],
    }
    assert Provenance.from_json(prov).to_json() == prov


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.update(extra=1), "unknown key"),
        (lambda p: p.pop("rule"), "missing key"),
        (lambda p: p.update(conversion=3), "conversion: expected a string"),
        (lambda p: p["rule"].update(line=True), "rule.line: expected an integer"),
        (lambda p: p["rule"].update(line=1.0), "rule.line: expected an integer"),
        (lambda p: p["rule"].update(index=-1), "outside"),
        (lambda p: p.update(transforms=[{"op": "rotate"}]), "unknown transform op"),
        (lambda p: p.update(transforms=[{"op": "transpose", "axes": [1, 0]}]), "unknown key"),
        (lambda p: p.update(transforms=[{"op": "concat"}]), "missing key"),
        (lambda p: p.update(sources={}), "expected an array"),
        (lambda p: p["sources"][0].update(shape=[-1]), "outside"),
        (lambda p: p.update(constraints="finite"), "expected an array"),
    ],
)
def test_provenance_schema_errors(edit: Any, message: str) -> None:
    prov = provenance("BF16")
    edit(prov)
    with pytest.raises(SchemaError, match=message):
        Provenance.from_json(prov)


def test_tensor_entry_is_frozen() -> None:
    prov = Provenance.from_json(provenance("BF16"))
    entry = TensorEntry("a", "BF16", "contiguous-le-v1", (1,), (1,), (), "r", prov)
    with pytest.raises(AttributeError):
        entry.name = "b"  # type: ignore[misc]


def test_grouped_formats_all_write(tmp_path: Path) -> None:
    """Every grouped format at an awkward shape, several tensors, one file."""
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=4096) as w:
        for i, fmt in enumerate(GROUPED):
            w.add(fmt, fmt, make_logical(fmt, (129, 130), i), role="r", provenance=provenance(fmt))
    with open_artifact(tmp_path / "m") as art:
        for i, fmt in enumerate(GROUPED):
            assert logical_equal(art.read(fmt), make_logical(fmt, (129, 130), i))
            assert all(p.offset % 4096 == 0 for p in art.tensors[fmt].planes)
        assert art.integrity_problems() == [] and art.padding_problems() == []


@pytest.mark.parametrize("where", ["role", "source", "pattern", "constraint"])
@pytest.mark.parametrize("how", ["add", "reserve"])
def test_unencodable_role_or_provenance_refused_before_any_byte(
    tmp_path: Path, where: str, how: str
) -> None:
    prov = provenance("I32")
    role = "bad\udc80" if where == "role" else "r"
    if where == "source":
        prov["sources"][0]["name"] = "w\ud800"
    elif where == "pattern":
        prov["rule"]["pattern"] = "é\udfff"
    elif where == "constraint":
        prov["constraints"] = ["\ud800"]
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        with pytest.raises(UsageError, match="not encodable as UTF-8: surrogates not allowed"):
            if how == "add":
                w.add("w", "I32", DirectWords(np.arange(2, dtype=np.int32)), role=role,
                      provenance=prov)  # fmt: skip
            else:
                w.reserve("w", "I32", (2,), role=role, provenance=prov)
        w.add("ok", "I32", DirectWords(np.arange(2, dtype=np.int32)), role="r",
              provenance=provenance("I32"))  # fmt: skip
    with open_artifact(tmp_path / "m") as art:
        assert list(art.tensors) == ["ok"]


def test_unencodable_names_refused(tmp_path: Path) -> None:
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        with pytest.raises(UsageError, match="UTF-8"):
            w.add(
                "bad\ud800",
                "I32",
                DirectWords(np.arange(2, dtype=np.int32)),
                role="r",
                provenance=provenance("I32"),
            )
        with pytest.raises(UsageError, match="UTF-8"):
            w.add_file(__file__, "x\ud800")
    with open_artifact(tmp_path / "m") as art:
        assert len(art.tensors) == 0


def test_geometry_checked_in_bulk_raises_what_each_entry_check_raises() -> None:
    """check_entries_geometry answers "all clear" only when check_tensor_geometry of every
    entry passes; otherwise it raises that check's very error, for the first bad entry."""
    from dataclasses import replace

    from ninfer_convert.container.checks import check_entries_geometry, check_tensor_geometry
    from ninfer_convert.container.schema import PlaneEntry

    def entry(name: str, shape: tuple[int, ...]) -> TensorEntry:
        return TensorEntry(name, "BF16", "contiguous-le-v1", shape, shape,
                           (PlaneEntry("words", 4096, 2 * int(np.prod(shape)), "0" * 32),),
                           "r", Provenance.from_json(provenance("BF16"), "p"))  # fmt: skip

    good = [entry("a", (2,)), entry("b", (2,)), entry("c", (3, 2))]
    check_entries_geometry(good, lambda e: e.name, {})
    plane = good[1].planes[0]
    bad = [
        replace(good[1], name="b\x07"),
        replace(good[1], physical=(3,)),
        replace(good[1], planes=(replace(plane, nbytes=6),)),
        replace(good[1], planes=(replace(plane, name="codes"),)),
        replace(good[1], planes=(plane, plane)),
    ]
    for wrong in bad:
        with pytest.raises(SchemaError) as expected:
            check_tensor_geometry(wrong, "x", {})
        cache: dict[Any, Any] = {}
        check_entries_geometry(good, lambda e: "x", cache)  # the cache holds b's answer
        with pytest.raises(SchemaError) as got:
            check_entries_geometry([good[0], wrong, good[2]], lambda e: "x", cache)
        assert (got.value.where, got.value.message) == (
            expected.value.where,
            expected.value.message,
        )
