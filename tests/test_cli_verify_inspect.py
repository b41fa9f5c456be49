"""``ninfer verify`` / ``ninfer inspect`` through the real entry point: exit codes, plain tables
off a terminal, progress on stderr, and the JSON schemas exactly as docs/cli.md documents them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from verify_fixtures import (
    ROOT,
    container_files,
    copy_artifact,
    flip_byte,
    plane_offset,
    write_all_formats_source,
)

from ninfer_convert.cli import main
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.source import open_source
from ninfer_convert.verify import CHECK_ORDER

DOC = ROOT / "docs" / "cli.md"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source dir, artifact dir)."""
    work = tmp_path_factory.mktemp("cli")
    src, recipe = write_all_formats_source(work / "src")
    out = work / "art"
    convert_checkpoint(src, recipe, out, device="cpu", alignment=64)
    return src, out


def ninfer(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------------------------
# The documented JSON schemas


def _doc_example(heading: str) -> Any:
    text = DOC.read_text()
    start = text.index(heading)
    block = re.search(r"```json\n(.*?)\n```", text[start:], re.S)
    assert block is not None, heading
    return json.loads(block.group(1))


_FREE_FORM = {"tensor.values.code_histogram", "totals.timings"}
"""Objects whose keys are data (codes, phase names), not schema."""


def _same_shape(doc: Any, actual: Any, where: str = "") -> None:
    """Every object in ``actual`` has exactly the keys of the documented example (recursively;
    lists compare their first elements; null on either side compares with anything)."""
    if doc is None or actual is None:
        return
    if isinstance(doc, dict):
        assert isinstance(actual, dict), where
        if where not in _FREE_FORM:
            assert set(actual) == set(doc), (where, sorted(set(actual) ^ set(doc)))
            for k in doc:
                _same_shape(doc[k], actual[k], f"{where}.{k}" if where else k)
    elif isinstance(doc, list):
        assert isinstance(actual, list), where
        if doc and actual:
            _same_shape(doc[0], actual[0], f"{where}[]")
    else:
        assert type(actual) is type(doc) or {type(actual), type(doc)} <= {int, float}, where


def test_verify_json_matches_the_documented_schema(
    made: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    art = copy_artifact(made[1], tmp_path / "a")
    path, offset, _ = plane_offset(art, "w8.weight", "codes")
    flip_byte(path, offset + 3, 0x02)
    code, out, _ = ninfer(capsys, "verify", art, "--json", "-q", "--oracle-groups", 2)
    assert code == 6
    data = json.loads(out)
    _same_shape(_doc_example("### `verify --json`"), data)
    assert data["schema_version"] == 1 and data["exit_code"] == 6 and not data["passed"]
    assert [c["name"] for c in data["checks"]] == list(CHECK_ORDER)
    statuses = {c["name"]: c["status"] for c in data["checks"]}
    assert statuses["integrity"] == statuses["source-words"] == "fail"
    assert data["first_mismatch"]["tensor"] == "w8.weight"
    assert data["first_mismatch"]["column"] == 3
    assert data["findings_total"] == sum(len(c["findings"]) for c in data["checks"])


def test_inspect_json_matches_the_documented_schema(
    made: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = ninfer(capsys, "inspect", made[1], "--json", "--tensor", "w8.weight",
                          "--filter", "w8*")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    _same_shape(_doc_example("### `inspect --json`"), data)
    assert data["schema_version"] == 1 and data["kind"] == "ninfer-inspect"
    assert [t["name"] for t in data["tensors"]] == ["w8.weight"]
    assert data["tensor"]["values"]["count"] == 6 * 33
    # Without --tensor the key is present and null; without --filter every tensor is listed.
    code, out, _ = ninfer(capsys, "inspect", made[1], "--json")
    data = json.loads(out)
    assert data["tensor"] is None and data["filter"] is None and len(data["tensors"]) == 16


def test_docs_list_every_exit_code_of_the_error_classes() -> None:
    from ninfer_convert import errors

    text = DOC.read_text()
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert f"`{name}`" in text, name
        if isinstance(cls, type) and issubclass(cls, errors.NinferError):
            assert re.search(rf"\| {cls.exit_code} \|", text), name
    assert "## `ninfer convert`" in text


# ---------------------------------------------------------------------------------------------
# verify


def test_verify_passes_with_a_plain_table_and_progress_on_stderr(
    made: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = ninfer(capsys, "verify", made[1], "--oracle-groups", 2, "--jobs", 2)
    assert code == 0
    assert "\x1b[" not in out  # no colour codes off a terminal
    for name in CHECK_ORDER:
        assert re.search(rf"{name}\s+│ PASS", out), name
    assert "PASS: every check passed" in out and "SQNR dB" in out
    assert "verify: digests" in err and "verify: tensors 16/16" in err
    code, _, err = ninfer(capsys, "verify", made[1], "--oracle-groups", 0, "-q")
    assert code == 0 and err == ""


def test_verify_failure_is_reported_with_first_mismatch(
    made: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    art = copy_artifact(made[1], tmp_path / "a")
    path, offset, _ = plane_offset(art, "emb.weight", "scales")
    flip_byte(path, offset + 1, 0x80)  # row 0, group 0: the scale's sign bit
    code, out, _ = ninfer(capsys, "verify", art, "-q", "--oracle-groups", 0)
    assert code == 6
    assert re.search(r"integrity\s+│ FAIL", out) and re.search(r"values\s+│ FAIL", out)
    assert "is not a valid scale" in out
    assert "First mismatch: tensor emb.weight: scales row 0, group 0: expected 0x" in out
    assert "FAIL:" in out and "exit code 6" in out


def test_verify_changed_source_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, recipe = write_all_formats_source(tmp_path / "src")
    art = tmp_path / "art"
    convert_checkpoint(src, recipe, art, device="cpu", alignment=64)
    info = open_source(src).tensors["bias"]
    flip_byte(src / info.file, info.offset, 0x01)
    code, out, _ = ninfer(capsys, "verify", art, "-q", "--oracle-groups", 0)
    assert code == 4
    assert "changed since conversion" in out
    code, out, _ = ninfer(capsys, "verify", art, "-q", "--no-source")
    assert code == 0 and "source checks turned off" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["verify", "{tmp}/missing"], "no such file or directory"),
        (["verify", "{src}/model.safetensors"], "not a .ninfer artifact"),
        (["verify", "{src}"], "not a .ninfer artifact"),
        (["verify", "{art}", "--source", "{tmp}/missing"], "no such source"),
        (["verify", "{art}", "--source", "{src}", "--no-source"], "contradict"),
        (["verify", "{art}", "--jobs", "0"], "--jobs"),
        (["inspect", "{tmp}/missing"], "no such file or directory"),
        (["inspect", "{src}/config.json"], "not a .ninfer artifact"),
        (["inspect", "{art}", "--tensor", "nope"], "no tensor 'nope'"),
    ],
)
def test_usage_errors_exit_2(
    made: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    fill = {"tmp": str(tmp_path), "src": str(made[0]), "art": str(made[1])}
    code, out, err = ninfer(capsys, *[a.format(**fill) for a in args])
    assert code == 2
    assert message in err and out == ""


# ---------------------------------------------------------------------------------------------
# inspect


def test_inspect_tables(made: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ninfer(capsys, "inspect", made[1])
    assert code == 0
    assert "Recipe     every-format-test (sha256:" in out
    assert "Tensors per format (16 tensors)" in out and "logical bits/w" in out
    assert "alignment gaps" in out and "mlp.down_t.weight" in out and "transpose" in out
    code, out, _ = ninfer(capsys, "inspect", made[1], "--filter", "nv.*")
    assert "Tensors (2 matching 'nv.*')" in out and "attn.x.weight" not in out
    code, out, _ = ninfer(capsys, "inspect", made[1], "--tensor", "nv.weight")
    assert code == 0
    assert "Code histogram" in out and "Zero scales" in out and '"copy-quantized"' in out
    assert "Tensors (" not in out  # --tensor alone shows the summary and the tensor only


def test_inspect_damaged_header_exits_6(
    made: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    art = copy_artifact(made[1], tmp_path / "a")
    [path] = container_files(art)
    flip_byte(path, path.stat().st_size - 2)
    code, _, err = ninfer(capsys, "inspect", art)
    assert code == 6 and "header digest mismatch" in err
