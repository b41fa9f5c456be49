"""Hostile input: every damaged or malicious artifact gives an ArtifactError, never a crash, hang,
huge allocation or silent wrong result."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from artifact_fixtures import (
    META,
    header_of,
    make_logical,
    provenance,
    rewrite_header,
    write_raw_header,
    write_small,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_convert.container import INDEX_NAME, SINGLE_NAME, ArtifactWriter, open_artifact
from ninfer_convert.container.wire import PRELUDE, canonical_json
from ninfer_convert.errors import ArtifactError, IntegrityError
from ninfer_convert.logical import DirectWords

SMALL_FORMATS = ["BF16", "Q5G64_F16S", "NVFP4"]


@pytest.fixture(scope="module")
def small_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small single-file artifact with a gap before and between planes, and a side file."""
    root = tmp_path_factory.mktemp("small")
    out = write_small(root / "m", SMALL_FORMATS, side_files={"config.json": b"{}"}, tmp_src=root)
    return (out / SINGLE_NAME).read_bytes()


def _exercise(path: Path, *, check_header_digest: bool) -> list[Any]:
    """Open, read every tensor and run both checks; return all problems found."""
    with open_artifact(path, check_header_digest=check_header_digest) as art:
        for name in art.tensors:
            art.read(name)
        return [*art.integrity_problems(), *art.padding_problems()]


def _detected(path: Path, *, check_header_digest: bool) -> bool:
    try:
        return bool(_exercise(path, check_header_digest=check_header_digest))
    except ArtifactError:
        return True


def _artifact_dir(tmp_path: Path, data: bytes) -> Path:
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / SINGLE_NAME).write_bytes(data)
    (d / "config.json").write_bytes(b"{}")
    return d


# ---------------------------------------------------------------------------------------------
# Every single changed byte is detected


def test_every_flipped_byte_is_detected(tmp_path: Path, small_file: bytes) -> None:
    d = _artifact_dir(tmp_path, small_file)
    path = d / SINGLE_NAME
    assert not _exercise(path, check_header_digest=True)
    undetected = []
    for pos in range(len(small_file)):
        # The low bit of every byte; the high bit of every fifth (bounded run time).
        for mask in (0x01, 0x80) if pos % 5 == 0 else (0x01,):
            data = bytearray(small_file)
            data[pos] ^= mask
            path.write_bytes(data)
            for check in (True, False):
                if not _detected(path, check_header_digest=check):
                    undetected.append((pos, mask, check))
    assert undetected == []


def test_every_flipped_index_byte_is_detected(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", SMALL_FORMATS, max_shard_size=200)
    index = out / INDEX_NAME
    original = index.read_bytes()
    undetected = []
    for pos in range(len(original)):
        data = bytearray(original)
        data[pos] ^= 0x01
        index.write_bytes(data)
        if not _detected(out, check_header_digest=True):
            undetected.append(pos)
        if not _detected(out, check_header_digest=False):
            undetected.append(pos)
    assert undetected == []


def test_flipped_bytes_in_a_shard_are_detected(tmp_path: Path) -> None:
    out = write_small(tmp_path / "m", SMALL_FORMATS, max_shard_size=200)
    shard = sorted(out.glob("model-*.ninfer"))[1]
    original = shard.read_bytes()
    for pos in range(0, len(original), 7):
        data = bytearray(original)
        data[pos] ^= 0x40
        shard.write_bytes(data)
        assert _detected(out, check_header_digest=True), pos
        assert _detected(out, check_header_digest=False), pos


def test_integrity_problems_name_the_region(tmp_path: Path, small_file: bytes) -> None:
    d = _artifact_dir(tmp_path, small_file)
    path = d / SINGLE_NAME
    h = header_of(path)
    planes = [(t["name"], p) for t in h["tensors"] for p in t["planes"]]
    data = bytearray(small_file)
    name, plane = planes[1]
    data[plane["offset"]] ^= 0xFF  # plane byte
    data[planes[0][1]["offset"] - 1] = 0x5A  # gap byte before the first plane
    data[40] ^= 0x01  # header digest byte
    path.write_bytes(data)
    with pytest.raises(IntegrityError) as info:
        open_artifact(path)
    assert info.value.kind == "digest_mismatch"
    with open_artifact(path, check_header_digest=False) as art:
        problems = art.integrity_problems()
    messages = [str(p) for p in problems]
    assert all(isinstance(p, IntegrityError) for p in problems)
    kinds = [p.kind for p in problems]
    assert kinds == ["digest_mismatch", "nonzero_gap", "digest_mismatch"]
    assert len(messages) == 3, messages
    assert "header digest mismatch" in messages[0]
    assert "non-zero byte(s) in the gap [48, 64)" in messages[1]
    assert f"tensor {name!r}: plane {plane['name']!r} digest mismatch" in messages[2]


def test_padding_change_is_reported_by_both_checks(tmp_path: Path) -> None:
    out = tmp_path / "m"
    with ArtifactWriter(out, metadata=META, alignment=64) as w:
        w.add(
            "q",
            "Q4G64_F16S",
            make_logical("Q4G64_F16S", (2, 70)),
            role="r",
            provenance=provenance("Q4G64_F16S"),
        )
    path = out / SINGLE_NAME
    h = header_of(path)
    data = bytearray(path.read_bytes())
    data[h["tensors"][0]["planes"][0]["offset"] + 63] = 0x10  # k = 127 of row 0: padding
    path.write_bytes(data)
    with open_artifact(out) as art:
        assert len(art.integrity_problems()) == 1
        (problem,) = art.padding_problems()
        assert problem.kind == "nonzero_padding"
        assert str(problem).endswith(
            "tensor 'q': plane 'codes' row 0 byte 63: padding bits are 0x10, expected zero"
        )


def test_blockscale_padding_change_is_reported_beside_padless_tensors(tmp_path: Path) -> None:
    """Artifact.padding_problems skips the tensors of layouts without padding bits only."""
    out = tmp_path / "m"
    with ArtifactWriter(out, metadata=META, alignment=64) as w:
        for name, fmt, shape in (("a", "BF16", (2, 3)), ("n", "NVFP4", (130, 16)),
                                 ("z", "FP8_E4M3FN_ROW_BF16S", (2, 16))):  # fmt: skip
            w.add(name, fmt, make_logical(fmt, shape), role="r", provenance=provenance(fmt))
    path = out / SINGLE_NAME
    h = header_of(path)
    data = bytearray(path.read_bytes())
    data[h["tensors"][1]["planes"][1]["offset"] + 1] = 0x22  # scale of row 0, column 1: padding
    path.write_bytes(data)
    with open_artifact(out) as art:
        (problem,) = art.padding_problems()
        assert problem.kind == "nonzero_padding" and problem.tensor == "n"
        assert "plane 'scales' padding scale (row 0, column 1) at byte 1 is 0x22" in str(problem)


# ---------------------------------------------------------------------------------------------
# Truncation, extension, garbage


def test_every_truncation_is_rejected(tmp_path: Path, small_file: bytes) -> None:
    path = tmp_path / SINGLE_NAME
    for length in list(range(0, 100)) + list(range(100, len(small_file), 13)):
        path.write_bytes(small_file[:length])
        with pytest.raises(ArtifactError):
            open_artifact(path, check_header_digest=False)


def test_trailing_bytes_rejected(tmp_path: Path, small_file: bytes) -> None:
    path = tmp_path / SINGLE_NAME
    path.write_bytes(small_file + b"\x00")
    with pytest.raises(ArtifactError, match="end exactly at the end of the file"):
        open_artifact(path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter than the 48-byte prelude"),
        (b"hello", "shorter than the 48-byte prelude"),
        (bytes(4096), "not a .ninfer container"),
        (b'{"__metadata__": {}}' + bytes(100), "not a .ninfer container"),
        (os.urandom(1000), "not a .ninfer container"),
    ],
)
def test_garbage_rejected(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "x.ninfer"
    path.write_bytes(data)
    with pytest.raises(ArtifactError, match=message):
        open_artifact(path)


def test_directory_and_special_files(tmp_path: Path) -> None:
    (tmp_path / "d.ninfer").mkdir()
    with pytest.raises(ArtifactError, match=r"not a regular file|no artifact here"):
        open_artifact(tmp_path / "d.ninfer")


# ---------------------------------------------------------------------------------------------
# Prelude fields


def _prelude_edit(small_file: bytes, **fields: int) -> bytes:
    magic, major, minor, reserved, h_off, h_len, digest = PRELUDE.unpack(small_file[:48])
    values = {"major": major, "minor": minor, "reserved": reserved, "h_off": h_off, "h_len": h_len}
    values.update(fields)
    head = PRELUDE.pack(
        magic,
        values["major"],
        values["minor"],
        values["reserved"],
        values["h_off"],
        values["h_len"],
        digest,
    )
    return head + small_file[48:]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"major": 2}, "unsupported container major version 2; this reader supports only"),
        ({"major": 0}, "unsupported container major version 0"),
        ({"minor": 1}, "version 1.1 is newer than this reader's 1.0"),
        ({"reserved": 1}, "reserved prelude field"),
        ({"h_len": 1 << 40}, "exceeds the 67108864-byte cap"),
        ({"h_len": (1 << 64) - 1}, "exceeds"),
        ({"h_off": 0}, "must start after the 48-byte prelude"),
        ({"h_off": (1 << 64) - 1}, "truncated or extended"),
        ({"h_off": 60}, "truncated or extended"),
    ],
)
def test_prelude_fields(
    tmp_path: Path, small_file: bytes, fields: dict[str, int], message: str
) -> None:
    path = tmp_path / SINGLE_NAME
    path.write_bytes(_prelude_edit(small_file, **fields))
    with pytest.raises(ArtifactError, match=message):
        open_artifact(path, check_header_digest=False)


def test_header_digest_checked_at_open(tmp_path: Path, small_file: bytes) -> None:
    path = tmp_path / SINGLE_NAME
    data = bytearray(small_file)
    data[-5] ^= 0x01  # inside the header JSON, still valid UTF-8 and JSON-ish
    path.write_bytes(data)
    with pytest.raises(IntegrityError, match="header digest mismatch"):
        open_artifact(path)


# ---------------------------------------------------------------------------------------------
# Header contents (prelude and digest rewritten consistently, so only semantics can catch it)


def _planes(h: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for t in h["tensors"] for p in t["planes"]]


HeaderEdit = Callable[[dict[str, Any]], Any]

HEADER_CASES: list[tuple[str, HeaderEdit, str]] = [
    ("overlap", lambda h: _planes(h)[1].update(offset=_planes(h)[0]["offset"]), "overlaps"),
    ("into-prelude", lambda h: _planes(h)[0].update(offset=0), "overlaps the prelude"),
    (
        "misaligned",
        lambda h: _planes(h)[1].update(offset=_planes(h)[1]["offset"] + 1),
        "not a multiple of the alignment 64",
    ),
    ("out-of-range", lambda h: _planes(h)[-1].update(offset=1 << 40), "beyond the payload"),
    (
        "nbytes",
        lambda h: _planes(h)[0].update(nbytes=_planes(h)[0]["nbytes"] + 1),
        "declares 31 bytes but contiguous-le-v1 computes 30",
    ),
    ("huge-nbytes", lambda h: _planes(h)[0].update(nbytes=1 << 62), "declares"),
    ("too-huge", lambda h: _planes(h)[0].update(nbytes=1 << 64), "outside"),
    ("negative", lambda h: _planes(h)[0].update(offset=-64), "outside"),
    ("neg-shape", lambda h: h["tensors"][0].update(shape=[-3, 5]), "outside"),
    (
        "huge-shape",
        lambda h: h["tensors"][0].update(shape=[1 << 50, 1 << 50]),
        "dimension 1125899906842624 outside",
    ),
    ("many-elements", lambda h: h["tensors"][0].update(shape=[1 << 40] * 3), "too many elements"),
    (
        "zero-dim-huge",
        lambda h: h["tensors"][0].update(shape=[0] + [1 << 30] * 3),
        "too many elements",
    ),
    (
        "shape-vs-planes",
        lambda h: h["tensors"][0].update(shape=[3, 6], physical=[3, 6]),
        "declares 30 bytes but contiguous-le-v1 computes 36",
    ),
    ("physical", lambda h: h["tensors"][1].update(physical=[2, 130]), "physical extents"),
    ("plane-names", lambda h: h["tensors"][1]["planes"].reverse(), "differ from"),
    ("plane-missing", lambda h: h["tensors"][1]["planes"].pop() and None, "differ from"),
    (
        "unknown-format",
        lambda h: h["tensors"][0].update(format="FP16"),
        "unknown numeric format 'FP16'",
    ),
    ("alias-format", lambda h: h["tensors"][0].update(format="bf16"), "unknown numeric format"),
    (
        "unknown-layout",
        lambda h: h["tensors"][0].update(layout="contiguous-be-v1"),
        "unknown storage layout",
    ),
    (
        "combination",
        lambda h: h["tensors"][1].update(layout="contiguous-le-v1"),
        "cannot be stored with layout contiguous-le-v1",
    ),
    (
        "nvfp4-shape",
        lambda h: h["tensors"][2].update(shape=[3, 40], physical=[3, 40]),
        "multiple of 16",
    ),
    (
        "duplicate-name",
        lambda h: h["tensors"][1].update(name=h["tensors"][0]["name"]),
        "duplicate tensor name",
    ),
    ("empty-name", lambda h: h["tensors"][1].update(name=""), "must not be empty"),
    ("bool-int", lambda h: h["tensors"][0].update(shape=[True, 5]), "expected an integer"),
    ("float-int", lambda h: _planes(h)[0].update(offset=64.0), "expected an integer"),
    ("string-int", lambda h: _planes(h)[0].update(nbytes="30"), "expected an integer"),
    ("unknown-top", lambda h: h.update(extra={}), "unknown key"),
    ("unknown-tensor-key", lambda h: h["tensors"][0].update(dtype="bf16"), "unknown key"),
    ("unknown-plane-key", lambda h: _planes(h)[0].update(crc=0), "unknown key"),
    ("missing-role", lambda h: h["tensors"][0].pop("role") and None, "missing key"),
    ("digest-form", lambda h: _planes(h)[0].update(digest="XYZ"), "32 lowercase hex"),
    (
        "digest-upper",
        lambda h: _planes(h)[0].update(digest=_planes(h)[0]["digest"].upper()),
        "32 lowercase hex",
    ),
    ("alignment", lambda h: h["artifact"].update(alignment=96), "not a power of two"),
    ("alignment-zero", lambda h: h["artifact"].update(alignment=0), "not a power of two"),
    ("alignment-bool", lambda h: h["artifact"].update(alignment=True), "expected an integer"),
    ("shard", lambda h: h.update(shard={"index": 2, "count": 1}), "outside"),
    (
        "profile",
        lambda h: h["tensors"][0]["provenance"].update(encoder_profile="GPTQ"),
        "unknown encoder profile",
    ),
    (
        "profile-fit",
        lambda h: h["tensors"][0]["provenance"].update(encoder_profile="MAXABS_F16_RECIP_RNE_V1"),
        "cannot produce BF16",
    ),
    (
        "transform-op",
        lambda h: h["tensors"][0]["provenance"].update(transforms=[{"op": "scale"}]),
        "unknown transform op",
    ),
    ("side-file-name", lambda h: h["files"][0].update(name="../etc/passwd"), "plain file name"),
    ("side-file-order", lambda h: h["files"].append(dict(h["files"][0])), "sorted"),
    (
        "config-type",
        lambda h: h["artifact"]["source"].update(config=[1]),
        "expected an object or null",
    ),
    ("tensors-type", lambda h: h.update(tensors={}), "expected an array"),
    ("header-array", lambda h: [h], "expected an object"),
    (
        "header-after-gap",
        lambda h: _planes(h)[-1].update(nbytes=_planes(h)[-1]["nbytes"] - 1),
        "declares",
    ),
]


@pytest.mark.parametrize(
    ("case", "edit", "message"), HEADER_CASES, ids=[c[0] for c in HEADER_CASES]
)
def test_header_semantics(
    tmp_path: Path, small_file: bytes, case: str, edit: HeaderEdit, message: str
) -> None:
    path = tmp_path / SINGLE_NAME
    path.write_bytes(small_file)
    rewrite_header(path, edit)
    with pytest.raises(ArtifactError, match=message) as info:
        open_artifact(path)
    assert type(info.value) is ArtifactError and info.value.kind == "header_invalid"
    assert info.value.path == str(path) and info.value.where is not None


def test_non_canonical_plane_offset(tmp_path: Path, small_file: bytes) -> None:
    """A plane moved one alignment unit later (zero gap kept) is still refused."""
    h = json.loads(small_file[PRELUDE.unpack(small_file[:48])[4] :])
    last = _planes(h)[-1]
    payload = small_file[: PRELUDE.unpack(small_file[:48])[4]]
    payload = payload[: last["offset"]] + bytes(64) + payload[last["offset"] :]
    last["offset"] += 64
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, payload, canonical_json(h))
    with pytest.raises(ArtifactError, match="the canonical offset is"):
        open_artifact(path)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"a":1,"a":2}', "repeats the JSON key 'a'"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),
        (b'{"x": NaN}', "contains NaN"),
        (b'{"x": -Infinity}', "contains -Infinity"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
        (b'{"x": ' + b"9" * 5000 + b"}", "not acceptable JSON"),
        (b"", "not valid JSON"),
        (b"null", "expected an object, got null"),
        (b'"\\ud800"', "lone surrogate"),
    ],
)
def test_raw_header_json(tmp_path: Path, small_file: bytes, raw: bytes, message: str) -> None:
    path = tmp_path / SINGLE_NAME
    write_raw_header(path, bytes(48), raw)
    with pytest.raises(ArtifactError, match=message):
        open_artifact(path)


def test_duplicate_key_inside_tensor(tmp_path: Path, small_file: bytes) -> None:
    path = tmp_path / SINGLE_NAME
    path.write_bytes(small_file)

    def dup(h: dict[str, Any]) -> bytes:
        raw = canonical_json(h)
        return raw.replace(b'"role":"weight"', b'"role":"weight","role":"bias"', 1)

    rewrite_header(path, dup)
    with pytest.raises(ArtifactError, match="repeats the JSON key 'role'"):
        open_artifact(path)


# ---------------------------------------------------------------------------------------------
# Shard sets


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    out = write_small(tmp_path / "m", SMALL_FORMATS, max_shard_size=200)
    assert len(list(out.glob("*.ninfer"))) == 3
    return out


def _edit_index(out: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    value = json.loads((out / INDEX_NAME).read_bytes())
    edit(value)
    (out / INDEX_NAME).write_bytes(canonical_json(value))


def test_missing_shard(sharded: Path) -> None:
    (sharded / "model-00002-of-00003.ninfer").unlink()
    with pytest.raises(ArtifactError, match="shard 2 of 3 is missing"):
        open_artifact(sharded)


def test_truncated_shard(sharded: Path) -> None:
    shard = sharded / "model-00003-of-00003.ninfer"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match="index records"):
        open_artifact(sharded)
    with pytest.raises(ArtifactError):
        open_artifact(shard)


def test_swapped_shards(sharded: Path) -> None:
    a, b = sharded / "model-00001-of-00003.ninfer", sharded / "model-00002-of-00003.ninfer"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(ArtifactError):
        open_artifact(sharded)

    # Even with the sizes and digests in the index swapped too, the shard numbers disagree.
    def swap(v: dict[str, Any]) -> None:
        s = v["shards"]
        s[0]["size"], s[1]["size"] = s[1]["size"], s[0]["size"]
        s[0]["digest"], s[1]["digest"] = s[1]["digest"], s[0]["digest"]

    _edit_index(sharded, swap)
    with pytest.raises(ArtifactError, match="header says shard 2 of 3, the index says 1 of 3"):
        open_artifact(sharded)


@pytest.mark.parametrize(
    ("edit", "message", "error"),
    [
        (
            lambda v: v["weight_map"].update({"t.BF16": "model-00002-of-00003.ninfer"}),
            "in another shard",
            ArtifactError,
        ),
        (lambda v: v["weight_map"].pop("t.BF16"), "not in the index", ArtifactError),
        (
            lambda v: v["weight_map"].update(ghost="model-00001-of-00003.ninfer"),
            "in no shard",
            ArtifactError,
        ),
        (lambda v: v.update(total_size=v["total_size"] + 1), "total_size", ArtifactError),
        (lambda v: v["shards"][0].update(digest="0" * 32), "differs from", IntegrityError),
        (lambda v: v["shards"][0].update(file="model-1-of-3.ninfer"), "expected", ArtifactError),
        (lambda v: v["shards"].pop(), "expected 'model-00001-of-00002.ninfer'", ArtifactError),
        (lambda v: v.update(shards=v["shards"][:1]), "only for 2 or more", ArtifactError),
        (lambda v: v.update(version=2), "unsupported index version", ArtifactError),
        (lambda v: v.update(format="safetensors-index"), "expected 'ninfer-index'", ArtifactError),
        (lambda v: v.update(metadata={}), "unknown key", ArtifactError),
    ],
)
def test_index_consistency(
    sharded: Path, edit: Callable[[dict[str, Any]], None], message: str, error: type[Exception]
) -> None:
    _edit_index(sharded, edit)
    with pytest.raises(error, match=message):
        open_artifact(sharded)


def test_non_canonical_index(sharded: Path) -> None:
    value = json.loads((sharded / INDEX_NAME).read_bytes())
    (sharded / INDEX_NAME).write_text(json.dumps(value, indent=2))
    with pytest.raises(ArtifactError, match="canonical"):
        open_artifact(sharded)


def test_index_digest_reported_when_not_checked(sharded: Path) -> None:
    _edit_index(sharded, lambda v: v["shards"][1].update(digest="0" * 32))
    with open_artifact(sharded, check_header_digest=False) as art:
        (problem,) = art.integrity_problems()
        assert "recorded in the index" in str(problem)


def test_shards_with_different_metadata(sharded: Path) -> None:
    shard = sharded / "model-00002-of-00003.ninfer"
    rewrite_header(shard, lambda h: h["artifact"]["producer"].update(version="9"))
    _edit_index(
        sharded,
        lambda v: v["shards"][1].update(
            size=shard.stat().st_size,
            digest=shard.read_bytes()[32:48].hex(),
        ),
    )
    with pytest.raises(ArtifactError, match="metadata differs"):
        open_artifact(sharded)


# ---------------------------------------------------------------------------------------------
# Fuzzing


@pytest.fixture(scope="module")
def fuzz_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ninfer-fuzz-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run_bounded(path: Path) -> None:
    """open + read + checks may raise only ArtifactError, allocate little and end quickly."""
    started = time.perf_counter()
    tracemalloc.start()
    try:
        for check in (False, True):
            with contextlib.suppress(ArtifactError):
                _exercise(path, check_header_digest=check)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak allocation {peak} bytes"
    assert time.perf_counter() - started < 5.0


@settings(max_examples=250, deadline=None)
@given(
    edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=6),
    cut=st.one_of(st.none(), st.integers(0, 1 << 20)),
    tail=st.binary(max_size=8),
)
def test_fuzz_byte_mutations(
    fuzz_dir: Path,
    small_file: bytes,
    edits: list[tuple[int, int]],
    cut: int | None,
    tail: bytes,
) -> None:
    data = bytearray(small_file)
    for pos, value in edits:
        data[pos % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    data += tail
    path = fuzz_dir / "byte.ninfer"
    path.write_bytes(bytes(data))
    _run_bounded(path)


def _leaf_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            paths += _leaf_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            paths += _leaf_paths(v, (*prefix, i))
    return paths


JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(1 << 70), 1 << 70),
        st.sampled_from([0, 1, 2, 15, 16, 48, 64, 128, 4096, -1, 1 << 31, 1 << 62, 1 << 63]),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
        st.sampled_from(["BF16", "NVFP4", "Q4G64_F16S", "row-split-k128-v1", "codes", "hi1"]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=250, deadline=None)
@given(data=st.data())
def test_fuzz_header_values(fuzz_dir: Path, small_file: bytes, data: st.DataObject) -> None:
    h_off = PRELUDE.unpack(small_file[:48])[4]
    header = json.loads(small_file[h_off:])
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _leaf_paths(header)
        path = data.draw(st.sampled_from(paths))
        new = data.draw(JSON_VALUES)
        if not path:
            header = new
            continue
        parent = header
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()) or not isinstance(parent, (dict, list)):
            parent[path[-1]] = new
        else:
            del parent[path[-1]]
        if not isinstance(header, (dict, list)):
            break
    target = fuzz_dir / "header.ninfer"
    write_raw_header(target, small_file[:h_off], canonical_json(header))
    _run_bounded(target)


def test_huge_declared_tensor_does_not_allocate(tmp_path: Path) -> None:
    """A header claiming a 2^40-element tensor is refused before any allocation."""
    out = tmp_path / "m"
    with ArtifactWriter(out, metadata=META, alignment=64) as w:
        w.add(
            "x",
            "BF16",
            DirectWords(np.zeros(4, np.uint16)),
            role="r",
            provenance=provenance("BF16"),
        )
    path = out / SINGLE_NAME

    def grow(h: dict[str, Any]) -> None:
        h["tensors"][0]["shape"] = [1 << 40]
        h["tensors"][0]["physical"] = [1 << 40]
        h["tensors"][0]["planes"][0]["nbytes"] = 1 << 41

    rewrite_header(path, grow)
    tracemalloc.start()
    try:
        with pytest.raises(ArtifactError, match="beyond the payload region"):
            open_artifact(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_read_with_verify(tmp_path: Path, small_file: bytes) -> None:
    d = _artifact_dir(tmp_path, small_file)
    path = d / SINGLE_NAME
    plane = header_of(path)["tensors"][1]["planes"][0]
    data = bytearray(small_file)
    data[plane["offset"] + 3] ^= 0x10
    path.write_bytes(data)
    with open_artifact(d) as art:
        name = list(art.tensors)[1]
        art.read(name)  # no digest pass unless asked
        with pytest.raises(IntegrityError, match="digest mismatch"):
            art.read(name, verify=True)
        assert art.verify_tensor(next(iter(art.tensors))) == []


def test_duplicate_name_across_shards(sharded: Path) -> None:
    first = header_of(sharded / "model-00001-of-00003.ninfer")["tensors"][0]["name"]
    shard = sharded / "model-00002-of-00003.ninfer"
    rewrite_header(shard, lambda h: h["tensors"][0].update(name=first))
    _edit_index(
        sharded,
        lambda v: v["shards"][1].update(
            size=shard.stat().st_size, digest=shard.read_bytes()[32:48].hex()
        ),
    )
    with pytest.raises(ArtifactError, match=r"tensor also stored in model-00001-of-00003\.ninfer"):
        open_artifact(sharded)
