"""GPTQ compensation factors under bounded memory: a plan entry holds a FactorRef (shape and
digest), the factor is read again for its tensor and checked against that digest (a factor
file changed during the run is an EncodeError naming the tensor and the file), the side file
is written streaming (ArtifactWriter.add_stream: exact size, digest on the way) with the same
bytes as before, and verify reads it in parts (Artifact.check_side_file, read_side_range)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from artifact_fixtures import META, make_logical, provenance
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert import open_artifact
from ninfer_convert.container import ArtifactWriter
from ninfer_convert.container.wire import digest_hex
from ninfer_convert.convert import convert_checkpoint, plan_conversion
from ninfer_convert.derive import derive_packed
from ninfer_convert.errors import EncodeError, IntegrityError, UsageError
from ninfer_convert.factors import (
    FACTOR_FILE,
    FactorFile,
    FactorRef,
    factor_bytes,
    factor_digest,
    generated_files,
    write_factor_file,
)
from ninfer_convert.importance import write_importance_file
from ninfer_convert.verify import verify_artifact

K = 200
NAMES = ("a", "b", "c")


def _factor(seed: int, block: int = 128) -> np.ndarray:
    """A valid [K, block] factor: positive diagonal, +0 below it and past each block's end."""
    rng = np.random.default_rng(seed)
    f = np.zeros((K, block), np.float32)
    for r0 in range(0, K, block):
        w = min(block, K - r0)
        part = np.triu(rng.uniform(-0.2, 0.2, (w, w)).astype(np.float32), 1)
        part[np.arange(w), np.arange(w)] = rng.uniform(0.5, 2.0, w).astype(np.float32)
        f[r0 : r0 + w, :w] = part
    return f.view(np.uint32)


def _inputs(tmp: Path) -> tuple[Path, Path, Path, Path]:
    src = tmp / "src"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    rng = np.random.default_rng(4)
    words = {
        n: ("BF16", (rng.standard_normal((6, K)).astype(np.float32).view(np.uint32) >> 16)
            .astype(np.uint16))
        for n in NAMES
    }  # fmt: skip
    write_safetensors(src / "model.safetensors", words)
    imp, fac = tmp / "imp.safetensors", tmp / "fac.safetensors"
    weights = rng.lognormal(0, 1, K).astype(np.float32).view(np.uint32)
    write_importance_file(imp, dict.fromkeys(NAMES, weights))
    write_factor_file(fac, {n: _factor(i, 128 * (1 + i % 2)) for i, n in enumerate(NAMES)})
    recipe = tmp / "r.yaml"
    recipe.write_text(
        RECIPE_HEAD + "- match: 're:[abc]'\n  format: Q4G64_F16S\n"
        "  encoder_profile: GPTQ_F16_SEARCH_IW_V1\n  role: r\n  evidence: [e1]\n"
    )
    return src, recipe, imp, fac


def test_the_plan_holds_references_and_the_side_file_bytes_are_unchanged(tmp_path: Path) -> None:
    src, recipe, imp, fac = _inputs(tmp_path)
    _, plan = plan_conversion(src, recipe, importance=imp, factors=fac)
    factors = {n: _factor(i, 128 * (1 + i % 2)) for i, n in enumerate(NAMES)}
    for e in plan.entries:
        ref = e.factor
        assert isinstance(ref, FactorRef) and isinstance(ref.store, FactorFile)
        assert ref.digest == factor_digest(factors[e.output])
        assert ref.shape == factors[e.output].shape and ref.block == ref.shape[1]
        assert ref.words().tobytes() == factors[e.output].tobytes()
    [(_, size, chunks)] = [g for g in generated_files(plan) if g[0] == FACTOR_FILE]
    data = b"".join(bytes(c) for c in chunks())
    assert data == factor_bytes(factors) and size == len(data)
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", importance=imp, factors=fac)
    assert (out / FACTOR_FILE).read_bytes() == factor_bytes(factors)
    with open_artifact(out) as art:
        assert art.side_files[FACTOR_FILE].digest == digest_hex(factor_bytes(factors))
    report = verify_artifact(out, device="cpu", oracle_groups=4)
    assert report.exit_code == 0, report


def test_a_factor_file_edited_after_it_was_checked_is_an_encode_error(tmp_path: Path) -> None:
    """Attach checked and digested the factor; the file then changes in place (same size,
    another valid factor): encoding the tensor and writing the side file both refuse."""
    src, recipe, imp, fac = _inputs(tmp_path)
    opened, plan = plan_conversion(src, recipe, importance=imp, factors=fac)
    other = factor_bytes({n: _factor(9 + i, 128 * (1 + i % 2)) for i, n in enumerate(NAMES)})
    assert len(other) == fac.stat().st_size
    with open(fac, "r+b") as f:  # in place: the open factor file reads the new bytes
        f.write(other)
    entry = next(e for e in plan.entries if e.output == "b")
    with pytest.raises(EncodeError, match="changed after it was checked") as exc:
        derive_packed(entry, opened, device="cpu")
    assert exc.value.tensor == "b" and exc.value.path == str(fac)
    [(_, _, chunks)] = [g for g in generated_files(plan) if g[0] == FACTOR_FILE]
    with pytest.raises(EncodeError, match="tensor a: the compensation factor 'a' changed"):
        b"".join(bytes(c) for c in chunks())


def test_convert_refuses_a_factor_that_changes_during_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, recipe, imp, fac = _inputs(tmp_path)
    reads: list[str] = []
    original = FactorFile.__getitem__

    def changing(self: FactorFile, name: str) -> np.ndarray:
        reads.append(name)
        words = original(self, name)
        if reads.count(name) == 1:
            return words  # the read attach checks
        changed = words.copy()
        changed[0, 0] = np.float32(3.0).view(np.uint32)  # still a valid factor
        return changed

    monkeypatch.setattr(FactorFile, "__getitem__", changing)
    with pytest.raises(EncodeError, match="changed after it was checked") as exc:
        convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", importance=imp,
                           factors=fac)  # fmt: skip
    assert exc.value.tensor in NAMES and exc.value.path == str(fac)
    assert not (tmp_path / "out").exists()
    assert sorted(reads[:3]) == sorted(NAMES)  # attach read each once before any encode


def test_add_stream_writes_exactly_the_declared_size(tmp_path: Path) -> None:
    body = [b"abc", memoryview(bytearray(b"defgh")), b"", b"ij"]
    whole = b"abcdefghij"
    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        w.add("n", "BF16", make_logical("BF16", (4,)), role="norm", provenance=provenance("BF16"))
        info = w.add_stream("gen/side.bin", len(whole), iter(body))
        assert (info.name, info.size, info.digest) == ("gen/side.bin", 10, digest_hex(whole))
        with pytest.raises(UsageError, match="added twice"):
            w.add_stream("gen/side.bin", 0, [])
        with pytest.raises(UsageError, match="11 bytes were declared but the chunks hold 10"):
            w.add_stream("short.bin", 11, iter(body))
        with pytest.raises(UsageError, match="9 bytes were declared but the chunks hold more"):
            w.add_stream("long.bin", 9, iter(body))
    assert (tmp_path / "m" / "gen" / "side.bin").read_bytes() == whole
    with open_artifact(tmp_path / "m") as art:
        assert sorted(art.side_files) == ["gen/side.bin"]
        assert art.read_side_file("gen/side.bin") == whole


def test_add_stream_stops_reading_chunks_past_the_declared_size(tmp_path: Path) -> None:
    pulled: list[int] = []

    def chunks() -> object:
        for i in range(100):
            pulled.append(i)
            yield b"x" * 4

    with ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w:
        w.add("n", "BF16", make_logical("BF16", (4,)), role="norm", provenance=provenance("BF16"))
        with pytest.raises(UsageError, match="hold more"):
            w.add_stream("x.bin", 10, chunks())  # type: ignore[arg-type]
        w.abort()
    assert pulled == [0, 1, 2]


def test_side_file_ranges_are_read_through_the_pinned_descriptor(tmp_path: Path) -> None:
    src, recipe, imp, fac = _inputs(tmp_path)
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", importance=imp, factors=fac)
    data = (out / FACTOR_FILE).read_bytes()
    with open_artifact(out) as art:
        art.check_side_file(FACTOR_FILE)
        assert art.read_side_range(FACTOR_FILE, 5, 300) == data[5:305]
        assert art.read_side_range(FACTOR_FILE, len(data) - 3, 3) == data[-3:]
        with pytest.raises(UsageError, match="outside the side file"):
            art.read_side_range(FACTOR_FILE, len(data) - 3, 4)
        with pytest.raises(UsageError, match="no side file"):
            art.check_side_file("nope.bin")
        with open(out / FACTOR_FILE, "r+b") as f:  # the same file, edited and truncated
            f.seek(100)
            f.write(b"\xff")
            f.truncate(len(data) - 8)
        with pytest.raises(IntegrityError, match="digest"):
            art.check_side_file(FACTOR_FILE)
        with pytest.raises(IntegrityError, match="before its recorded"):
            art.read_side_range(FACTOR_FILE, len(data) - 16, 16)


def test_verify_reads_each_stored_factor_without_the_whole_side_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The side file is digest-checked in chunks and its factors are read one entry at a
    time: read_side_file (the whole file in memory) is never called for it."""
    from ninfer_convert.container.artifact import Artifact

    src, recipe, imp, fac = _inputs(tmp_path)
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", importance=imp, factors=fac)
    whole: list[str] = []
    ranges: list[int] = []
    read_file, read_range = Artifact.read_side_file, Artifact.read_side_range

    def spy_file(self: Artifact, name: str) -> bytes:
        whole.append(name)
        return read_file(self, name)

    def spy_range(self: Artifact, name: str, offset: int, size: int) -> bytes:
        ranges.append(size)
        return read_range(self, name, offset, size)

    monkeypatch.setattr(Artifact, "read_side_file", spy_file)
    monkeypatch.setattr(Artifact, "read_side_range", spy_range)
    report = verify_artifact(out, device="cpu", oracle_groups=4)
    assert report.exit_code == 0, report
    assert FACTOR_FILE not in whole
    biggest = 4 * K * 256
    assert ranges and max(ranges) <= biggest < (out / FACTOR_FILE).stat().st_size


def _findings(out: Path) -> list[tuple[str, str | None, str]]:
    report = verify_artifact(out, device="cpu", oracle_groups=0)
    return sorted((f.check, f.tensor, f.message) for f in report.findings)


def test_verify_findings_of_an_edited_side_file_name_the_tensor(tmp_path: Path) -> None:
    """An entry's bytes edited (the side file's digest now fails): one integrity finding for
    the side file, and the stored factors cannot be used (source-words, naming the first
    compensated tensor); the same findings as when verify read the side file whole."""
    src, recipe, imp, fac = _inputs(tmp_path)
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", importance=imp, factors=fac)
    data = bytearray((out / FACTOR_FILE).read_bytes())
    data[-4] ^= 1  # the last word of entry c: a +0 word made a subnormal below the diagonal
    (out / FACTOR_FILE).write_bytes(bytes(data))
    found = _findings(out)
    assert [(c, t) for c, t, _ in found] == [("integrity", None), ("source-words", "a")], found
    assert "compensation.safetensors" in found[0][2] and "digest" in found[0][2]
    assert "cannot be used" in found[1][2]


def test_plan_entries_pickle_with_references_not_words(tmp_path: Path) -> None:
    """convert --ray ships the plan's entries to its shard tasks (ray.put): a FactorRef
    travels as the factor file's path, its entry, shape and digest, and reads the words there."""
    import pickle

    src, recipe, imp, fac = _inputs(tmp_path)
    _, plan = plan_conversion(src, recipe, importance=imp, factors=fac)
    data = pickle.dumps(list(plan.entries))
    assert len(data) < 4 * K * 128  # less than the smallest factor: no words travel
    for before, after in zip(plan.entries, pickle.loads(data), strict=True):
        assert after.factor == before.factor and isinstance(after.factor.store, FactorFile)
        assert after.factor.words().tobytes() == before.factor.words().tobytes()


def test_a_factor_file_named_by_a_relative_path_unpickles_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """convert --ray's shard tasks run in another working directory than the driver: a factor
    file given as a relative path (``--factors fac.safetensors``) must travel as the path it
    names, not as the relative text (which the task would resolve against its own directory)."""
    import pickle

    src, recipe, imp, fac = _inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    _, plan = plan_conversion(src, recipe, importance=imp, factors=Path(fac.name))
    data = pickle.dumps(list(plan.entries))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for before, after in zip(plan.entries, pickle.loads(data), strict=True):
        assert after.factor.words().tobytes() == before.factor.words().tobytes()


def test_a_side_file_truncated_during_verify_is_a_finding_not_an_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The factor side file passes its digest check, then shrinks before its entries are read
    one at a time: verify reports it (an integrity finding naming the side file), it does not
    stop with the IntegrityError of the read."""
    import os

    from ninfer_convert.container.artifact import Artifact

    src, recipe, imp, fac = _inputs(tmp_path)
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", importance=imp, factors=fac)
    check = Artifact.check_side_file

    def check_then_truncate(self: Artifact, name: str) -> None:
        check(self, name)
        os.truncate(out / name, (out / name).stat().st_size - 5000)

    monkeypatch.setattr(Artifact, "check_side_file", check_then_truncate)
    report = verify_artifact(out, device="cpu", oracle_groups=0)
    assert report.exit_code != 0
    found = [(f.check, f.message) for f in report.findings]
    assert any(c == "integrity" and "before its recorded" in m for c, m in found), found
