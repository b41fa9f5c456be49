"""``derive.provenance_of``: the typed provenance convert stores for a plan entry and verify
compares with the stored one.  It is built straight from the plan entry (no JSON round trip),
so these tests pin what it builds: valid by the schema's own checked decoder, the JSON form of
each transform kind, the importance digest only where a vector is attached, and verify's finding
when a stored provenance differs, word for word."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
from artifact_fixtures import rewrite_header
from test_pinned_outputs import _copy_source
from test_pinned_plan_json import every_op_source

from ninfer_convert.container.schema import Provenance
from ninfer_convert.container.wire import SINGLE_NAME, digest_hex
from ninfer_convert.convert import convert_checkpoint
from ninfer_convert.derive import provenance_of
from ninfer_convert.recipe import Plan, build_plan, load_recipe
from ninfer_convert.source import open_source
from ninfer_convert.verify import verify_artifact


def _plan(source: Path, recipe: Path) -> Plan:
    return build_plan(load_recipe(recipe), open_source(source))


def test_every_provenance_passes_the_schemas_checked_decoder(tmp_path: Path) -> None:
    plans = [_plan(*every_op_source(tmp_path / "ops"))]
    (tmp_path / "nv").mkdir()
    (tmp_path / "nv" / "r.yaml").write_text(
        _copy_source(tmp_path / "nv" / "src", "compressed-tensors-nvfp4")
    )
    plans.append(_plan(tmp_path / "nv" / "src", tmp_path / "nv" / "r.yaml"))
    for plan in plans:
        for e in plan.entries:
            prov = provenance_of(e)
            assert Provenance.checked_from_json(prov.to_json(), "provenance") == prov, e.output
    copied = plans[1].entry("model.layers.0.proj.weight")
    assert provenance_of(copied).to_json()["transforms"] == [
        {"op": "copy-quantized", "scheme": "compressed-tensors-nvfp4"}
    ]


def test_provenance_json_of_a_concat_and_of_a_reshape_then_transpose(tmp_path: Path) -> None:
    plan = _plan(*every_op_source(tmp_path))
    qkv = provenance_of(plan.entry("model.layers.0.self_attn.qkv_proj.weight"))
    # Key order is the schema's field order (canonical_json would sort it away).
    assert json.dumps(qkv.to_json(), separators=(",", ":")) == (
        '{"sources":[{"name":"model.layers.0.self_attn.q_proj.weight","dtype":"BF16",'
        '"shape":[32,64],"file":"model.safetensors"},{"name":"model.layers.0.self_attn.k_proj'
        '.weight","dtype":"BF16","shape":[16,64],"file":"model.safetensors"}],"conversion":null,'
        '"transforms":[{"op":"concat","axis":0}],"encoder_profile":"MAXABS_F16_RECIP_RNE_V1",'
        '"rule":{"index":1,"line":13,"pattern":"model.layers.{L}.self_attn.qkv_proj.weight"},'
        '"constraints":[]}'
    )
    conv = provenance_of(plan.entry("conv")).to_json()
    assert conv["transforms"] == [{"op": "reshape", "shape": [8, 4]}, {"op": "transpose"}]
    norm = provenance_of(plan.entry("model.layers.0.input_layernorm.weight"))
    assert (norm.conversion, norm.constraints) == ("f32-to-bf16-rne", ())
    assert provenance_of(plan.entry("lm_head.weight")).constraints == ("finite-only",)


def test_the_importance_digest_is_recorded_only_with_a_vector(tmp_path: Path) -> None:
    entry = _plan(*every_op_source(tmp_path)).entry("lm_head.weight")
    assert "importance" not in provenance_of(entry).to_json()
    words = np.arange(64, dtype=np.uint32)
    with_vector = provenance_of(dataclasses.replace(entry, importance=words))
    assert with_vector.importance == digest_hex(words.astype("<u4").tobytes())
    assert with_vector.to_json()["importance"] == with_vector.importance


def test_a_stored_provenance_that_differs_is_one_finding_naming_each_key(
    tmp_path: Path,
) -> None:
    source, recipe = every_op_source(tmp_path)
    out = tmp_path / "art"
    convert_checkpoint(source, recipe, out, device="cpu", alignment=64)
    assert verify_artifact(out, device="cpu", oracle_groups=2).passed

    def forge(h: dict[str, Any]) -> None:
        [t] = [t for t in h["tensors"] if t["name"] == "model.layers.0.self_attn.qkv_proj.weight"]
        t["provenance"]["rule"]["line"] = 99
        t["provenance"]["transforms"][0]["axis"] = 1

    rewrite_header(out / SINGLE_NAME, forge)
    report = verify_artifact(out, device="cpu", oracle_groups=2)
    [finding] = report.check("source-words").findings
    assert finding.message == EXPECTED_FINDING


EXPECTED_FINDING = (
    "the header's metadata disagrees with the recorded recipe: provenance.rule "
    '{"index": 1, "line": 99, "pattern": "model.layers.{L}.self_attn.qkv_proj.weight"}, the '
    'recipe gives {"index": 1, "line": 13, "pattern": "model.layers.{L}.self_attn.qkv_proj.'
    'weight"}; provenance.transforms [{"op": "concat", "axis": 1}], the recipe gives '
    '[{"op": "concat", "axis": 0}]'
)
"""verify's words for it before provenance_of returned the typed value (checked then too)."""
