"""The generated model card: README.md of a converted directory, and the kept source card."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from recipe_fixtures import RECIPE_HEAD

from ninfer_convert import open_artifact
from ninfer_convert.cli import main
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.errors import SourceError, UsageError
from ninfer_convert.recipe import RecipeProblems, loads_recipe
from ninfer_convert.verify import verify_artifact

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-qwen3.5"
QWEN_RECIPE = ROOT / "recipes" / "qwen3.6-27b.yaml"
SOURCE_CARD = b"---\nlicense: apache-2.0\n---\n# The source's own card\n\nKeep me byte for byte.\n"


def _source_with_card(tmp_path: Path, *names: str) -> Path:
    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src)
    for name in names:
        (src / name).write_bytes(SOURCE_CARD + name.encode())
    return src


def _recipe_without_readme(tmp_path: Path) -> Path:
    text = QWEN_RECIPE.read_text().replace("\nrules:\n", "\noutput:\n  readme: false\n\nrules:\n")
    assert "readme: false" in text
    path = tmp_path / "no-readme.yaml"
    path.write_text(text)
    return path


def test_convert_writes_a_card_and_keeps_the_source_card(tmp_path: Path) -> None:
    src = _source_with_card(tmp_path, "README.md")
    out = tmp_path / "out"
    report = convert_checkpoint(src, QWEN_RECIPE, out, device="cpu", jobs=1)
    assert (out / "SOURCE_README.md").read_bytes() == SOURCE_CARD + b"README.md"
    card = (out / "README.md").read_text()
    plan = report.plan
    assert f"`{plan.recipe.name}` version 1, digest `{plan.recipe.digest}`" in card
    assert f"`{src.absolute()}` (hf-dir)" in card
    assert "kept unchanged as `SOURCE_README.md`" in card
    for t in plan.totals:
        row = f"| {t.format} | {t.tensors} | {t.weights:,} | {t.encoded_bytes:,} | "
        assert row + f"{t.bits_per_weight:.3f} |" in card, t.format
    assert f"| all | {len(plan.entries)} | {plan.total_weights:,} |" in card
    assert "| mlp-down | Q5G64_F16S | 4 | 46,080 | 9.333 |" in card
    assert "ninfer verify . --no-source" in card and "does not measure model quality" in card
    # Both are side files: listed with their digests in the header, checked by verify.
    with open_artifact(out) as art:
        assert {"README.md", "SOURCE_README.md"} <= set(art.side_files)
    assert verify_artifact(out, device="cpu").passed


def test_card_is_byte_identical_across_runs_and_jobs(tmp_path: Path) -> None:
    a = convert_checkpoint(EXAMPLE, QWEN_RECIPE, tmp_path / "a", device="cpu", jobs=1).output
    b = convert_checkpoint(EXAMPLE, QWEN_RECIPE, tmp_path / "b", device="cpu", jobs=3).output
    assert (a / "README.md").read_bytes() == (b / "README.md").read_bytes()
    assert (a / "model.ninfer").read_bytes() == (b / "model.ninfer").read_bytes()
    assert not (a / "SOURCE_README.md").exists()


def test_editing_the_card_fails_integrity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = convert_checkpoint(EXAMPLE, QWEN_RECIPE, tmp_path / "o", device="cpu", jobs=1).output
    with open(out / "README.md", "a") as f:
        f.write("edited\n")
    code = main(["verify", str(out), "--no-source", "-q"])
    assert code == 6
    assert "side file 'README.md'" in capsys.readouterr().out


def test_readme_false_copies_the_source_card_under_its_own_name(tmp_path: Path) -> None:
    src = _source_with_card(tmp_path, "README.md")
    out = convert_checkpoint(
        src, _recipe_without_readme(tmp_path), tmp_path / "o", device="cpu", jobs=1
    ).output
    assert (out / "README.md").read_bytes() == SOURCE_CARD + b"README.md"
    assert not (out / "SOURCE_README.md").exists()


def test_readme_false_without_a_source_card_writes_no_readme(tmp_path: Path) -> None:
    out = convert_checkpoint(
        EXAMPLE, _recipe_without_readme(tmp_path), tmp_path / "o", device="cpu", jobs=1
    ).output
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.ninfer"
    ]  # fmt: skip


@pytest.mark.parametrize(
    "names", [("README.md", "SOURCE_README.md"), ("readme.md", "SOURCE_README.md")]
)
def test_a_card_name_clash_is_refused_before_writing(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    src = _source_with_card(tmp_path, *names)
    with pytest.raises(UsageError) as info:
        convert_checkpoint(src, QWEN_RECIPE, tmp_path / "o", device="cpu")
    assert "readme: false" in str(info.value)
    assert not (tmp_path / "o").exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_a_dry_run_refuses_a_card_name_clash_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _source_with_card(tmp_path, "README.md", "SOURCE_README.md")
    code = main(["convert", str(src), "--recipe", str(QWEN_RECIPE), "--dry-run"])
    assert code == UsageError.exit_code
    assert "SOURCE_README.md" in capsys.readouterr().err


def test_two_source_cards_differing_in_case_are_a_source_error(tmp_path: Path) -> None:
    # readme.md beside README.md would be one file on macOS or Windows (docs/cli.md, "Side
    # files"): the source scan refuses them before the card is considered.
    src = _source_with_card(tmp_path, "readme.md", "README.md")
    with pytest.raises(SourceError, match="same name on a case-insensitive"):
        convert_checkpoint(src, QWEN_RECIPE, tmp_path / "o", device="cpu")
    assert not (tmp_path / "o").exists()


def test_a_lowercase_source_card_is_kept_too(tmp_path: Path) -> None:
    src = _source_with_card(tmp_path, "readme.md")
    out = convert_checkpoint(src, QWEN_RECIPE, tmp_path / "o", device="cpu", jobs=1).output
    assert (out / "SOURCE_README.md").read_bytes() == SOURCE_CARD + b"readme.md"
    assert sorted(p.name for p in out.iterdir() if "readme" in p.name.lower()) == [
        "README.md", "SOURCE_README.md"
    ]  # fmt: skip


def test_identity_override_is_stated_in_the_card(tmp_path: Path) -> None:
    text = QWEN_RECIPE.read_text().replace(
        "  model_type: qwen3_5\n", "  model_type: qwen3_5\n  tensor_count: 7\n"
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    out = convert_checkpoint(
        EXAMPLE, recipe, tmp_path / "o", device="cpu", jobs=1, check_identity=False
    ).output
    card = (out / "README.md").read_text()
    assert "identity checks were overridden" in card and "recipe expects 7" in card


def _recipe(output: str) -> str:
    body = "- match: w\n  format: BF16\n  role: r\n"
    return RECIPE_HEAD.replace("rules:\n", textwrap.dedent(output) + "rules:\n") + body


def test_output_section_is_parsed() -> None:
    assert loads_recipe(_recipe("")).output.readme is True
    assert loads_recipe(_recipe("output: {readme: false}\n")).output.readme is False
    assert loads_recipe(_recipe("output: {readme: true}\n")).output.readme is True
    assert loads_recipe(_recipe("output: {}\n")).output.readme is True


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("output: {readme: 0}\n", "output.readme must be true or false"),
        ("output: {readme: false, card: x}\n", "output: unknown key 'card' (allowed: readme)"),
        ("output: false\n", "output must be a mapping"),
    ],
)
def test_bad_output_section_is_a_recipe_problem(output: str, message: str) -> None:
    with pytest.raises(RecipeProblems) as info:
        loads_recipe(_recipe(output))
    assert any(message in p.message for p in info.value.problems), info.value.problems


def test_card_of_a_bare_safetensors_file_source(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.ones(4, 16, dtype=torch.bfloat16)}, str(tmp_path / "m.safetensors"))
    recipe = tmp_path / "r.yaml"
    body = (
        "- match: w\n  format: Q4G64_F16S\n  encoder_profile: MAXABS_F16_RECIP_RNE_V1\n"
        "  role: r\n  evidence: [e1]\n"
    )
    recipe.write_text(RECIPE_HEAD.replace("  model_type: llama\n", "  tensor_count: 1\n") + body)
    report = convert_checkpoint(tmp_path / "m.safetensors", recipe, tmp_path / "o", device="cpu")
    assert report.files == ("README.md", "model.ninfer")
    card = (tmp_path / "o" / "README.md").read_text()
    assert "config.json" not in card.split("## Recipe")[0]
    assert "- 1 source tensor in 1 weight file (200 bytes);" in card
    assert "| r | Q4G64_F16S | 1 | 64 | 34.000 | e1 |" in card
    assert "1 tensor more than 10 % above the nominal bits per weight" in card
    assert "- `w` Q4G64_F16S [4, 16]: 34.000 bits per weight (nominal 4.25)" in card
