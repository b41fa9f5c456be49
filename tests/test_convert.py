"""End-to-end conversion: the committed example, a transformers-made sharded checkpoint,
determinism, sharding, crash safety and error reporting of ``ninfer convert``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from st_helpers import write_safetensors

from ninfer_convert import encode_grouped_words, open_artifact
from ninfer_convert.cli import main
from ninfer_convert.convert import convert_checkpoint, plan_conversion
from ninfer_convert.errors import EncodeError, NinferError, SourceError, UsageError
from ninfer_convert.logical import DirectWords, GroupedCodes
from ninfer_convert.source import open_source

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-qwen3.5"
QWEN_RECIPE = ROOT / "recipes" / "qwen3.6-27b.yaml"
GENERIC_RECIPE = ROOT / "recipes" / "generic-dense.yaml"


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def example_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conv") / "tiny.ninfer.d"
    convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu", jobs=2)
    return out


def test_example_converts_and_every_tensor_matches_its_source(example_artifact: Path) -> None:
    source = open_source(EXAMPLE)
    _, plan = plan_conversion(source, QWEN_RECIPE)
    names = {p.name for p in example_artifact.iterdir()}
    assert {"config.json", "generation_config.json", "model.ninfer"} <= names
    with open_artifact(example_artifact) as art:
        assert set(art.tensors) == {e.output for e in plan.entries}
        formats = set()
        for entry in plan.entries:
            stored = art.read(entry.output)
            formats.add(entry.format)
            src = source.read(entry.sources[0].name)
            if isinstance(stored, GroupedCodes):
                want = encode_grouped_words(
                    np.ascontiguousarray(src.words), src.dtype, entry.format
                )
                assert np.array_equal(stored.codes, want.codes), entry.output
                assert np.array_equal(stored.scales, want.scales), entry.output
            else:
                assert isinstance(stored, DirectWords)
                if entry.conversion is None:
                    assert stored.words.tobytes() == np.ascontiguousarray(src.words).tobytes()
            info = art.tensors[entry.output]
            assert info.provenance["rule"]["line"] == entry.rule.line
            assert info.role == entry.role
        meta = art.metadata
        assert meta["recipe"]["text"] == QWEN_RECIPE.read_text()
        assert set(meta["source"]["tensors"]) == set(source.tensors)
        assert {"Q4G64_F16S", "W8G32_F16S", "BF16"} <= formats


def test_output_is_byte_identical_for_any_jobs_and_run(
    tmp_path: Path, example_artifact: Path
) -> None:
    again = tmp_path / "again"
    convert_checkpoint(EXAMPLE, QWEN_RECIPE, again, device="cpu", jobs=1)
    assert _files(again) == _files(example_artifact)


def test_max_shard_size_writes_hf_style_shards_with_index(tmp_path: Path) -> None:
    out = tmp_path / "sharded"
    report = convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu", max_shard_size=200_000)
    shards = sorted(p.name for p in out.glob("model-*-of-*.ninfer"))
    assert len(shards) >= 2 and (out / "model.ninfer.index.json").exists()
    assert shards[0] == f"model-00001-of-{len(shards):05d}.ninfer"
    index = json.loads((out / "model.ninfer.index.json").read_text())
    assert set(index["weight_map"]) == {e.output for e in report.plan.entries}
    with open_artifact(out) as art:
        assert art.integrity_problems() == []


def test_existing_output_is_refused_without_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UsageError, match="already exists"):
        convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu")
    assert (out / "keep.txt").read_text() == "mine"
    # --force replaces only a .ninfer model directory: a user's file is never deleted.
    with pytest.raises(UsageError, match=r"not a \.ninfer model directory.*keep\.txt"):
        convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu", force=True)
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu")
    convert_checkpoint(EXAMPLE, QWEN_RECIPE, out, device="cpu", force=True)
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "generation_config.json",
        "model.ninfer",
    ]


def _dense_checkpoint(root: Path, *, poison: bool = False) -> Path:
    """A small Llama-named checkpoint written with safetensors, optionally with a NaN late in
    the plan order."""
    rng = np.random.default_rng(0)
    root.mkdir()
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer.json").write_text("{}")

    def bf16(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.standard_normal(shape).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16)

    tensors = {
        "model.embed_tokens.weight": bf16((64, 128)),
        "model.norm.weight": bf16((128,)),
        "lm_head.weight": bf16((64, 128)),
    }
    for i in range(2):
        p = f"model.layers.{i}."
        for proj, shape in (("q_proj", (128, 128)), ("k_proj", (64, 128)),
                            ("v_proj", (64, 128)), ("o_proj", (128, 128))):  # fmt: skip
            tensors[p + f"self_attn.{proj}.weight"] = bf16(shape)
        for proj, shape in (("gate_proj", (256, 128)), ("up_proj", (256, 128)),
                            ("down_proj", (128, 256))):  # fmt: skip
            tensors[p + f"mlp.{proj}.weight"] = bf16(shape)
        tensors[p + "input_layernorm.weight"] = bf16((128,))
        tensors[p + "post_attention_layernorm.weight"] = bf16((128,))
    if poison:
        tensors["model.layers.1.mlp.up_proj.weight"][200, 77] = 0x7FC0  # a BF16 NaN
    write_safetensors(root / "model.safetensors", {k: ("BF16", v) for k, v in tensors.items()})
    return root


def test_non_finite_value_fails_with_tensor_row_column_and_leaves_nothing(tmp_path: Path) -> None:
    src = _dense_checkpoint(tmp_path / "src", poison=True)
    out = tmp_path / "out"
    with pytest.raises(EncodeError) as info:
        convert_checkpoint(src, GENERIC_RECIPE, out, device="cpu")
    msg = str(info.value)
    assert "model.layers.1.mlp.up_proj.weight" in msg and "row 200" in msg and "column 77" in msg
    assert not out.exists()
    assert list(tmp_path.glob(".out*")) == []  # the staging directory is gone too


def test_cli_failure_is_one_paragraph_with_the_error_class_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _dense_checkpoint(tmp_path / "src", poison=True)
    code = main(["convert", str(src), "--recipe", str(GENERIC_RECIPE), "--output",
                 str(tmp_path / "out"), "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == EncodeError.exit_code == 5
    assert "Traceback" not in err and "row 200" in err


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_source_path_that_is_not_utf8_is_a_source_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dry_run: bool
) -> None:
    """The artifact records the source path as text (metadata, card): a directory name of
    other bytes is refused before the size plan, not met there as a UnicodeEncodeError."""
    src = _dense_checkpoint(tmp_path / os.fsdecode(b"src\xff"))
    args = ["convert", str(src), "--recipe", str(GENERIC_RECIPE), "--device", "cpu"]
    args += ["--dry-run"] if dry_run else ["--output", str(tmp_path / "out")]
    code = main(args)
    err = capsys.readouterr().err
    assert code == SourceError.exit_code, err
    assert "Traceback" not in err and "not valid UTF-8" in err and "src\\udcff" in err
    assert not (tmp_path / "out").exists()


def test_cli_dry_run_json_plans_without_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["convert", str(EXAMPLE), "--recipe", str(QWEN_RECIPE), "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["totals"]["tensors"] == len(plan["entries"]) > 0
    assert all("encoded_bytes" in e for e in plan["entries"])


def test_cli_convert_json_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    code = main(["convert", str(EXAMPLE), "--recipe", str(QWEN_RECIPE), "--output", str(out),
                 "--json", "--jobs", "1", "--max-shard-size", "300KB"])  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["tensors"] > 0 and "model.ninfer.index.json" in summary["files"]


def test_cli_alignment_sets_the_plane_alignment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    code = main(["convert", str(EXAMPLE), "--recipe", str(QWEN_RECIPE), "--output", str(out),
                 "--json", "--jobs", "1", "--alignment", "64"])  # fmt: skip
    assert code == 0
    with open_artifact(out) as art:
        offsets = [p.offset for info in art.tensors.values() for p in info.planes]
        assert all(o % 64 == 0 for o in offsets) and any(o % 4096 for o in offsets)


@pytest.mark.parametrize("alignment", ["100", "32", str(1 << 31)])
def test_cli_bad_alignment_is_refused_before_reading_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], alignment: str
) -> None:
    out = tmp_path / "o"
    code = main(["convert", str(tmp_path / "missing"), "--recipe", str(QWEN_RECIPE),
                 "--output", str(out), "--alignment", alignment])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "power of two in [64, 1073741824]" in err  # not "no such file"
    assert not out.exists()


def test_cuda_device_without_gpu_is_a_usage_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(UsageError, match="CUDA"):
        convert_checkpoint(EXAMPLE, QWEN_RECIPE, tmp_path / "o", device="cuda")


def test_killed_conversion_leaves_nothing_under_the_output_name(tmp_path: Path) -> None:
    """SIGKILL mid-write: no finished-looking artifact may exist under the output name."""
    src = _dense_checkpoint(tmp_path / "src")
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import time
        import ninfer_convert.container.writer as w
        def slowed(real):
            def slow(self, *a, **k):
                r = real(self, *a, **k)
                print("wrote", flush=True)
                time.sleep(0.2)
                return r
            return slow
        # A tensor alone, or a run of small ones (this checkpoint's, written as one unit).
        w.ArtifactWriter.complete = slowed(w.ArtifactWriter.complete)
        w.ArtifactWriter.complete_run = slowed(w.ArtifactWriter.complete_run)
        from ninfer_convert.convert import convert_checkpoint
        convert_checkpoint({str(src)!r}, {str(GENERIC_RECIPE)!r}, {str(out)!r}, device="cpu")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "wrote"  # tensor bytes are in the staging area
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not out.exists()
    # The lock file may stay (the kernel released the lock); a later run reuses it.
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("src", ".out.ninfer-lock")]
    assert all(name.startswith(".") and "staging" in name for name in leftovers)
    for stage in tmp_path.glob(".*staging*"):
        # Nothing staged opens as an artifact: shard headers are only appended at commit.
        for folder in (stage, stage / "new"):
            with pytest.raises(NinferError):
                open_artifact(folder)


def test_interrupt_in_process_removes_the_staging_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ninfer_convert.container.writer as writer_mod

    src = _dense_checkpoint(tmp_path / "src")
    real = writer_mod.ArtifactWriter.complete_run

    def interrupt(self: object, *a: object, **k: object) -> object:
        real(self, *a, **k)  # type: ignore[arg-type]
        raise KeyboardInterrupt  # once the first run of small tensors is in the staging area

    monkeypatch.setattr(writer_mod.ArtifactWriter, "complete_run", interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(src, GENERIC_RECIPE, tmp_path / "out", device="cpu")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.interop
def test_transformers_sharded_checkpoint_converts_with_generic_recipe(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    src = tmp_path / "llama"
    model.save_pretrained(src, max_shard_size="40KB")
    assert (src / "model.safetensors.index.json").exists()
    out = tmp_path / "out"
    t0 = time.perf_counter()
    report = convert_checkpoint(src, GENERIC_RECIPE, out, device="cpu")
    assert time.perf_counter() - t0 < 60
    sd = {k: v for k, v in model.state_dict().items()}
    with open_artifact(out) as art:
        for entry in report.plan.entries:
            stored = art.read(entry.output)
            src_t = sd[entry.sources[0].name]
            if isinstance(stored, GroupedCodes):
                want = encode_grouped_words(
                    src_t.contiguous().view(torch.int16).numpy().view(np.uint16), "BF16",
                    entry.format,
                )  # fmt: skip
                assert np.array_equal(stored.codes, want.codes)
                assert np.array_equal(stored.scales, want.scales)
        assert "config.json" in {p.name for p in out.iterdir()}


def test_prefetch_is_advisory_and_ignores_unknown_names() -> None:
    source = open_source(EXAMPLE)
    names = list(source.tensors)[:3]
    source.prefetch([*names, "no.such.tensor"])  # only starts readahead; never raises
    assert source.read(names[0]).words.size > 0


def test_artifact_prefetch_is_advisory(example_artifact: Path) -> None:
    with open_artifact(example_artifact) as art:
        for name in art.tensors:
            art.prefetch(name)  # starts readahead only; never raises, never changes reads
        first = next(iter(art.tensors))
        assert art.read(first) is not None
