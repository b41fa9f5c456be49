"""Hostile and unusual sources (issue 11): safetensors edge cases that the safetensors project
accepts or refuses, tensor names the container cannot store, dtypes we only skip, JSON nesting,
and the side files copied beside the artifact (what is copied, what is left out, what is
refused, and that nothing ever blocks)."""

from __future__ import annotations

import json
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from artifact_fixtures import META
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert import open_artifact
from ninfer_convert.cli import main
from ninfer_convert.container import ArtifactWriter
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import NinferError, SourceError, UsageError
from ninfer_convert.recipe import RecipeProblems
from ninfer_convert.source import SIDE_FILE_LEFT_OUT, open_source, parse_header

ROOT = Path(__file__).resolve().parents[1]


def raw_file(path: Path, header: str | bytes, data: bytes = b"") -> Path:
    raw = header.encode("utf-8") if isinstance(header, str) else header
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def one_u8(name_json: str = '"a"') -> str:
    return "{" + name_json + ': {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'


def within(seconds: float, fn: Callable[[], object]) -> object:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it blocks."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised below, in the test's thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def model_dir(root: Path, tensors: dict[str, tuple[str, np.ndarray]] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if tensors is None:
        tensors = {"w": ("F32", np.arange(4, dtype=np.float32).view(np.uint32))}
    write_safetensors(root / "model.safetensors", tensors)
    (root / "config.json").write_text('{"model_type": "llama"}')
    return root


def fp32_recipe(tmp_path: Path, body: str = "- match: w\n  format: FP32\n  role: norm\n") -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(RECIPE_HEAD + body)
    return p


# -- safetensors header edge cases -------------------------------------------------------------


@pytest.mark.parametrize("pad", [" ", "\n", "\t", "\r\n  \t"])
def test_header_with_leading_json_whitespace_is_accepted(tmp_path: Path, pad: str) -> None:
    # safetensors' own test_whitespace_leading_padded_header accepts this file.
    p = raw_file(tmp_path / "m.safetensors", pad + one_u8(), b"\x07")
    header = parse_header(p)
    assert list(header.tensors) == ["a"] and header.data_start == 8 + len(pad + one_u8())
    with open_source(p) as src:
        assert src.read("a").words.tolist() == [7]


def test_leading_non_json_whitespace_is_still_refused(tmp_path: Path) -> None:
    p = raw_file(tmp_path / "m.safetensors", "\x0c" + one_u8(), b"\x07")
    with pytest.raises(SourceError, match="does not start with"):
        parse_header(p)


@pytest.mark.parametrize(
    "header",
    [
        one_u8('"\\ud800x"'),
        one_u8('"x\\udfff"'),
        one_u8('"\\udc00\\ud800"'),  # reversed pair: two lone surrogates
        '{"__metadata__": {"k": "\\ud800"}, ' + one_u8()[1:],
        '{"__metadata__": {"\\udbff": "v"}, ' + one_u8()[1:],
    ],
)
def test_lone_surrogate_escape_is_a_source_error(tmp_path: Path, header: str) -> None:
    p = raw_file(tmp_path / "m.safetensors", header, b"\x00")
    with pytest.raises(SourceError, match="lone UTF-16 surrogate") as info:
        parse_header(p)
    assert str(p) in str(info.value)
    str(info.value).encode("utf-8")  # the message itself is printable


def test_surrogate_pair_escape_is_a_character(tmp_path: Path) -> None:
    p = raw_file(tmp_path / "m.safetensors", one_u8('"emoji\\ud83d\\ude00"'), b"\x00")
    assert list(parse_header(p).tensors) == ["emoji\U0001f600"]


@pytest.mark.parametrize(
    ("name_json", "needle"),
    [
        ('""', "1..4096 characters"),
        ('"a\\u0000b"', "control character"),
        ('"a\\nb"', "control character"),
        ('"a\\tb"', "control character"),
        ('"a\\u007fb"', "control character"),
        ('"' + "x" * 4097 + '"', "1..4096 characters"),
    ],
)
def test_names_the_container_cannot_store_are_source_errors(
    tmp_path: Path, name_json: str, needle: str
) -> None:
    p = raw_file(tmp_path / "m.safetensors", one_u8(name_json), b"\x00")
    with pytest.raises(SourceError, match=needle):
        parse_header(p)


def test_name_of_4096_characters_is_accepted(tmp_path: Path) -> None:
    p = raw_file(tmp_path / "m.safetensors", one_u8('"' + "x" * 4096 + '"'), b"\x00")
    assert list(parse_header(p).tensors) == ["x" * 4096]


@pytest.mark.parametrize(
    "name_json", ['"\\ud800x"', '""', '"a\\u0000b"', '"a\\nb"', '"' + "y" * 10_000 + '"']
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_cli_bad_tensor_name_is_exit_4_at_plan_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name_json: str, dry_run: bool
) -> None:
    src = tmp_path / "src"
    raw_file(src / "model.safetensors", one_u8(name_json), b"\x00")
    (src / "config.json").write_text('{"model_type": "llama"}')
    out = tmp_path / "out"
    args = ["convert", str(src), "--recipe", str(fp32_recipe(tmp_path)), "--output", str(out)]
    code = main([*args, "--dry-run"] if dry_run else args)
    err = capsys.readouterr().err
    assert code == SourceError.exit_code == 4, err
    assert "Traceback" not in err and "model.safetensors" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [
        ("C64", [2], 16),
        ("F4", [3, 2], 3),
        ("F6_E2M3", [4], 3),
        ("F6_E3M2", [2, 2], 3),
        ("F8_E4M3FNUZ", [3], 3),
        ("F8_E5M2FNUZ", [1], 1),
    ],
)
def test_opaque_dtype_named_by_a_skip_rule_converts(
    tmp_path: Path, dtype: str, shape: list[int], nbytes: int
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    w = np.arange(4, dtype=np.float32).tobytes()
    odd = bytes(range(1, nbytes + 1))
    header = {
        "odd": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]},
        "w": {"dtype": "F32", "shape": [4], "data_offsets": [nbytes, nbytes + 16]},
    }
    raw_file(src / "model.safetensors", json.dumps(header), odd + w)
    (src / "config.json").write_text('{"model_type": "llama"}')
    with open_source(src) as source:
        info = source.tensors["odd"]
        assert not info.convertible and info.nbytes == nbytes
        read = source.read("odd")
        assert read.words.dtype == np.uint8 and read.words.tobytes() == odd
    recipe = fp32_recipe(
        tmp_path,
        "- skip: odd\n  reason: not convertible\n- match: w\n  format: FP32\n  role: norm\n",
    )
    out = tmp_path / "out"
    convert_checkpoint(src, recipe, out, device="cpu", jobs=1)
    with open_artifact(out) as art:
        assert set(art.tensors) == {"w"}
        assert art.read("w").words.tobytes() == w  # type: ignore[union-attr]
        assert "odd" in art.metadata["source"]["tensors"]


@pytest.mark.parametrize("fmt", ["BF16", "FP32", "I32", "Q4G64_F16S"])
def test_opaque_dtype_claimed_for_conversion_stays_an_error(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    header = {"odd": {"dtype": "C64", "shape": [64, 64], "data_offsets": [0, 64 * 64 * 8]}}
    raw_file(src / "model.safetensors", json.dumps(header), bytes(64 * 64 * 8))
    (src / "config.json").write_text('{"model_type": "llama"}')
    extra = "  encoder_profile: MAXABS_F16_RECIP_RNE_V1\n  evidence: [e1]\n" if "G" in fmt else ""
    recipe = fp32_recipe(tmp_path, f"- match: odd\n  format: {fmt}\n  role: norm\n{extra}")
    with pytest.raises(RecipeProblems) as info:
        convert_checkpoint(src, recipe, tmp_path / "out", device="cpu", jobs=1)
    msgs = [p.message for p in info.value.problems]
    assert msgs == [
        "rule 1 (match 'odd'): 'odd': source tensor 'odd' is C64, a dtype the converter "
        "cannot read as values; name it in a skip rule instead"
    ]


def test_nfkc_twin_tensor_names_are_refused(tmp_path: Path) -> None:
    # "ﬁ" (U+FB01) is "fi" after NFKC; "é" composed and decomposed are NFC twins.
    for a, b in (("w.\ufb01", "w.fi"), ("caf\u00e9", "cafe\u0301")):
        src = model_dir(tmp_path / a, {a: ("U8", np.zeros(1, np.uint8)),
                                       b: ("U8", np.zeros(1, np.uint8))})  # fmt: skip
        with pytest.raises(SourceError, match="differ only in Unicode normalisation"):
            open_source(src)
        with pytest.raises(SourceError, match="differ only in Unicode normalisation"):
            open_source(src / "model.safetensors")


def test_twins_across_shards_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    write_safetensors(root / "a.safetensors", {"caf\u00e9": ("U8", np.zeros(1, np.uint8))})
    write_safetensors(root / "b.safetensors", {"cafe\u0301": ("U8", np.zeros(1, np.uint8))})
    index = {"weight_map": {"caf\u00e9": "a.safetensors", "cafe\u0301": "b.safetensors"}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SourceError, match="NFKC"):
        open_source(root)


DEEP = "[" * 1000 + "]" * 1000


def test_deep_nesting_in_a_safetensors_header_is_a_source_error(tmp_path: Path) -> None:
    header = '{"__metadata__": {"k": "v"}, "a": ' + DEEP + "}"
    p = raw_file(tmp_path / "m.safetensors", header)
    with pytest.raises(SourceError, match="nested deeper than 64 levels"):
        parse_header(p)


def test_deep_nesting_in_config_json_is_a_source_error(tmp_path: Path) -> None:
    src = model_dir(tmp_path / "m")
    (src / "config.json").write_text('{"model_type": "llama", "x": ' + DEEP + "}")
    with pytest.raises(SourceError, match=r"config.json.*nested deeper than 64"):
        open_source(src)


def test_deep_nesting_in_the_shard_index_is_a_source_error(tmp_path: Path) -> None:
    src = model_dir(tmp_path / "m")
    (src / "model.safetensors.index.json").write_text('{"weight_map": {}, "x": ' + DEEP + "}")
    with pytest.raises(SourceError, match=r"index.json.*nested deeper than 64"):
        open_source(src)


def test_lone_surrogate_in_config_json_is_a_source_error(tmp_path: Path) -> None:
    src = model_dir(tmp_path / "m")
    (src / "config.json").write_text('{"model_type": "llama", "n": ["\\udc80"]}')
    with pytest.raises(SourceError, match=r"config.json.*lone UTF-16 surrogate"):
        open_source(src)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_fifo_config_or_index_never_blocks(tmp_path: Path, name: str) -> None:
    src = model_dir(tmp_path / "m")
    (src / name).unlink(missing_ok=True)
    os.mkfifo(src / name)
    with pytest.raises(SourceError, match="not a regular file"):
        within(10, lambda: open_source(src))


# -- side files ----------------------------------------------------------------------------------


def sentence_transformers_dir(root: Path) -> Path:
    model_dir(root)
    (root / "modules.json").write_text('[{"path": "1_Pooling", "type": "Pooling"}]')
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (root / "2_Dense" / "deep").mkdir(parents=True)
    (root / "2_Dense" / "deep" / "vocab.txt").write_text("a\nb\n")
    (root / "2_Dense" / "pytorch_model.bin").write_bytes(b"pickle")
    return root


def test_side_files_in_subfolders_keep_their_relative_paths(tmp_path: Path) -> None:
    src = open_source(sentence_transformers_dir(tmp_path / "m"))
    assert [f.name for f in src.side_files] == [
        "1_Pooling/config.json",
        "2_Dense/deep/vocab.txt",
        "config.json",
        "modules.json",
    ]
    assert all(os.fspath(f) == str(f.path) and f.size == f.path.stat().st_size
               for f in src.side_files)  # fmt: skip


def test_subfolder_side_files_survive_conversion(tmp_path: Path) -> None:
    src = sentence_transformers_dir(tmp_path / "m")
    out = tmp_path / "out"
    convert_checkpoint(src, fp32_recipe(tmp_path), out, device="cpu", jobs=1)
    assert (out / "1_Pooling" / "config.json").read_bytes() == (
        src / "1_Pooling" / "config.json"
    ).read_bytes()
    assert (out / "2_Dense" / "deep" / "vocab.txt").read_text() == "a\nb\n"
    assert not (out / "2_Dense" / "pytorch_model.bin").exists()
    with open_artifact(out) as art:
        assert sorted(art.side_files) == [
            "1_Pooling/config.json",
            "2_Dense/deep/vocab.txt",
            "README.md",  # the generated model card
            "config.json",
            "modules.json",
        ]
        assert art.integrity_problems() == []


LEFT_OUT_NAMES = [
    ".DS_Store",
    ".gitattributes",
    ".git/config",
    ".cache/huggingface/download/x.lock",
    "desktop.ini",
    "Desktop.ini",
    "Thumbs.db",
    "sub/thumbs.db",
    "ehthumbs.db",
    "__MACOSX/._config.json",
    "Icon\r",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "model.pt",
    "model.pt.index.json",
    "model.pth",
    "consolidated.pth.index.json",
    "original/consolidated.00.pth",
    "model.ckpt",
    "model.gguf",
    "onnx/model.onnx",
    "onnx/model.onnx_data",
    "flax_model.msgpack",
    "flax_model.msgpack.index.json",
    "tf_model.h5",
    "tf_model.h5.index.json",
    "rust_model.ot",
    "other.safetensors",
    "sub/model-00001-of-00002.safetensors",
    "model.safetensors.index.json.bak.safetensors",
    "old/model.ninfer",
    "model.ninfer.index.json",
]


def test_left_out_files_are_not_copied(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    for rel in LEFT_OUT_NAMES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    (root / "tokenizer.json").write_text("{}")
    (root / "sub" / "kept.txt").write_text("k")
    assert [f.name for f in open_source(root).side_files] == [
        "config.json",
        "sub/kept.txt",
        "tokenizer.json",
    ]


def test_docs_list_exactly_the_left_out_table() -> None:
    doc = (ROOT / "docs" / "cli.md").read_text()
    section = doc[doc.index("### Side files") :]
    table = section[section.index("| Pattern | Why |") :].split("\n\n")[0].splitlines()[2:]
    want = [
        f"| `{pattern.replace(chr(13), chr(92) + 'r')}` | {why} |"
        for pattern, why in SIDE_FILE_LEFT_OUT
    ]
    assert table == want


def test_symlink_inside_the_source_is_copied_with_its_content(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    (root / "real").mkdir()
    (root / "real" / "tok.json").write_text('{"t": 1}')
    os.symlink("real/tok.json", root / "tokenizer.json")
    names = {f.name: f for f in open_source(root).side_files}
    assert set(names) == {"config.json", "real/tok.json", "tokenizer.json"}
    out = tmp_path / "out"
    convert_checkpoint(root, fp32_recipe(tmp_path), out, device="cpu", jobs=1)
    assert not (out / "tokenizer.json").is_symlink()
    assert (out / "tokenizer.json").read_text() == '{"t": 1}'


@pytest.mark.parametrize("target", ["/dev/zero", "outside", "../outside.json", "missing"])
def test_symlinks_leaving_the_source_or_dangling_are_refused(tmp_path: Path, target: str) -> None:
    root = model_dir(tmp_path / "m")
    (tmp_path / "outside.json").write_text("secret")
    (tmp_path / "outside").mkdir()
    os.symlink(target if target != "outside" else str(tmp_path / "outside"), root / "tok.json")
    with pytest.raises(SourceError) as info:
        within(10, lambda: open_source(root))
    msg = str(info.value)
    assert "tok.json" in msg and "side file problem" in msg


def test_symlinked_folder_inside_the_source_is_refused(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    (root / "a").mkdir()
    (root / "a" / "x.json").write_text("{}")
    os.symlink("a", root / "b")
    with pytest.raises(SourceError, match="b/: a symlinked folder"):
        open_source(root)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_side_file_is_refused_without_blocking(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    (root / "sub").mkdir()
    os.mkfifo(root / "sub" / "tokenizer.json")
    with pytest.raises(SourceError, match=r"sub/tokenizer.json: not a regular file"):
        within(10, lambda: open_source(root))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Config.JSON", "x"),  # against config.json
        ("tok.json", "TOK.json"),
        ("caf\u00e9.txt", "cafe\u0301.txt"),  # NFC twins (APFS treats them as one name)
        ("Sub", "sub/x.json"),  # a file and a folder
        ("STRASSE/a", "strasse/b"),
    ],
)
def test_names_colliding_on_case_insensitive_file_systems_are_refused(
    tmp_path: Path, a: str, b: str
) -> None:
    root = model_dir(tmp_path / "m")
    for rel in (a, b):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    with pytest.raises(SourceError, match="same name on a case-insensitive"):
        open_source(root)


def test_too_deep_side_folders_are_refused(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    deep = root.joinpath(*["d"] * 8)
    deep.mkdir(parents=True)
    (deep / "x.json").write_text("{}")
    with pytest.raises(SourceError, match="nested deeper than 8 levels"):
        open_source(root)
    ok = root.joinpath(*["d"] * 7)
    (deep / "x.json").unlink()
    deep.rmdir()
    (ok / "y.json").write_text("{}")
    assert "d/d/d/d/d/d/d/y.json" in [f.name for f in open_source(root).side_files]


def test_every_side_file_problem_is_listed_at_once(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    os.symlink("/dev/null", root / "a.json")
    os.symlink("/etc/hostname", root / "b.json")
    os.mkfifo(root / "c.json")
    with pytest.raises(SourceError, match="3 side file problems") as info:
        within(10, lambda: open_source(root))
    assert all(n in str(info.value) for n in ("a.json", "b.json", "c.json"))


def test_cli_side_file_problem_is_exit_4_in_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = model_dir(tmp_path / "m")
    os.symlink("/dev/zero", root / "tokenizer.json")
    code = main(["convert", str(root), "--recipe", str(fp32_recipe(tmp_path)), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 4 and "tokenizer.json" in err and "Traceback" not in err


# -- the writer's side of side files -----------------------------------------------------------


def test_writer_records_relative_side_file_names(tmp_path: Path) -> None:
    src = tmp_path / "pool.json"
    src.write_text('{"p": 1}')
    with ArtifactWriter(tmp_path / "art", metadata=META) as w:
        info = w.add_file(src, "1_Pooling/config.json")
        assert info.name == "1_Pooling/config.json" and info.size == 8
    assert (tmp_path / "art" / "1_Pooling" / "config.json").read_text() == '{"p": 1}'
    with open_artifact(tmp_path / "art") as art:
        assert list(art.side_files) == ["1_Pooling/config.json"]


@pytest.mark.parametrize(
    "name",
    ["../x", "a/../b", "/abs", "a//b", "a/", "./a", "a\\b", "A/model.NINFER", "MODEL.NINFER",
     "/".join("d" * 9), "x" * 256, "model.ninfer/config.json", "Model.Ninfer.Index.Json/x",
     "a/model-00001-of-00002.ninfer/x", "shard-00001.partial", "SHARD-123456.partial"],
)  # fmt: skip
def test_writer_refuses_side_file_names_outside_the_rules(tmp_path: Path, name: str) -> None:
    src = tmp_path / "f"
    src.write_text("x")
    with ArtifactWriter(tmp_path / "art", metadata=META) as w:
        with pytest.raises(UsageError):
            w.add_file(src, name)
        w.abort()


@pytest.mark.parametrize(("a", "b"), [("a.json", "A.json"), ("d", "D/x"), ("D/x", "d")])
def test_writer_refuses_case_insensitive_collisions(tmp_path: Path, a: str, b: str) -> None:
    src = tmp_path / "f"
    src.write_text("x")
    with ArtifactWriter(tmp_path / "art", metadata=META) as w:
        w.add_file(src, a)
        with pytest.raises(UsageError, match="case-insensitive"):
            w.add_file(src, b)
        w.abort()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_writer_refuses_a_non_regular_source_without_blocking(tmp_path: Path, kind: str) -> None:
    src = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(src)
    else:
        os.symlink("/dev/zero", src)
    with ArtifactWriter(tmp_path / "art", metadata=META) as w:
        with pytest.raises(UsageError, match="not a regular file"):
            within(10, lambda: w.add_file(src, "tokenizer.json"))
        w.abort()


def test_a_source_file_named_like_the_writers_temporary_shard_is_left_out(tmp_path: Path) -> None:
    """shard-00001.partial is the writer's own name for the shard being written: copied as a
    side file it crashed convert (FileExistsError), or was truncated by the next shard."""
    root = model_dir(tmp_path / "m")
    (root / "shard-00001.partial").write_text("mine")
    convert_checkpoint(root, fp32_recipe(tmp_path), tmp_path / "o", device="cpu", jobs=1)
    with open_artifact(tmp_path / "o") as art:
        assert "shard-00001.partial" not in art.side_files and "config.json" in art.side_files
    with ArtifactWriter(tmp_path / "art", metadata=META) as w:
        with pytest.raises(UsageError, match="temporary shard name"):
            w.add_file(root / "shard-00001.partial", "shard-00001.partial")
        w.abort()


def test_a_source_signature_in_another_case_is_not_copied_either(tmp_path: Path) -> None:
    """MODEL.SIG is the same file as model.sig on a case-insensitive file system."""
    root = model_dir(tmp_path / "m")
    (root / "MODEL.SIG").write_text("the source's own signature")
    convert_checkpoint(root, fp32_recipe(tmp_path), tmp_path / "o", device="cpu", jobs=1)
    with open_artifact(tmp_path / "o") as art:
        assert "MODEL.SIG" not in art.side_files and "config.json" in art.side_files
    assert not (tmp_path / "o" / "MODEL.SIG").exists()


def test_writer_error_is_typed(tmp_path: Path) -> None:
    with ArtifactWriter(tmp_path / "art", metadata=META) as w:
        with pytest.raises(NinferError):
            w.add_file(tmp_path / "missing", "x.json")
        w.abort()


@pytest.mark.parametrize(
    ("output", "needle"),
    [
        ('"x\\ud800{A}"', "lone UTF-16 surrogate"),
        ('"x\\t{A}"', "control character"),
        ('"' + "z" * 4096 + '{A}"', "1..4096 characters"),
    ],
)
def test_derived_output_names_the_container_cannot_store_are_plan_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, needle: str
) -> None:
    src = model_dir(tmp_path / "m")
    body = f"- derive: {output}\n  inputs: ['{{A}}']\n  format: FP32\n  role: norm\n"
    for extra in ([], ["--dry-run"]):
        out = tmp_path / "out"
        code = main(["convert", str(src), "--recipe", str(fp32_recipe(tmp_path, body)),
                     "--output", str(out), *extra])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 3, err
        assert needle in err and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize(
    "edit",
    [
        ("- match: w", '- derive: "x\\ud800{A}"\n  inputs: [\'{A}\']'),
        ("role: norm", 'role: "n\\ud800"'),
        ("- match: w", '- match: "w\\udfff"'),
        ("name: t", 'name: "t\\ud800"'),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_recipe_strings_with_a_lone_surrogate_are_recipe_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, str], dry_run: bool
) -> None:
    src = model_dir(tmp_path / "m")
    recipe = fp32_recipe(tmp_path)
    recipe.write_text(recipe.read_text().replace(*edit))
    out = tmp_path / "out"
    args = ["convert", str(src), "--recipe", str(recipe), "--output", str(out)]
    code = main([*args, "--dry-run"] if dry_run else args)
    err = capsys.readouterr().err
    assert code == 3, err
    assert "lone UTF-16 surrogate" in err and "Traceback" not in err and not out.exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("where", ["single", "file", "shard"])
def test_fifo_weight_file_never_blocks(tmp_path: Path, where: str) -> None:
    root = model_dir(tmp_path / "m")
    (root / "model.safetensors").unlink()
    if where == "shard":
        index = {"weight_map": {"w": "model-00001-of-00001.safetensors"}}
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
        os.mkfifo(root / "model-00001-of-00001.safetensors")
        with pytest.raises(SourceError, match="not a regular file"):
            within(10, lambda: open_source(root))
        return
    os.mkfifo(root / "model.safetensors")
    target = root if where == "single" else root / "model.safetensors"
    with pytest.raises(SourceError, match="not a regular file"):
        within(10, lambda: parse_header(root / "model.safetensors"))
    with pytest.raises(SourceError):
        within(10, lambda: open_source(target))


def test_index_shard_names_the_file_system_cannot_hold_are_source_errors(tmp_path: Path) -> None:
    root = model_dir(tmp_path / "m")
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "x" * 5000, "v": "a\nb.safetensors"}})
    )
    with pytest.raises(SourceError, match="2 problems") as info:
        open_source(root)
    assert "is not a plain file name" in str(info.value)


def test_source_path_too_long_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot look it up"):
        open_source(tmp_path / ("y" * 5000))


def test_null_metadata_is_no_metadata_as_in_safetensors(tmp_path: Path) -> None:
    header = '{"__metadata__": null, ' + one_u8()[1:]
    parsed = parse_header(raw_file(tmp_path / "m.safetensors", header, b"\x00"))
    assert dict(parsed.metadata) == {} and list(parsed.tensors) == ["a"]


@pytest.mark.parametrize("field", ["shape", "offset"])
def test_negative_zero_integer_is_refused_as_in_safetensors(tmp_path: Path, field: str) -> None:
    spec = (
        '{"a": {"dtype": "U8", "shape": [-0], "data_offsets": [0, 0]}}'
        if field == "shape"
        else '{"a": {"dtype": "U8", "shape": [0], "data_offsets": [-0, 0]}}'
    )
    with pytest.raises(SourceError, match="-0 is not an unsigned integer"):
        parse_header(raw_file(tmp_path / "m.safetensors", spec))


def test_negative_zero_stays_legal_in_config_json(tmp_path: Path) -> None:
    src = model_dir(tmp_path / "m")
    (src / "config.json").write_text('{"model_type": "llama", "bias": -0}')
    assert open_source(src).config == {"model_type": "llama", "bias": 0}


def test_more_side_files_than_the_cap_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ninfer_convert.source import side_files

    monkeypatch.setattr(side_files, "MAX_SIDE_FILES", 3)
    root = model_dir(tmp_path / "m")
    for i in range(2):
        (root / f"s{i}.txt").write_text("x")
    assert len(open_source(root).side_files) == 3  # config.json + 2
    (root / "sub").mkdir()
    (root / "sub" / "s.txt").write_text("x")
    with pytest.raises(SourceError, match="more than 3 side files"):
        open_source(root)
