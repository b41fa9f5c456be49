"""Batches of small tensors (one worker task per run of small entries, in convert and verify)
under failure: a failing or interrupted middle entry is reported under its own name and
leaves nothing published; a tensor altered inside a batch is the one verify names; mixed
small and large tensors give the same bytes for any ``jobs``."""

from __future__ import annotations

import gc
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from st_helpers import write_safetensors
from verify_fixtures import patch_bytes, plane_offset

from ninfer_convert import convert_tensors as loop_module
from ninfer_convert.cli import main
from ninfer_convert.container import open_artifact
from ninfer_convert.convert import convert_checkpoint, plan_conversion
from ninfer_convert.errors import EncodeError
from ninfer_convert.scheduler import batches
from ninfer_convert.verify import runner as runner_module
from ninfer_convert.verify import verify_artifact

RECIPE = """\
ninfer_recipe: 1
name: batches
version: "1"
source:
  model_type: [llama]
evidence:
  - id: e1
    citation: test
    summary: batch tests only
rules:
  - match: re:.*_s
    format: BF16
    role: weight
  - match: re:.*_h
    format: BF16
    conversion: f16-to-bf16-rne
    role: weight
    evidence: [e1]
  - match: re:.*_q
    format: Q4G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: weight
    evidence: [e1]
"""

# Plan order: small entries, a large grouped one, small ones (a conversion and a small grouped
# one among them), a large copy, small ones.  Every "large" entry is above the 256 KiB
# small-entry bound, so the plan has multi-entry batches with single large tasks between.
SHAPES: dict[str, tuple[str, tuple[int, ...]]] = {
    "t00_s": ("BF16", (4, 16)), "t01_s": ("BF16", (3, 5)), "t02_q": ("BF16", (2, 64)),
    "t03_s": ("BF16", (1,)), "t04_q": ("BF16", (512, 1024)), "t05_s": ("BF16", (7, 9)),
    "t06_h": ("F16", (4, 33)), "t07_s": ("BF16", (5, 8)), "t08_q": ("F16", (3, 128)),
    "t09_s": ("BF16", (2, 2)), "t10_s": ("BF16", (256, 1024)), "t11_s": ("BF16", (6,)),
    "t12_h": ("F16", (2, 3)),
}  # fmt: skip
MIDDLE = "t07_s"  # inside the second batch, neither its first nor its last entry


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("batches")
    src = root / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rng = np.random.default_rng(11)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for name, (dtype, shape) in SHAPES.items():
        values = rng.standard_normal(shape).astype(np.float32)
        if dtype == "BF16":
            tensors[name] = (dtype, (values.view(np.uint32) >> 16).astype("<u2"))
        else:
            tensors[name] = (dtype, values.astype("<f2"))
    write_safetensors(src / "model.safetensors", tensors)
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE)
    return src, recipe


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_plan_has_batches_around_large_entries(source: tuple[Path, Path]) -> None:
    _, plan = plan_conversion(*source)
    runs = [[e.output for e in b.items] for b in batches(plan.entries, lambda e: e.source_bytes)]
    assert runs == [
        ["t00_s", "t01_s", "t02_q", "t03_s"], ["t04_q"],
        ["t05_s", "t06_h", "t07_s", "t08_q", "t09_s"], ["t10_s"], ["t11_s", "t12_h"],
    ]  # fmt: skip


def test_mixed_small_and_large_same_bytes_for_jobs_1_and_2(
    tmp_path: Path, source: tuple[Path, Path]
) -> None:
    convert_checkpoint(*source, tmp_path / "j1", device="cpu", jobs=1)
    convert_checkpoint(*source, tmp_path / "j2", device="cpu", jobs=2)
    convert_checkpoint(*source, tmp_path / "j3", device="cpu", jobs=3)
    assert _files(tmp_path / "j1") == _files(tmp_path / "j2") == _files(tmp_path / "j3")
    with open_artifact(tmp_path / "j2") as art:
        assert list(art.tensors) == list(SHAPES)


def _fail_at(monkeypatch: pytest.MonkeyPatch, name: str, action: Any) -> list[str]:
    real = loop_module.derive_into
    seen: list[str] = []

    def derive(entry: Any, *args: Any, **kw: Any) -> Any:
        seen.append(entry.output)
        if entry.output == name:
            action(entry)
        return real(entry, *args, **kw)

    monkeypatch.setattr(loop_module, "derive_into", derive)
    return seen


@pytest.mark.parametrize("jobs", [1, 2])
def test_failing_middle_entry_of_a_batch_is_named_and_nothing_published(
    tmp_path: Path, source: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    def fail(entry: Any) -> None:
        raise EncodeError("injected failure", tensor=entry.output)

    seen = _fail_at(monkeypatch, MIDDLE, fail)
    out = tmp_path / "models" / "out"
    out.parent.mkdir()
    with pytest.raises(EncodeError) as info:
        convert_checkpoint(*source, out, device="cpu", jobs=jobs)
    assert info.value.tensor == MIDDLE
    assert MIDDLE in str(info.value)
    assert _leftovers(out.parent) == []  # no output, no staging folder, no lock
    # The batch stopped at the failing entry: its later entries were never derived.
    assert "t08_q" not in seen[seen.index(MIDDLE) :]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_a_batch_leaves_nothing(
    tmp_path: Path,
    source: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sig: signal.Signals,
) -> None:
    def interrupt(entry: Any) -> None:
        os.kill(os.getpid(), sig)  # delivered to the main thread, waiting on this batch

    _fail_at(monkeypatch, MIDDLE, interrupt)
    out = tmp_path / "models" / "out"
    out.parent.mkdir()
    src, recipe = source
    code = main(["convert", str(src), "--recipe", str(recipe), "--output", str(out),
                 "--device", "cpu", "--jobs", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 128 + sig, err
    assert f"Interrupted ({sig.name}); nothing was written." in err
    assert "Traceback" not in err
    assert _leftovers(out.parent) == []


@pytest.mark.parametrize(("tensor", "plane"), [(MIDDLE, None), ("t08_q", "codes")])
def test_verify_names_the_tensor_altered_inside_a_batch(
    tmp_path: Path, source: tuple[Path, Path], tensor: str, plane: str | None
) -> None:
    out = tmp_path / "out"
    convert_checkpoint(*source, out, device="cpu", jobs=2)
    with open_artifact(out) as art:
        planes = [p.name for p in art.tensors[tensor].planes]
    path, offset, _ = plane_offset(out, tensor, plane or planes[0])

    def edit(file: Path, data: bytearray) -> None:
        if file == path:
            data[offset + 1] ^= 0x10

    patch_bytes(out, edit)  # digests recomputed: only the comparison with the source can tell
    report = verify_artifact(out, source=source[0], jobs=2)
    named = {f.tensor for f in report.findings}
    assert named == {tensor}, [(f.check, f.tensor, f.message) for f in report.findings]


def test_no_cyclic_garbage_per_tensor_while_the_collector_is_paused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Convert and verify pause the cyclic collector in their tensor loops (paused_gc): any
    # cycle made per tensor would pile up until the loop ends, so memory would follow the
    # model.  A collection run by hand when the loop reaches its last tensor counts what
    # piled up, on the paths a loop takes per tensor: direct, conversion, grouped, verify's
    # match, its mismatch (altered bytes, digests valid) and its integrity failure.
    n = 120
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rng = np.random.default_rng(5)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for i in range(n):
        values = rng.standard_normal((2, 64)).astype(np.float32)
        if i % 3 == 2:
            tensors[f"t{i:04d}_h"] = ("F16", values.astype("<f2"))
        else:
            words = (values.view(np.uint32) >> 16).astype("<u2")
            tensors[f"t{i:04d}_{'sq'[i % 3]}"] = ("BF16", words)
    write_safetensors(src / "model.safetensors", tensors)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    out = tmp_path / "out"
    last = sorted(tensors)[-1]
    found: list[int] = []

    def collect_at_last(real: Any, name_of: Any) -> Any:
        def wrapped(*args: Any, **kw: Any) -> Any:
            if name_of(args) == last:
                assert not gc.isenabled()  # the loop's pause is what this test is about
                found.append(gc.collect())
            return real(*args, **kw)

        return wrapped

    real_derive = loop_module.derive_into
    monkeypatch.setattr(loop_module, "derive_into",
                        collect_at_last(real_derive, lambda a: a[0].output))  # fmt: skip
    gc.collect()
    convert_checkpoint(src, recipe, out, device="cpu", jobs=2)
    monkeypatch.setattr(loop_module, "derive_into", real_derive)
    real_check = runner_module.check_tensor
    monkeypatch.setattr(runner_module, "check_tensor",
                        collect_at_last(real_check, lambda a: a[1]))  # fmt: skip

    with open_artifact(out) as art:
        altered = [(art.tensors[t].file, art.tensors[t].planes[0].offset)
                   for t in sorted(tensors)[::4]]  # fmt: skip

    def edit(file: Path, data: bytearray) -> None:
        for f, offset in altered:
            if f == file:
                data[offset + 1] ^= 0x10

    verify_artifact(out, source=src, jobs=2)  # every tensor matches
    patch_bytes(out, edit)
    report = verify_artifact(out, source=src, jobs=2)
    assert len({f.tensor for f in report.findings}) == len(altered)
    for f, offset in altered:
        with open(f, "r+b") as fh:
            fh.seek(offset + 2)
            byte = fh.read(1)
            fh.seek(offset + 2)
            fh.write(bytes([byte[0] ^ 1]))
    report = verify_artifact(out, source=src, jobs=2)
    assert {f.check for f in report.findings} >= {"integrity"}
    assert len(found) == 4
    assert max(found) < n // 4, found


def test_small_source_with_planes_over_256_kib_is_not_held_in_a_run_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch entry is small by its source bytes; its planes may be far larger (U8 -> I32:
    four times; NVFP4's padded scales: fifteen).  Such a tensor is reserved alone, through
    the file's mapped pages as docs/container.md section 8 says, not in a run's buffer in
    process memory (64 batches in flight held about 0.5 GB that way)."""
    from ninfer_convert.container import writer as writer_module

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    rng = np.random.default_rng(5)
    tensors = {
        "a_s": ("BF16", rng.integers(0, 1 << 16, (3,), dtype=np.uint16)),
        "b_i": ("U8", rng.integers(0, 256, (100 << 10,), dtype=np.uint8)),  # 400 KiB of I32
        "c_s": ("BF16", rng.integers(0, 1 << 16, (5,), dtype=np.uint16)),
        "d_i": ("U8", rng.integers(0, 256, (70 << 10,), dtype=np.uint8)),
        "e_i": ("U8", rng.integers(0, 256, (9,), dtype=np.uint8)),
        "f_h": ("F16", rng.standard_normal((2, 3)).astype("<f2")),
        "g_q": ("F16", rng.standard_normal((1, 64)).astype("<f2")),
    }
    write_safetensors(src / "model.safetensors", tensors)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE + "  - match: re:.*_i\n    format: I32\n    conversion: int-to-i32\n"
                      "    role: weight\n")  # fmt: skip
    _, plan = plan_conversion(src, recipe)
    assert len(list(batches(plan.entries, lambda e: e.source_bytes))) == 1  # one batch
    in_runs: list[int] = []
    real_run = writer_module.ArtifactWriter.reserve_run

    def spy(self: Any, todo: Any) -> Any:
        run = real_run(self, todo)
        in_runs.extend(run.sizes)
        return run

    monkeypatch.setattr(writer_module.ArtifactWriter, "reserve_run", spy)
    for jobs in (1, 2):
        out = tmp_path / f"out{jobs}"
        convert_checkpoint(src, recipe, out, device="cpu", jobs=jobs)
        with open_artifact(out) as art:
            assert list(art.tensors) == sorted(tensors)
            for name, (_dtype, words) in tensors.items():
                if name.endswith("_i"):
                    stored = bytes(art.plane_buffer(name, "words"))
                    assert stored == words.astype("<i4").tobytes(), name
    assert in_runs and max(in_runs) <= 256 << 10, in_runs
    assert _files(tmp_path / "out1") == _files(tmp_path / "out2")
