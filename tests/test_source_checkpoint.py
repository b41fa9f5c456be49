"""Source checkpoints: bit-exact reads of every dtype, shard-index cross-checks, HF cache lookup."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
from safetensors.torch import save_file

from ninfer_convert.errors import SourceError
from ninfer_convert.source import INDEX_NAME, open_source

# Edge words per float type: +-0, subnormal, normal, max, +-inf, quiet and signalling NaN with
# payloads and both signs.  Every one must come back bit-exactly.
BF16_WORDS = [
    0x0000,
    0x8000,
    0x0001,
    0x3F80,
    0x7F7F,
    0x7F80,
    0xFF80,
    0x7FC1,
    0x7F81,
    0xFFC0,
    0xFFFF,
]
F16_WORDS = [0x0000, 0x8000, 0x0001, 0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x7E01, 0x7C01, 0xFE00]
F32_WORDS = [
    0x00000000,
    0x80000000,
    0x00000001,
    0x3F800000,
    0x7F7FFFFF,
    0x7F800000,
    0xFF800000,
    0x7FC00001,
    0x7F800001,
    0xFFFFFFFF,
]


def _words_tensor(words: list[int], np_dtype: str, torch_dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.array(words, dtype=np_dtype)).view(torch_dtype)


CASES: list[tuple[str, torch.Tensor, str]] = [
    ("BF16", _words_tensor(BF16_WORDS, "<u2", torch.bfloat16), "<u2"),
    ("F16", _words_tensor(F16_WORDS, "<u2", torch.float16), "<u2"),
    ("F32", _words_tensor(F32_WORDS, "<u4", torch.float32), "<u4"),
    (
        "F64",
        _words_tensor([0, 1 << 63, 0x7FF0000000000001, 0x3FF0000000000000], "<u8", torch.float64),
        "<u8",
    ),
    ("F8_E4M3", torch.from_numpy(np.arange(256, dtype=np.uint8)).view(torch.float8_e4m3fn), "u1"),
    ("F8_E5M2", torch.from_numpy(np.arange(256, dtype=np.uint8)).view(torch.float8_e5m2), "u1"),
    ("U8", torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8), "u1"),
    ("I8", torch.tensor([-128, -1, 0, 127], dtype=torch.int8), "i1"),
    ("I16", torch.tensor([-(2**15), -1, 0, 2**15 - 1], dtype=torch.int16), "<i2"),
    ("I32", torch.tensor([-(2**31), -1, 0, 2**31 - 1], dtype=torch.int32), "<i4"),
    ("I64", torch.tensor([-(2**63), -1, 0, 2**63 - 1], dtype=torch.int64), "<i8"),
    ("BOOL", torch.tensor([True, False, True], dtype=torch.bool), "?"),
    ("U16", torch.tensor([0, 1, 2**16 - 1], dtype=torch.uint16), "<u2"),
    ("U32", torch.tensor([0, 1, 2**32 - 1], dtype=torch.uint32), "<u4"),
]


@pytest.mark.parametrize(("dtype", "tensor", "word"), CASES, ids=[c[0] for c in CASES])
def test_every_dtype_reads_bit_exactly(
    tmp_path: Path, dtype: str, tensor: torch.Tensor, word: str
) -> None:
    t = tensor.reshape(1, -1)
    path = tmp_path / "one.safetensors"
    save_file({"t": t, "pad": torch.zeros(3, dtype=torch.uint8)}, str(path))
    src = open_source(path)
    info = src.tensors["t"]
    assert (info.dtype, info.shape, info.file) == (dtype, tuple(t.shape), "one.safetensors")
    arr = src.read("t")
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    assert arr.words.dtype == np.dtype(word)
    assert arr.words.shape == tuple(t.shape)
    assert arr.words.tobytes() == raw  # bit for bit: NaN payloads, -0.0, signalling NaNs
    assert arr.digest == "xxh3-128:" + xxhash.xxh3_128(raw).hexdigest()
    assert not arr.words.flags.writeable  # a read-only view of the mapped file


def test_single_file_source(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"b": torch.ones(2), "a": torch.zeros(0, 4)}, str(path))
    src = open_source(str(path))
    assert src.kind == "safetensors-file"
    assert src.config is None and src.side_files == ()
    assert list(src.tensors) == ["a", "b"]  # sorted
    assert src.files == (("w.safetensors", path.stat().st_size),)
    empty = src.read("a")
    assert empty.words.shape == (0, 4)
    assert empty.digest == "xxh3-128:" + xxhash.xxh3_128(b"").hexdigest()


def test_directory_with_one_file_and_side_files(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2, 2, dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "chat_template.jinja",
        "README.md",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
        ".gitattributes",
    ):
        (tmp_path / name).write_text("x")
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "consolidated.00.pth").write_text("x")
    src = open_source(tmp_path)
    assert src.kind == "hf-dir"
    assert src.config == {"model_type": "llama"}
    assert [p.name for p in src.side_files] == [
        "README.md",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert src.read("w").words.tolist() == [[0x3F80, 0x3F80], [0x3F80, 0x3F80]]


def test_directory_without_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    save_file({"w": torch.ones(1)}, str(tmp_path / "consolidated.safetensors"))
    with pytest.raises(SourceError, match=r"found consolidated\.safetensors"):
        open_source(tmp_path)


def test_bad_config_json(tmp_path: Path) -> None:
    save_file({"w": torch.ones(1)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"a": 1, "a": 2}')
    with pytest.raises(SourceError, match="duplicate key"):
        open_source(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(SourceError, match="not a JSON object"):
        open_source(tmp_path)


def test_missing_path_and_wrong_suffix(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        open_source(tmp_path / "nope")
    other = tmp_path / "w.bin"
    other.write_bytes(b"x")
    with pytest.raises(SourceError, match=r"not a \.safetensors file"):
        open_source(other)


@pytest.mark.interop
def test_transformers_sharded_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="8KB")
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    src = open_source(tmp_path)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    assert [f for f, _ in src.files] == shards
    assert set(src.tensors) == set(index["weight_map"])
    state = model.state_dict()
    for name, info in src.tensors.items():
        assert info.file == index["weight_map"][name]
        want = state[name].contiguous().view(torch.uint16).numpy()
        assert np.array_equal(src.read(name).words, want)
    assert src.config is not None and src.config["model_type"] == "llama"
    assert "generation_config.json" in [p.name for p in src.side_files]


def _two_shards(root: Path) -> None:
    save_file({"a": torch.ones(2), "b": torch.ones(3)}, str(root / "s1.safetensors"))
    save_file({"c": torch.ones(4)}, str(root / "s2.safetensors"))


def _index(root: Path, weight_map: dict[str, str]) -> None:
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_consistent_index(tmp_path: Path) -> None:
    _two_shards(tmp_path)
    _index(tmp_path, {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"})
    src = open_source(tmp_path)
    assert {n: i.file for n, i in src.tensors.items()} == {
        "a": "s1.safetensors",
        "b": "s1.safetensors",
        "c": "s2.safetensors",
    }


def test_every_index_problem_reported_together(tmp_path: Path) -> None:
    _two_shards(tmp_path)
    save_file({"c": torch.ones(4), "d": torch.ones(1)}, str(tmp_path / "s3.safetensors"))
    _index(
        tmp_path,
        {
            "a": "s1.safetensors",  # fine
            # "b" is in s1 but not in the index
            "c": "s2.safetensors",  # also in s3: in two shards
            "d": "s3.safetensors",  # fine
            "e": "s1.safetensors",  # in the index, not in s1
            "f": "missing.safetensors",  # shard file missing
            "g": "../escape.safetensors",  # not a plain file name
        },
    )
    with pytest.raises(SourceError) as info:
        open_source(tmp_path)
    text = str(info.value)
    assert "5 problems" in text
    assert "tensor 'b' is in shard 's1.safetensors' but not in the index" in text
    assert "tensor 'c' is in more than one shard: s2.safetensors, s3.safetensors" in text
    assert "tensor 'e' is in the index (shard 's1.safetensors') but not in that shard" in text
    assert "shard file 'missing.safetensors' is missing" in text
    assert "'../escape.safetensors' is not a plain file name" in text
    assert INDEX_NAME in text


def test_index_points_to_wrong_shard(tmp_path: Path) -> None:
    _two_shards(tmp_path)
    _index(tmp_path, {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s1.safetensors"})
    with pytest.raises(SourceError) as info:
        open_source(tmp_path)
    assert "tensor 'c' is in the index (shard 's1.safetensors') but not in that shard" in str(
        info.value
    )


def test_corrupt_shard_reported_with_index_problems(tmp_path: Path) -> None:
    _two_shards(tmp_path)
    (tmp_path / "s2.safetensors").write_bytes(b"\x00" * 4)
    _index(
        tmp_path,
        {
            "a": "s1.safetensors",
            "b": "s1.safetensors",
            "c": "s2.safetensors",
            "z": "s1.safetensors",
        },
    )
    with pytest.raises(SourceError) as info:
        open_source(tmp_path)
    assert "too small" in str(info.value) and "'z'" in str(info.value)


def test_duplicate_tensor_in_index_json(tmp_path: Path) -> None:
    _two_shards(tmp_path)
    (tmp_path / INDEX_NAME).write_text(
        '{"weight_map": {"a": "s1.safetensors", "a": "s2.safetensors"}}'
    )
    with pytest.raises(SourceError, match="duplicate key 'a'"):
        open_source(tmp_path)


def test_bool_bytes_must_be_zero_or_one(tmp_path: Path) -> None:
    path = tmp_path / "b.safetensors"
    save_file({"m": torch.tensor([True, False, True])}, str(path))
    raw = bytearray(path.read_bytes())
    raw[-1] = 2
    path.write_bytes(bytes(raw))
    with pytest.raises(SourceError, match="BOOL element 2 holds byte 0x02"):
        open_source(path).read("m")


def test_read_unknown_and_changed_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(4)}, str(path))
    src = open_source(path)
    with pytest.raises(SourceError, match="no tensor named 'x'"):
        src.read("x")
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(SourceError, match="changed during conversion"):
        src.read("w")


def test_large_offsets_are_mapped_correctly(tmp_path: Path) -> None:
    # A tensor starting past the mmap allocation granularity exercises the aligned mapping.
    big = torch.arange(70_000, dtype=torch.int32)
    tail = torch.arange(5, dtype=torch.int32) - 2  # same dtype: stored after "a"
    path = tmp_path / "w.safetensors"
    save_file({"a": big, "z": tail}, str(path))
    src = open_source(path)
    assert src.tensors["z"].offset > 65536
    assert src.read("z").words.tolist() == [-2, -1, 0, 1, 2]
    assert np.array_equal(src.read("a").words, big.numpy())


# ---------------------------------------------------------------------------------------------
# Hugging Face cache (offline)


def _fake_cache(
    cache: Path,
    repo_id: str,
    files: dict[str, bytes],
    commit: str = "c0ffee" * 6 + "ab",
    ref: str = "main",
) -> Path:
    """Build the documented hub cache layout: blobs/, refs/<ref>, snapshots/<commit>/ symlinks."""
    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / ref).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        blob = repo / "blobs" / xxhash.xxh3_64(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return snap


def _model_files(tmp_path: Path) -> dict[str, bytes]:
    save_file({"w": torch.arange(4, dtype=torch.float32)}, str(tmp_path / "tmp.safetensors"))
    return {
        "model.safetensors": (tmp_path / "tmp.safetensors").read_bytes(),
        "config.json": b'{"model_type": "llama"}',
        "tokenizer.json": b"{}",
    }


def test_repo_id_found_in_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snap = _fake_cache(cache, "acme/tiny", _model_files(tmp_path))
    src = open_source("acme/tiny", cache_dir=cache)
    assert src.kind == "hf-dir" and str(src.path) == "acme/tiny"
    assert src.config == {"model_type": "llama"}
    assert src.read("w").words.tolist() == [0, 0x3F800000, 0x40000000, 0x40400000]
    assert [p.name for p in src.side_files] == ["config.json", "tokenizer.json"]
    assert src.side_files[0].path.parent == snap


def test_cache_snapshot_folder_given_as_a_path_keeps_its_side_files(tmp_path: Path) -> None:
    """What snapshot_download returns: its files are symlinks into ../../blobs, which bound
    them as for a repo id (they were refused as symlinks outside the source)."""
    snap = _fake_cache(tmp_path / "hub", "acme/tiny", _model_files(tmp_path))
    for path in (snap, Path(os.path.relpath(snap))):
        src = open_source(path)
        assert [p.name for p in src.side_files] == ["config.json", "tokenizer.json"]
    # Only a real cache layout is widened: outside it, a link out of the folder is refused.
    (tmp_path / "outside.json").write_text("{}")
    os.symlink(tmp_path / "outside.json", snap / "extra.json")
    with pytest.raises(SourceError, match=r"extra\.json: a symlink"):
        open_source(snap)


def test_repo_id_with_revision(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    _fake_cache(cache, "acme/tiny", _model_files(tmp_path), ref="v1")
    assert "w" in open_source("acme/tiny@v1", cache_dir=cache).tensors
    with pytest.raises(SourceError, match=r"not .*present"):
        open_source("acme/tiny", cache_dir=cache)  # no refs/main


def test_repo_id_uses_hub_default_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    _fake_cache(cache, "acme/tiny", _model_files(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert "w" in open_source("acme/tiny").tensors


def test_repo_id_not_cached(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as info:
        open_source("acme/absent", cache_dir=tmp_path / "empty")
    text = str(info.value)
    assert "'acme/absent' is not a local path and is not (completely) present" in text
    assert "never downloads" in text


def test_local_path_wins_over_repo_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme" / "tiny").mkdir(parents=True)
    save_file({"local": torch.ones(1)}, str(tmp_path / "acme" / "tiny" / "model.safetensors"))
    assert "local" in open_source("acme/tiny", cache_dir=tmp_path / "empty").tensors


@pytest.mark.parametrize("words", [1, 3, 32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 40_000])
def test_read_is_bit_exact_on_both_sides_of_the_small_read_limit(
    tmp_path: Path, words: int
) -> None:
    # Up to SMALL_READ_BYTES a tensor is read with pread, above it mapped: both give the same
    # read-only words and digest, at any offset (the odd pad shifts it off every alignment).
    from ninfer_convert.source.checkpoint import SMALL_READ_BYTES

    rng = np.random.default_rng(words)
    values = rng.integers(0, 1 << 16, size=words, dtype=np.uint16)
    values[:2] = [0x7FC1, 0x8000][: min(words, 2)]  # a NaN payload and -0.0
    t = torch.from_numpy(values.view(np.int16).copy()).view(torch.bfloat16)
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(3, dtype=torch.uint8), "t": t}, str(path))
    arr = open_source(path).read("t")
    root: object = arr.words
    while isinstance(root, np.ndarray):
        root = root.base
    if isinstance(root, memoryview):
        root = root.obj
    assert isinstance(root, bytes if words * 2 <= SMALL_READ_BYTES else mmap.mmap)
    assert arr.words.dtype == np.uint16
    assert arr.words.tobytes() == values.tobytes()
    assert arr.digest == "xxh3-128:" + xxhash.xxh3_128(values.tobytes()).hexdigest()
    assert not arr.words.flags.writeable


def test_small_read_of_a_file_truncated_after_its_size_check_is_a_source_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The file passes the size check, then shrinks before the pread: a typed error naming the
    # file and tensor, not a reshape ValueError on the short buffer.
    from ninfer_convert.source import checkpoint

    path = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(64)}, str(path))
    src = open_source(path)
    real_fstat, inode = os.fstat, path.stat().st_ino

    def fstat_then_truncate(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        if st.st_ino == inode:
            os.truncate(path, st.st_size - 8)
        return st

    monkeypatch.setattr(checkpoint.os, "fstat", fstat_then_truncate)
    with pytest.raises(SourceError, match=r"short read: 248 of 256 bytes") as info:
        src.read("w")
    assert info.value.tensor == "w"


def _fds_on(path: Path) -> int:
    """Descriptors of this process open on ``path``."""
    target = os.path.realpath(path)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed meanwhile
            count += os.readlink(f"/proc/self/fd/{fd}") == target
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_reads_share_one_descriptor_per_file_until_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "w.safetensors"
    save_file({f"t{i}": torch.full((3,), float(i)) for i in range(5)}, str(path))
    src = open_source(path)
    opened: list[object] = []
    real_open = os.open

    def counting_open(p: object, *args: object, **kwargs: object) -> int:
        opened.append(p)
        return real_open(p, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting_open)
    for i in range(5):
        assert src.read(f"t{i}").words.view(np.float32).tolist() == [float(i)] * 3
    assert opened == [path] and _fds_on(path) == 1
    src.close()
    assert _fds_on(path) == 0
    assert src.read("t1").words.view(np.float32).tolist() == [1.0] * 3  # reopened
    del src  # collecting the source closes what it opened
    assert _fds_on(path) == 0


def test_a_shared_descriptor_still_sees_the_file_change(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(4), "b": torch.zeros(4)}, str(path))
    src = open_source(path)
    src.read("a")  # the file is open now
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(SourceError, match="changed during conversion"):
        src.read("b")


def _sharded_source(root: Path, count: int) -> Path:
    """A model directory of ``count`` weight files, one small tensor each."""
    root.mkdir()
    weight_map = {}
    for i in range(count):
        file = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        save_file({f"t{i}": torch.full((4,), float(i))}, str(root / file))
        weight_map[f"t{i}"] = file
    (root / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_reads_of_more_weight_files_than_the_descriptor_limit_allow_succeed(
    tmp_path: Path,
) -> None:
    # A checkpoint of hundreds of weight files under a small `ulimit -n` (256 is macOS's
    # default): the shared descriptors stay bounded in number, so every read succeeds.
    resource = pytest.importorskip("resource")
    from ninfer_convert.source.checkpoint import MAX_OPEN_WEIGHT_FILES

    root = _sharded_source(tmp_path / "m", 3 * MAX_OPEN_WEIGHT_FILES)
    src = open_source(root)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + MAX_OPEN_WEIGHT_FILES + 8, hard))
    try:
        for i in range(3 * MAX_OPEN_WEIGHT_FILES):
            assert src.read(f"t{i}").words.view(np.float32).tolist() == [float(i)] * 4
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    held = sum(_fds_on(root / f) for f, _ in src.files)
    assert 1 <= held <= MAX_OPEN_WEIGHT_FILES
    src.close()
    assert sum(_fds_on(root / f) for f, _ in src.files) == 0


def test_close_during_a_read_leaves_that_read_its_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # close() (an interrupted run unwinding) while a worker thread is inside its pread: the
    # descriptor must not be closed under that read (its number could be reused by another
    # file meanwhile); it is closed when the read is done.
    from ninfer_convert.source import checkpoint

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(4), "b": torch.zeros(4)}, str(path))
    src = open_source(path)
    real_pread = os.pread

    def pread_closing(fd: int, n: int, offset: int) -> bytes:
        src.close()
        return real_pread(fd, n, offset)

    monkeypatch.setattr(checkpoint.os, "pread", pread_closing)
    assert src.read("a").words.view(np.float32).tolist() == [1.0] * 4
    monkeypatch.undo()
    if os.path.isdir("/proc/self/fd"):
        assert _fds_on(path) == 0
    assert src.read("b").words.view(np.float32).tolist() == [0.0] * 4  # opened again


def test_a_descriptor_evicted_while_in_use_stays_open_until_its_read_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With one shared descriptor, a read of another file from inside a read evicts the first
    # file's descriptor: the first read must still complete on it.
    from ninfer_convert.source import checkpoint

    root = _sharded_source(tmp_path / "m", 3)
    monkeypatch.setattr(checkpoint, "MAX_OPEN_WEIGHT_FILES", 1)
    src = open_source(root)
    real_pread = os.pread
    nested: list[list[float]] = []
    started: list[bool] = []

    def pread_reading_another(fd: int, n: int, offset: int) -> bytes:
        if not started:
            started.append(True)
            nested.append(src.read("t1").words.view(np.float32).tolist())
            nested.append(src.read("t2").words.view(np.float32).tolist())
        return real_pread(fd, n, offset)

    monkeypatch.setattr(checkpoint.os, "pread", pread_reading_another)
    assert src.read("t0").words.view(np.float32).tolist() == [0.0] * 4
    assert nested == [[1.0] * 4, [2.0] * 4]
    monkeypatch.undo()
    if os.path.isdir("/proc/self/fd"):
        assert sum(_fds_on(root / f) for f, _ in src.files) <= 1
