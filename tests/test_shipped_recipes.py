"""Shipped recipes: packaging, registry by name, --recipe resolution, identity auto-pick,
``ninfer recipes``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from doc_schema import doc_example, same_shape
from recipe_fixtures import RECIPE_HEAD
from test_recipe_plan import make_source, plan_problems

from ninfer_convert.cli import main
from ninfer_convert.errors import RecipeError, UsageError
from ninfer_convert.recipe import (
    RecipeProblems,
    identity_problems,
    loads_recipe,
    lookup_shipped,
    matching_recipes,
    resolve_recipe,
    shipped_recipe_dir,
    shipped_recipes,
)
from ninfer_convert.source import open_source

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
BF16_EXAMPLE = ROOT / "examples" / "tiny-qwen3.5"
NVFP4_EXAMPLE = ROOT / "examples" / "tiny-qwen3.5-nvfp4"
CLI_DOC = ROOT / "docs" / "cli.md"
BODY = "- match: w\n  format: BF16\n  role: r\n"


def _recipe_text(name: str, source: str = "  model_type: llama\n") -> str:
    return (
        RECIPE_HEAD.replace("name: t\n", f"name: {name}\n").replace("  model_type: llama\n", source)
        + BODY
    )


def _dir(tmp_path: Path, **recipes: str) -> Path:
    d = tmp_path / "shipped"
    d.mkdir()
    for stem, text in recipes.items():
        (d / f"{stem}.yaml").write_text(text)
    return d


# ---------------------------------------------------------------------------------------------
# packaging


def test_pyproject_lists_every_package_and_maps_the_recipes_folder() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "ninfer_convert").rglob("__init__.py")
    }
    assert set(config["packages"]) == found | {"ninfer_convert.recipes"}
    assert config["package-dir"] == {"ninfer_convert.recipes": "recipes"}
    assert config["package-data"]["ninfer_convert.recipes"] == ["*.yaml"]
    assert not (ROOT / "ninfer_convert" / "recipes").exists()  # one copy of each recipe in git


def test_checkout_reads_the_top_level_recipes_folder() -> None:
    assert shipped_recipe_dir() == RECIPES
    assert [s.name for s in shipped_recipes()] == sorted(p.stem for p in RECIPES.glob("*.yaml"))


@pytest.mark.slow
def test_a_non_editable_install_ships_the_recipes(tmp_path: Path) -> None:
    """pip install . (not -e) into a fresh venv that sees this environment's site-packages
    only through a .pth file; then run it from a directory without the checkout."""
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # This environment's setuptools builds offline when it is new enough for pyproject.toml;
    # otherwise (a venv's bundled setuptools) pip builds in isolation, as .ci/run's install does.
    major = int(importlib.metadata.version("setuptools").split(".")[0])
    isolation = ["--no-build-isolation"] if major >= 77 else []
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", *isolation, str(ROOT)],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    out = subprocess.run(
        [venv / "bin" / "ninfer", "recipes", "--json"],
        check=True, env=env, capture_output=True, text=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    doc = json.loads(out)
    assert Path(doc["directory"]) == Path(purelib) / "ninfer_convert" / "recipes"
    assert [r["name"] for r in doc["recipes"]] == [s.name for s in shipped_recipes()]
    for r in doc["recipes"]:
        assert Path(r["path"]).read_bytes() == (RECIPES / Path(r["path"]).name).read_bytes()


# ---------------------------------------------------------------------------------------------
# the registry


def test_shipped_recipes_are_registered_by_their_name(tmp_path: Path) -> None:
    d = _dir(tmp_path, b=_recipe_text("b"), a=_recipe_text("a"))
    (d / "notes.txt").write_text("not a recipe")
    assert [s.name for s in shipped_recipes(d)] == ["a", "b"]
    assert lookup_shipped("a", d).path == d / "a.yaml"


def test_a_shipped_recipe_named_unlike_its_file_is_refused(tmp_path: Path) -> None:
    d = _dir(tmp_path, a=_recipe_text("other"))
    with pytest.raises(RecipeError, match=r"name 'other' in a\.yaml"):
        shipped_recipes(d)


def test_a_broken_shipped_recipe_is_refused_not_skipped(tmp_path: Path) -> None:
    d = _dir(tmp_path, a=_recipe_text("a"), b="ninfer_recipe: 1\nname: b\n")
    with pytest.raises(RecipeError, match="a shipped recipe does not load"):
        shipped_recipes(d)


def test_unknown_shipped_name_lists_the_names(tmp_path: Path) -> None:
    d = _dir(tmp_path, a=_recipe_text("a"), b=_recipe_text("b"))
    with pytest.raises(UsageError) as info:
        lookup_shipped("A", d)  # exact comparison: no case folding
    assert "shipped recipes: a, b" in str(info.value)


# ---------------------------------------------------------------------------------------------
# --recipe NAME | PATH


def test_recipe_argument_is_a_path_or_a_shipped_name(tmp_path: Path) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text(_recipe_text("mine"))
    by_path = resolve_recipe(str(own))
    assert (by_path.how, by_path.path, by_path.name) == ("path", own, None)
    by_name = resolve_recipe("qwen3.6-27b")
    assert (by_name.how, by_name.path) == ("name", RECIPES / "qwen3.6-27b.yaml")
    assert by_name.name == "qwen3.6-27b"


def test_an_existing_file_wins_over_a_shipped_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen3.6-27b").write_text(_recipe_text("local"))
    assert resolve_recipe("qwen3.6-27b").how == "path"


@pytest.mark.parametrize("spec", ["qwen3.6", "recipes/missing.yaml", "QWEN3.6-27B"])
def test_neither_file_nor_name_is_a_usage_error_listing_the_names(spec: str) -> None:
    with pytest.raises(UsageError) as info:
        resolve_recipe(spec)
    text = str(info.value)
    assert f"--recipe {spec!r} is neither a recipe file nor a shipped recipe name" in text
    assert (
        "generic-dense, generic-dense-gptq, generic-dense-iw, qwen3.6-27b, qwen3.6-27b-gptq, "
        "qwen3.6-27b-iw, qwen3.6-27b-nvfp4" in text
    )


# ---------------------------------------------------------------------------------------------
# picking by identity


@pytest.mark.parametrize(
    ("example", "name"), [(BF16_EXAMPLE, "qwen3.6-27b"), (NVFP4_EXAMPLE, "qwen3.6-27b-nvfp4")]
)
def test_each_committed_example_matches_exactly_one_shipped_recipe(
    example: Path, name: str
) -> None:
    src = open_source(example)
    assert [s.name for s in matching_recipes(src)] == [name]
    picked = resolve_recipe(None, src)
    assert (picked.how, picked.name) == ("identity", name)


def test_no_matching_recipe_lists_every_candidate_and_why(tmp_path: Path) -> None:
    import torch

    src = make_source(tmp_path / "m", {"w": torch.ones(2)}, {"model_type": "mistral"})
    d = _dir(tmp_path, a=_recipe_text("a"), b=_recipe_text("b", "  model_type: gpt2\n"))
    with pytest.raises(UsageError) as info:
        resolve_recipe(None, src, directory=d)
    text = str(info.value)
    assert "no shipped recipe matches the source" in text and "'mistral'" in text
    assert "\n  a: config.json model_type is 'mistral', the recipe is for 'llama'" in text
    assert "\n  b: config.json model_type is 'mistral', the recipe is for 'gpt2'" in text


def test_several_matching_recipes_are_a_usage_error_naming_them(tmp_path: Path) -> None:
    import torch

    src = make_source(tmp_path / "m", {"w": torch.ones(2)})
    d = _dir(
        tmp_path, a=_recipe_text("a"), b=_recipe_text("b"), c=_recipe_text("c", "  model_type: x\n")
    )
    with pytest.raises(UsageError) as info:
        resolve_recipe(None, src, directory=d)
    assert "2 shipped recipes match the source" in str(info.value)
    assert ": a, b" in str(info.value) and "--recipe NAME" in str(info.value)


def test_one_matching_recipe_is_picked(tmp_path: Path) -> None:
    import torch

    src = make_source(tmp_path / "m", {"w": torch.ones(2)})
    d = _dir(tmp_path, a=_recipe_text("a", "  model_type: x\n"), b=_recipe_text("b"))
    assert resolve_recipe(None, src, directory=d).path == d / "b.yaml"


# ---------------------------------------------------------------------------------------------
# source.config_absent


def test_config_absent_refuses_a_source_that_has_the_key(tmp_path: Path) -> None:
    import torch

    cfg = {"model_type": "llama", "quantization_config": None, "a": {"b": 1}}
    src = make_source(tmp_path / "m", {"w": torch.ones(2, dtype=torch.bfloat16)}, cfg)
    head = RECIPE_HEAD.replace(
        "  model_type: llama\n",
        "  model_type: llama\n  config_absent: [quantization_config, a.b, c]\n",
    )
    problems = plan_problems(BODY, src, head)
    assert [m for _, m in problems] == [
        f"source identity: config.json has {k!r}, the recipe is for sources without it"
        for k in ("quantization_config", "a.b")
    ]
    assert len(identity_problems(loads_recipe(head + BODY), src)) == 2


@pytest.mark.parametrize(
    ("absent", "message"),
    [
        ("config_absent: [a..b]", "source.config_absent: 'a..b' is not a dotted key"),
        ("config_absent: []", "source.config_absent must be a string or a non-empty list"),
        (
            "config: {a: 1}\n  config_absent: a",
            "source.config_absent: 'a' is also under source.config",
        ),
    ],
)
def test_bad_config_absent_is_a_recipe_problem(absent: str, message: str) -> None:
    head = RECIPE_HEAD.replace("  model_type: llama\n", f"  model_type: llama\n  {absent}\n")
    with pytest.raises(RecipeProblems) as info:
        loads_recipe(head + BODY)
    assert any(message in p.message for p in info.value.problems), info.value.problems


# ---------------------------------------------------------------------------------------------
# the command line


def test_convert_without_recipe_picks_and_names_the_shipped_recipe(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["convert", str(NVFP4_EXAMPLE), "--dry-run", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert json.loads(out)["recipe"]["name"] == "qwen3.6-27b-nvfp4"
    assert "Using the shipped recipe qwen3.6-27b-nvfp4, the only one whose source identity" in err


def test_convert_with_a_shipped_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    code = main(["convert", str(BF16_EXAMPLE), "--recipe", "qwen3.6-27b", "--output", str(out),
                 "--device", "cpu", "--json"])  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["recipe"]["name"] == "qwen3.6-27b"
    assert summary["recipe"]["digest"] == lookup_shipped("qwen3.6-27b").recipe.digest


def test_convert_with_an_unknown_name_exits_2_listing_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["convert", str(BF16_EXAMPLE), "--recipe", "qwen", "--dry-run"])
    err = capsys.readouterr().err
    assert code == UsageError.exit_code == 2
    assert "qwen3.6-27b-nvfp4" in err and "Traceback" not in err


def test_ignore_identity_needs_an_explicit_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["convert", str(BF16_EXAMPLE), "--dry-run", "--ignore-identity"])
    assert code == 2 and "--ignore-identity needs --recipe" in capsys.readouterr().err


def test_recipes_json_matches_the_documented_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["recipes", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    same_shape(
        doc_example(CLI_DOC, "### `recipes --json`"),
        doc,
        free=frozenset({"recipes[].identity.config", "recipes[].identity.shapes"}),
    )
    assert doc["directory"] == str(RECIPES)
    by_name = {r["name"]: r for r in doc["recipes"]}
    assert list(by_name) == [
        "generic-dense", "generic-dense-gptq", "generic-dense-iw", "qwen3.6-27b",
        "qwen3.6-27b-gptq", "qwen3.6-27b-iw", "qwen3.6-27b-nvfp4",
    ]  # fmt: skip
    q = by_name["qwen3.6-27b"]
    assert q["identity"]["model_type"] == ["qwen3_5"]
    assert q["identity"]["config_absent"] == ["quantization_config"]
    assert q["identity"]["config"]["text_config.linear_conv_kernel_dim"] == 4
    formats = {f["format"]: f for f in q["formats"]}
    assert list(formats) == ["BF16", "Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
    assert formats["Q5G64_F16S"] == {
        "format": "Q5G64_F16S", "nominal_bits_per_weight": 5.25, "roles": ["mlp-down"]
    }  # fmt: skip
    assert "NVFP4" in {f["format"] for f in by_name["qwen3.6-27b-nvfp4"]["formats"]}


def test_recipes_table_lists_names_identity_and_formats(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "qwen3.6-27b-nvfp4" in out and "quantization_config" in out
    assert "Q5G64_F16S (5.25)" in out and "model_type llama | qwen3" in out
