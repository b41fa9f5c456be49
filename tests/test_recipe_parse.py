"""Recipe loading: schema, closed names, line numbers, every problem reported together."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recipe_fixtures import RECIPE_HEAD, RECIPE_HEAD_LINES

from ninfer_convert.errors import RecipeError
from ninfer_convert.recipe import (
    RecipeProblems,
    compile_pattern,
    compile_template,
    load_recipe,
    loads_recipe,
    parse_recipe,
)

REPO = Path(__file__).resolve().parents[1]

HEAD = RECIPE_HEAD
HEAD_LINES = RECIPE_HEAD_LINES  # the first rule starts on line HEAD_LINES + 1


def problems(body: str, head: str = HEAD) -> list[tuple[int | None, str]]:
    _recipe, found = parse_recipe(head + textwrap.dedent(body))
    return [(p.line, p.message) for p in found]


def only(body: str) -> tuple[int | None, str]:
    found = problems(body)
    assert len(found) == 1, found
    return found[0]


def test_shipped_generic_recipe_loads() -> None:
    path = REPO / "recipes" / "generic-dense.yaml"
    recipe = load_recipe(path)
    text = path.read_text(encoding="utf-8")
    assert recipe.text == text
    assert recipe.digest == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert recipe.name == "generic-dense" and recipe.version == "1" and recipe.schema == 1
    assert recipe.source.architectures == ("LlamaForCausalLM", "Qwen3ForCausalLM")
    assert {e.id for e in recipe.evidence} >= {"llama-cpp-q4-k-m"}
    assert recipe.rules[0].kind == "skip"
    assert all(r.line > 0 for r in recipe.rules)


def test_minimal_rule_fields() -> None:
    recipe = loads_recipe(
        HEAD
        + textwrap.dedent("""\
        - match: 're:.*\\.weight'
          format: Q4G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: w
          evidence: e1
        - skip: bias
          reason: unused
        """)
    )
    r0, r1 = recipe.rules
    assert (r0.kind, r0.line, r0.format, r0.encoder_profile, r0.evidence) == (
        "match",
        HEAD_LINES + 1,
        "Q4G64_F16S",
        "MAXABS_F16_RECIP_RNE_V1",
        ("e1",),
    )
    assert r0.pattern is not None and r0.pattern.kind == "regex"
    assert (r1.kind, r1.line, r1.reason) == ("skip", HEAD_LINES + 6, "unused")


@pytest.mark.parametrize(
    "name",
    ["FP16", "INT32", "Q4G32_F16S", "q4g64_f16s", "Q4", "FP8_E4M3FN", "I64", "BF16 ", "W8G64_F16S"],
)
def test_unknown_format_names_rejected(name: str) -> None:
    line, msg = only(f"""\
        - match: a
          format: '{name}'
          role: r
        """)
    assert line == HEAD_LINES + 2
    assert f"unknown numeric format {name!r}" in msg and "never parsed apart" in msg


def test_every_recipe_problem_reported_together_with_lines() -> None:
    body = """\
        - match: a
          format: FP16
          role: r
        - match: b
          format: Q4G64_F16S
          encoder_profile: NOT_A_PROFILE
          role: r
          evidence: [e1]
        - match: c
          format: BF16
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: r
        - match: d
          format: Q5G64_F16S
          role: r
          evidence: [e1]
        - match: e
          format: BF16
          role: r
          colour: blue
        - match: 're:(unclosed'
          format: BF16
          role: r
        - match: f
          format: Q6G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: r
        - match: g
          format: NVFP4
          role: r
        - skip: h
        - match: i
          format: BF16
          conversion: bf16-to-f32
          role: r
        """
    found = problems(body)
    base = HEAD_LINES
    expect = [
        (base + 2, "unknown numeric format 'FP16'"),
        (base + 6, "unknown encoder profile 'NOT_A_PROFILE'"),
        (base + 11, "BF16 takes no encoder_profile"),
        (base + 14, "Q5G64_F16S needs an encoder_profile"),
        (base + 20, "unknown key 'colour'"),
        (base + 21, "invalid regular expression"),
        (base + 24, "needs cited evidence"),
        (base + 29, "NInfer has no encoder into NVFP4"),
        (base + 31, "missing required key 'reason'"),
        (base + 34, "conversion bf16-to-f32 produces FP32, not BF16"),
    ]
    assert len(found) == len(expect), found
    for (line, needle), (got_line, got_msg) in zip(expect, found, strict=True):
        assert got_line == line and needle in got_msg, (line, needle, got_line, got_msg)
    with pytest.raises(RecipeProblems) as info:
        loads_recipe(HEAD + textwrap.dedent(body), path="x.yaml")
    err = info.value
    assert isinstance(err, RecipeError) and err.exit_code == 3
    assert len(err.problems) == len(expect)
    assert str(err).startswith(
        f"x.yaml: {len(expect)} problems in the recipe (nothing was converted):"
    )
    assert f"line {base + 2}: rule 1 (match): unknown numeric format" in str(err)


@pytest.mark.parametrize(
    ("body", "line", "needle"),
    [
        (
            "- match: a\n  format: Q4G64_F16S\n  encoder_profile: MAXABS_F16_RECIP_RNE_V1\n"
            "  role: r\n  conversion: f32-to-bf16-rne\n  evidence: e1\n",
            5,
            "Q4G64_F16S takes no conversion",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  conversion: f99-to-bf16\n",
            4,
            "unknown conversion 'f99-to-bf16'",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  keep_nonfinite: true\n",
            4,
            "keep_nonfinite applies only with a rounding conversion",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  conversion: f32-to-bf16-rne\n"
            "  evidence: e1\n  keep_nonfinite: true\n  constraints: [finite-only]\n",
            7,
            "contradicts keep_nonfinite",
        ),
        (
            "- match: a\n  format: I32\n  role: r\n  constraints: [finite-only]\n",
            4,
            "does not apply to I32",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  constraints: [sorted]\n",
            4,
            "unknown constraint 'sorted'",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  evidence: [nope]\n",
            4,
            "evidence 'nope' is not defined",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  conversion: f32-to-bf16-rne\n",
            1,
            "a lossy choice (a rounding conversion) needs cited evidence",
        ),
        (
            "- match: a\n  format: FP32\n  role: r\n  conversion: [bf16-to-f32, bf16-to-f32]\n",
            4,
            "both take BF16",
        ),
        (
            "- match: a\n  copy: compressed-tensors-nvfp4\n  format: FP8_E4M3FN_ROW_BF16S\n"
            "  role: r\n",
            3,
            "produces NVFP4, not FP8_E4M3FN_ROW_BF16S",
        ),
        ("- match: a\n  copy: gptq\n  format: NVFP4\n  role: r\n", 2, "unknown copy path 'gptq'"),
        (
            "- match: a\n  copy: modelopt-nvfp4\n  format: NVFP4\n  role: r\n"
            "  encoder_profile: MAXABS_F16_RECIP_RNE_V1\n",
            5,
            "unknown key 'encoder_profile'",
        ),
        ("- match: a\n  skip: a\n  reason: x\n", 1, "exactly one of 'match', 'derive' or 'skip'"),
        ("- format: BF16\n  role: r\n", 1, "exactly one of"),
        ("- match: a\n  format: BF16\n", 1, "missing required key 'role'"),
        ("- match: ''\n  format: BF16\n  role: r\n", 1, "must be a non-empty string"),
        ("- match: a\n  format: BF16\n  role: r\n  optional: 'yes'\n", 4, "true or false"),
        (
            "- match: a\n  format: BF16\n  role: r\n  transforms: [flip]\n",
            4,
            "unknown transform 'flip'",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  transforms: [{reshape: [1, 2, 3]}]\n",
            4,
            "reshape must give rank two",
        ),
        (
            "- match: a\n  format: BF16\n  role: r\n  transforms: [{reshape: [-1, -1]}]\n",
            4,
            "at most one dimension",
        ),
        (
            "- derive: 'x.{L}'\n  inputs: ['a.{L}', 'b.{L}']\n  format: BF16\n  role: r\n",
            1,
            "2 inputs need a concat_axis",
        ),
        (
            "- derive: 'x.{L}'\n  inputs: ['a.{L}']\n  concat_axis: 0\n  format: BF16\n  role: r\n",
            3,
            "concat_axis needs two or more inputs",
        ),
        (
            "- derive: 'x.{L}'\n  inputs: ['a.{M}']\n  format: BF16\n  role: r\n",
            2,
            "they must be the same",
        ),
        (
            "- derive: 'x.{L'\n  inputs: ['a.{L}']\n  format: BF16\n  role: r\n",
            1,
            "malformed placeholder",
        ),
        (
            "- derive: 'x.{L}'\n  inputs: ['a.{L}', 'a.{L}']\n  concat_axis: 0\n  format: BF16\n"
            "  role: r\n",
            2,
            "is listed twice",
        ),
        ("- skip: a\n  reason: x\n  role: r\n", 3, "unknown key 'role'"),
        ("- 'just a string'\n", 1, "must be a mapping"),
    ],
)
def test_single_rule_problems(body: str, line: int, needle: str) -> None:
    got_line, msg = only(body)
    assert got_line == HEAD_LINES + line and needle in msg, (got_line, msg)


@pytest.mark.parametrize(
    ("head", "line", "needle"),
    [
        (HEAD.replace("ninfer_recipe: 1", "ninfer_recipe: 2"), 1, "not a recipe-language version"),
        (HEAD.replace('version: "1"', "version: true"), 3, "version must be a string"),
        (HEAD.replace("name: t", "name: ''"), 2, "name must be a non-empty string"),
        (
            HEAD.replace("  model_type: llama", "  model_type: [llama, 3]"),
            5,
            "must be a non-empty string",
        ),
        (HEAD.replace("  model_type: llama", "  tensor_count: -1"), 5, "integer >= 0"),
        (HEAD.replace("  model_type: llama", "  shapes: {a: [2, x]}"), 5, "non-negative integers"),
        (HEAD.replace("  model_type: llama", "  wrong: 1"), 5, "unknown key 'wrong'"),
        (HEAD.replace("  - id: e1", "  - id: 'e 1'"), 7, "must match"),
        (HEAD.replace("    summary: something\n", ""), 7, "missing required key 'summary'"),
        (HEAD.replace("rules:", "extra: 1\nrules:"), HEAD_LINES, "unknown key 'extra'"),
    ],
)
def test_top_level_problems(head: str, line: int, needle: str) -> None:
    found = problems("- skip: a\n  reason: x\n", head=head)
    assert any(got == line and needle in msg for got, msg in found), found


def test_duplicate_keys_reported_with_other_problems() -> None:
    found = problems("""\
        - match: a
          format: BF16
          format: FP32
          role: r
        - match: b
          format: FP99
          role: r
        """)
    assert (HEAD_LINES + 3, "duplicate key 'format' (first at line 12)") in found
    assert any(line == HEAD_LINES + 6 and "FP99" in msg for line, msg in found)


def test_duplicate_evidence_id() -> None:
    head = HEAD.replace("rules:\n", "  - id: e1\n    citation: c\n    summary: s\nrules:\n")
    found = problems("- skip: a\n  reason: x\n", head=head)
    assert found == [(10, "evidence id 'e1' is defined twice (first at line 7)")]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: [1\n", "YAML syntax"),
        ("a: &x 1\nb: *x\n", "aliases"),
        ("", "empty"),
        ("- 1\n", "must be a mapping"),
        ("a: 1\n---\nb: 2\n", "YAML syntax"),
    ],
)
def test_unusable_documents(text: str, needle: str) -> None:
    recipe, found = parse_recipe(text)
    assert recipe is None
    assert any(needle in p.message for p in found), found


def test_unsafe_yaml_tags_rejected() -> None:
    found = problems("- match: !!python/object:os.system a\n  format: BF16\n  role: r\n")
    assert any("YAML tag" in msg for _line, msg in found)


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="cannot read"):
        load_recipe(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: \xff\n")
    with pytest.raises(RecipeError, match="not UTF-8"):
        load_recipe(bad)


def test_patterns() -> None:
    exact = compile_pattern("model.norm.weight")
    assert exact.kind == "exact"
    assert exact.matches("model.norm.weight") and not exact.matches("modelXnorm.weight")
    glob = compile_pattern("model.layers.*.weight")
    assert glob.kind == "glob" and glob.matches("model.layers.3.mlp.weight")
    assert not glob.matches("Model.layers.3.weight")  # case-sensitive
    regex = compile_pattern(r"re:model\.layers\.\d+\.mlp\..*_proj\.weight")
    assert regex.kind == "regex"
    assert regex.matches("model.layers.12.mlp.down_proj.weight")
    assert not regex.matches("model.layers.12.mlp.down_proj.weight_scale")  # anchored at the end
    assert not regex.matches("x.model.layers.1.mlp.a_proj.weight")  # anchored at the start
    with pytest.raises(ValueError, match="empty"):
        compile_pattern("re:")


def test_templates() -> None:
    t = compile_template("model.layers.{L}.self_attn.{P}_proj.weight")
    assert t.variables == frozenset({"L", "P"})
    assert t.match("model.layers.7.self_attn.q_proj.weight") == {"L": "7", "P": "q"}
    assert t.match("model.layers.7.x.self_attn.q_proj.weight") is None  # {L} is one component
    assert t.format({"L": "3", "P": "k"}) == "model.layers.3.self_attn.k_proj.weight"
    assert compile_template("a.[x].{L}").match("a.[x].2") == {"L": "2"}  # literal text is literal
    same = compile_template("{L}.{L}")
    assert same.match("1.1") == {"L": "1"} and same.match("1.2") is None


@settings(max_examples=300)
@given(st.data())
def test_fuzzed_recipes_never_crash(data: st.DataObject) -> None:
    """Mutated recipes give problems (or a recipe), never an unexpected exception."""
    text = list((REPO / "recipes" / "generic-dense.yaml").read_text(encoding="utf-8"))
    alphabet = st.sampled_from([*" :-'\"[]{}\n#*&!|>\\0aZ\t%@`,?", "\u00e9", "\x00", "\x85"])
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(text) - 1))
        if data.draw(st.booleans()):
            text[i] = data.draw(alphabet)
        else:
            del text[i]
    recipe, found = parse_recipe("".join(text))
    assert recipe is not None or found
    for p in found:
        assert isinstance(p.message, str) and (p.line is None or p.line >= 1)


def test_problems_of_one_rule_come_in_the_documented_order() -> None:
    """Within one rule: keys, pattern, role, format, copy path, encoder profile, copy-only
    format, conversions, keep_nonfinite, constraints, transforms, evidence (recipe/parse_rule.py);
    every message pinned whole, in order."""
    body = """\
        - match: ''
          format: NVFP4
          role: ''
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          conversion: [no-such, f32-to-bf16-rne]
          keep_nonfinite: true
          constraints: [finite-only, finite-only, sparse]
          transforms: [flip, {reshape: [2, -1, -1]}]
          evidence: [nope]
          colour: blue
        - match: a
          copy: gptq
          format: BF16
          role: r
          encoder_profile: X
        - derive: 'o.{i}'
          inputs: ['a.{i}', 'b.{j}', 'a.{i}']
          format: W8G32_F16S
          role: r
        """
    base = HEAD_LINES
    assert problems(body) == [
        (
            base + 10,
            "rule 1 (match): unknown key 'colour' (allowed: constraints, conversion, "
            "encoder_profile, evidence, fallback_profile, format, keep_nonfinite, match, "
            "optional, role, transforms)",
        ),
        (base + 1, "rule 1 (match): pattern must be a non-empty string, not ''"),
        (base + 3, "rule 1 (match): role must be a non-empty string, not ''"),
        (
            base + 4,
            "rule 1 (match): NVFP4 takes no encoder_profile (only the grouped formats are "
            "encoded; direct formats store words, NVFP4 and FP8 row are copied)",
        ),
        (
            base + 2,
            "rule 1 (match): NInfer has no encoder into NVFP4; a recipe can only copy "
            "already-quantized words with copy: compressed-tensors-nvfp4 or modelopt-nvfp4",
        ),
        (
            base + 5,
            "rule 1 (match): unknown conversion 'no-such' (known: f32-to-bf16-rne, "
            "f16-to-bf16-rne, bf16-to-f32, f16-to-f32, int-to-i32)",
        ),
        (
            base + 5,
            "rule 1 (match): NVFP4 takes no conversion (conversions apply to direct "
            "formats; grouped encoders widen BF16/F16/F32 exactly)",
        ),
        (base + 7, "rule 1 (match): unknown constraint 'sparse' (known: finite-only)"),
        (base + 7, "rule 1 (match): a constraint is listed twice"),
        (base + 7, "rule 1 (match): finite-only contradicts keep_nonfinite: true"),
        (
            base + 8,
            "rule 1 (match): unknown transform 'flip' (known: transpose, {reshape: [rows, cols]})",
        ),
        (base + 8, "rule 1 (match): reshape must give rank two [rows, cols], not [2, -1, -1]"),
        (base + 9, "rule 1 (match): evidence 'nope' is not defined in the recipe's evidence list"),
        (
            base + 15,
            "rule 2 (copy): unknown key 'encoder_profile' (allowed: copy, evidence, format,"
            " match, optional, role)",
        ),
        (
            base + 12,
            "rule 2 (copy): unknown copy path 'gptq' (known: compressed-tensors-nvfp4, "
            "modelopt-nvfp4, compressed-tensors-fp8-channel)",
        ),
        (base + 17, "rule 3 (derive): input 'a.{i}' is listed twice"),
        (
            base + 17,
            "rule 3 (derive): input template 'b.{j}' uses placeholders ['j'] but the output"
            " 'o.{i}' uses ['i']; they must be the same",
        ),
        (base + 16, "rule 3 (derive): 3 inputs need a concat_axis"),
        (
            base + 18,
            "rule 3 (derive): W8G32_F16S needs an encoder_profile (e.g. MAXABS_F16_RECIP_RNE_V1)",
        ),
        (
            base + 16,
            "rule 3 (derive): a lossy choice (a grouped format) needs cited evidence: "
            "evidence: [id, ...]",
        ),
    ]
