"""verify checks everything docs/cli.md says it checks (issue 11, items 5 and 7): the recipe
digest, the recorded source files, config and side-file list, stray container files, and the
exact snapshot of a cached repo id; source checks that cannot run are a failure unless
``--no-source``, and the report lists every check that did not run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from artifact_fixtures import rewrite_header
from st_helpers import write_safetensors

from ninfer_convert.cli import main
from ninfer_convert.container import open_artifact
from ninfer_convert.container.wire import SINGLE_NAME
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.inspect import inspect_artifact
from ninfer_convert.verify import VerifyReport, verify_artifact

RECIPE = """\
ninfer_recipe: 1
name: identity-test
version: "1"
description: two tensors
source:
  tensor_count: 2
evidence:
  - id: test
    citation: test fixture
    summary: not a quality claim
rules:
  - match: w
    format: Q4G64_F16S
    encoder_profile: MAXABS_F16_RECIP_RNE_V1
    role: w
    evidence: test
  - match: b
    format: FP32
    role: b
"""
CONFIG = {"model_type": "tiny", "hidden_size": 64}


def _write_source(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "tokenizer.json").write_text('{"vocab": {}}')
    rng = np.random.default_rng(3)
    write_safetensors(
        root / "model.safetensors",
        {
            "w": ("F32", rng.standard_normal((4, 64)).astype(np.float32)),
            "b": ("F32", rng.standard_normal(4).astype(np.float32)),
        },
    )
    return root


@pytest.fixture
def made(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(source dir, recipe, artifact dir)."""
    src = _write_source(tmp_path / "src")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    out = tmp_path / "art"
    convert_checkpoint(src, recipe, out, device="cpu", alignment=64)
    return src, recipe, out


def run(path: Path, **kw: Any) -> VerifyReport:
    kw.setdefault("device", "cpu")
    kw.setdefault("oracle_groups", 2)
    return verify_artifact(path, **kw)


def findings(report: VerifyReport, check: str) -> list[tuple[str, str]]:
    return [(f.error, f.message) for f in report.check(check).findings]


def _edit_source_meta(out: Path, edit: Any) -> None:
    rewrite_header(out / SINGLE_NAME, lambda h: edit(h["artifact"]["source"]))


def test_a_fresh_artifact_passes_with_nothing_not_run(made: tuple[Path, Path, Path]) -> None:
    report = run(made[2])
    assert report.passed and report.exit_code == 0 and report.not_run == []
    assert report.to_json()["not_run"] == []


# ---------------------------------------------------------------------------------------------
# recipe.digest


def test_recipe_text_changed_under_its_digest(made: tuple[Path, Path, Path]) -> None:
    out = made[2]
    rewrite_header(
        out / SINGLE_NAME,
        lambda h: h["artifact"]["recipe"].update(text=h["artifact"]["recipe"]["text"] + "#\n"),
    )
    report = run(out, use_recorded_source=False)
    assert report.exit_code == 6
    [(error, message)] = findings(report, "integrity")
    assert error == "IntegrityError" and "recipe.digest" in message and "hashes to" in message


def test_a_recipe_digest_verify_cannot_check_is_a_finding(made: tuple[Path, Path, Path]) -> None:
    out = made[2]
    rewrite_header(out / SINGLE_NAME, lambda h: h["artifact"]["recipe"].update(digest="md5:00"))
    report = run(out, use_recorded_source=False)
    [(error, message)] = findings(report, "integrity")
    assert error == "IntegrityError" and "not 'sha256:<hex>'" in message


# ---------------------------------------------------------------------------------------------
# source.files, source.config, the side-file list


def test_forged_source_config_is_an_artifact_finding(made: tuple[Path, Path, Path]) -> None:
    out = made[2]
    _edit_source_meta(out, lambda s: s["config"].update(hidden_size=128))
    report = run(out)
    assert report.exit_code == 6
    [(error, message)] = findings(report, "source-identity")
    assert error == "ArtifactError" and "source.config" in message and "forged" in message


def test_changed_source_config_is_a_source_finding(made: tuple[Path, Path, Path]) -> None:
    src, _, out = made
    (src / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 65}))
    report = run(out)
    assert report.exit_code == 4
    got = findings(report, "source-identity")
    assert ("SourceError", "the source's config.json differs from the recorded source.config "
            "(the source changed since conversion, or it is another checkpoint)") in got
    assert any("side file 'config.json' differs" in m for _, m in got)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("shape", [64, 4], "source tensor 'w' is F32 [4, 64], recorded as F32 [64, 4]"),
        ("dtype", "BF16", "source tensor 'w' is F32 [4, 64], recorded as BF16 [4, 64]"),
    ],
)
def test_a_recorded_source_tensor_dtype_or_shape_that_differs_is_a_finding(
    made: tuple[Path, Path, Path], field: str, value: Any, words: str
) -> None:
    out = made[2]
    _edit_source_meta(out, lambda s: s["tensors"]["w"].update({field: value}))
    report = run(out)
    assert report.exit_code == 4
    assert ("SourceError", words) in findings(report, "source-identity")


def test_forged_source_file_sizes_and_names(made: tuple[Path, Path, Path]) -> None:
    out = made[2]

    def edit(s: dict[str, Any]) -> None:
        s["files"][0]["size"] += 1
        s["files"].append({"name": "model-extra.safetensors", "size": 9})

    _edit_source_meta(out, edit)
    report = run(out)
    assert report.exit_code == 4
    messages = [m for _, m in findings(report, "source-identity")]
    assert {f.kind for f in report.check("source-identity").findings} == {"source_mismatch"}
    assert any("'model.safetensors' is" in m and "recorded as" in m for m in messages)
    assert any("'model-extra.safetensors' (9 bytes) is missing" in m for m in messages)


def test_an_emptied_side_file_list_is_caught_with_the_source(
    made: tuple[Path, Path, Path],
) -> None:
    out = made[2]
    rewrite_header(out / SINGLE_NAME, lambda h: h.update(files=[]))
    # Without the source nothing records config.json any more: the forgery is invisible.
    assert run(out, use_recorded_source=False).exit_code == 0
    report = run(out)
    assert report.exit_code == 6
    messages = [m for e, m in findings(report, "source-identity") if e == "ArtifactError"]
    assert len(messages) == 3
    assert "convert writes the side file 'README.md'" in messages[0]  # the generated card
    assert "'config.json', which the artifact does not record" in messages[1]
    assert "'tokenizer.json', which the artifact does not record" in messages[2]


def test_side_files_the_source_lacks_or_changed(made: tuple[Path, Path, Path]) -> None:
    src, _, out = made
    (src / "tokenizer.json").unlink()
    report = run(out)
    assert report.exit_code == 4
    [(error, message)] = findings(report, "source-identity")
    assert error == "SourceError" and "'tokenizer.json', which the source does not have" in message


# ---------------------------------------------------------------------------------------------
# Stray container files


def test_a_stray_shard_beside_model_ninfer_is_a_finding(made: tuple[Path, Path, Path]) -> None:
    out = made[2]
    shutil.copy(out / SINGLE_NAME, out / "model-00001-of-00002.ninfer")
    report = run(out)
    assert report.exit_code == 6
    [(error, message)] = findings(report, "structure")
    assert error == "ArtifactError" and "'model-00001-of-00002.ninfer'" in message
    assert "not part of this artifact" in message
    # The other checks still ran, and passed.
    assert all(c.status == "pass" for c in report.checks if c.name != "structure")


# ---------------------------------------------------------------------------------------------
# Source checks that cannot run


def test_cli_says_loudly_what_did_not_run(
    made: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, _, out = made
    shutil.rmtree(src)
    assert main(["verify", "-q", str(out)]) == 4
    text = capsys.readouterr().out
    assert "NOT RUN: source-words, oracle-sample: the source checks cannot run" in text
    assert "FAIL" in text
    assert main(["verify", "-q", "--json", str(out)]) == 4
    data = json.loads(capsys.readouterr().out)
    assert [n["check"] for n in data["not_run"]] == ["source-words", "oracle-sample"]
    assert data["checks"][4]["findings"][0]["error"] == "SourceError"
    assert main(["verify", "-q", "--no-source", str(out)]) == 0
    text = capsys.readouterr().out
    assert "NOT RUN: source-identity, source-words, oracle-sample: source checks turned off" in text
    assert "3 NOT RUN" in text


def test_an_artifact_without_a_recorded_source_path_fails_without_no_source(
    made: tuple[Path, Path, Path],
) -> None:
    out = made[2]
    _edit_source_meta(out, lambda s: s.update(path=""))
    report = run(out)
    assert report.exit_code == 4
    [(_, message)] = findings(report, "source-identity")
    assert "cannot run: no source path is recorded" in message
    assert run(out, use_recorded_source=False).exit_code == 0


# ---------------------------------------------------------------------------------------------
# Cached repo ids: the snapshot is recorded and verified


COMMIT_1 = "1" * 40
COMMIT_2 = "2" * 40


def _cache_snapshot(cache: Path, repo_id: str, src: Path, commit: str, ref: str) -> Path:
    """The documented hub cache layout: blobs/, refs/<ref>, snapshots/<commit>/ symlinks."""
    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / xxhash.xxh3_64_hexdigest(data)
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    return snap


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return cache


def test_a_repo_id_records_its_snapshot_and_verify_uses_it(
    tmp_path: Path, hub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _write_source(tmp_path / "src")
    snap = _cache_snapshot(hub, "acme/mini-llama", src, COMMIT_1, "main")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    out = tmp_path / "art"
    convert_checkpoint("acme/mini-llama", recipe, out, device="cpu", alignment=64)
    with open_artifact(out) as art:
        source = art.metadata["source"]
    assert source["kind"] == "hf-cache" and source["path"] == "acme/mini-llama"
    assert source["repo"] == {"id": "acme/mini-llama", "revision": None, "commit": COMMIT_1}
    inspected = inspect_artifact(out).to_json()["source"]
    assert inspected["repo"]["commit"] == COMMIT_1 and inspected["kind"] == "hf-cache"

    # From another working directory, with no --source: the recorded snapshot is compared.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    report = run(out)
    assert report.passed and report.source.compared and report.not_run == []
    assert report.source.path == f"acme/mini-llama@{COMMIT_1}"

    # main moves on to another snapshot: verify still checks the converted one.
    other = tmp_path / "src2"
    shutil.copytree(src, other)
    (other / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 1}))
    _cache_snapshot(hub, "acme/mini-llama", other, COMMIT_2, "main")
    assert run(out).passed

    # The converted snapshot gone from the cache: a failure saying so, not a silent skip.
    shutil.rmtree(snap)
    report = run(out)
    assert report.exit_code == 4
    [(error, message)] = findings(report, "source-identity")
    assert error == "SourceError" and "not (completely) present" in message
    assert [n for n, _ in report.not_run] == ["source-words", "oracle-sample"]


def test_a_repo_id_with_a_revision_records_it(tmp_path: Path, hub: Path) -> None:
    src = _write_source(tmp_path / "src")
    _cache_snapshot(hub, "acme/mini-llama", src, COMMIT_1, "v1")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    out = tmp_path / "art"
    convert_checkpoint("acme/mini-llama@v1", recipe, out, device="cpu", alignment=64)
    with open_artifact(out) as art:
        assert art.meta.source.repo is not None
        assert art.meta.source.repo.revision == "v1" and art.meta.source.repo.commit == COMMIT_1
    assert run(out).passed


def test_a_directory_source_records_no_repo(made: tuple[Path, Path, Path]) -> None:
    with open_artifact(made[2]) as art:
        assert "repo" not in art.metadata["source"] and art.meta.source.repo is None
        assert art.metadata["source"]["path"] == str(made[0])


def test_side_files_follow_converts_naming_of_the_model_card(tmp_path: Path) -> None:
    src = _write_source(tmp_path / "src")
    (src / "README.md").write_text("# the source's own card\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    out = tmp_path / "art"
    convert_checkpoint(src, recipe, out, device="cpu", alignment=64)
    with open_artifact(out) as art:
        assert {"README.md", "SOURCE_README.md"} <= set(art.side_files)
    assert run(out).passed
    (src / "README.md").write_text("# changed\n")
    report = run(out)
    assert report.exit_code == 4
    [(error, message)] = findings(report, "source-identity")
    assert error == "SourceError" and "'SOURCE_README.md' differs" in message


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda t: t.update(role="embedding"), "role 'embedding', the recipe gives 'w'"),
        (lambda t: t["provenance"]["rule"].update(line=99), "provenance.rule"),
        (lambda t: t["provenance"].update(constraints=["finite"]), "provenance.constraints"),
        (lambda t: t["provenance"]["sources"][0].update(dtype="BF16"), "provenance.sources"),
        (lambda t: t["provenance"]["sources"][0].update(file="x.safetensors"),
         "provenance.sources"),
    ],
)
def test_forged_tensor_metadata_is_a_finding(
    made: tuple[Path, Path, Path], edit: Any, words: str
) -> None:
    out = made[2]

    def forge(h: dict[str, Any]) -> None:
        [tensor] = [t for t in h["tensors"] if t["name"] == "w"]
        edit(tensor)

    rewrite_header(out / SINGLE_NAME, forge)
    report = run(out)
    assert report.exit_code == 6
    [(error, message)] = findings(report, "source-words")
    assert error == "ArtifactError" and words in message and "recorded recipe" in message
    # The words themselves were still compared (and are equal).
    assert report.check("source-words").tensors == 2


def test_a_deeply_nested_config_json_in_the_artifact_is_no_traceback(
    made: tuple[Path, Path, Path],
) -> None:
    out = made[2]
    deep = b"[" * 5000 + b"]" * 5000
    (out / "config.json").write_bytes(deep)

    def forge(h: dict[str, Any]) -> None:
        [entry] = [f for f in h["files"] if f["name"] == "config.json"]
        entry.update(size=len(deep), digest=xxhash.xxh3_128_hexdigest(deep))
        h["artifact"]["source"]["config"] = {"model_type": "other"}

    rewrite_header(out / SINGLE_NAME, forge)
    report = run(out)
    assert report.exit_code == 4
    messages = [m for _, m in findings(report, "source-identity")]
    assert any("differs from the recorded source.config" in m for m in messages)
    assert any("'config.json' differs from the recorded one" in m for m in messages)
