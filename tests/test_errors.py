"""The error hierarchy's contract: one closed table of kinds, context fields kept apart, errors
never changed once raised, and the ``--json`` error object."""

from __future__ import annotations

import ast
import errno
import json
import re
from pathlib import Path

import pytest
from artifact_fixtures import META, make_logical, provenance
from doc_schema import doc_example, same_shape

from ninfer_convert import errors
from ninfer_convert.cli import main
from ninfer_convert.container import ArtifactWriter
from ninfer_convert.container.publish import resource_error
from ninfer_convert.container.schema import SchemaError as SchemaErrorOfTheSchema
from ninfer_convert.encoder.common import nonfinite_error, overflow_error
from ninfer_convert.errors import (
    KINDS,
    ArtifactError,
    NinferError,
    ResourceError,
    SchemaError,
    SourceError,
    UsageError,
    ValueInvariantError,
)

ROOT = Path(__file__).resolve().parent.parent
CLASSES = [
    cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, NinferError)
]


def test_every_class_has_its_own_default_kind_in_the_table() -> None:
    defaults = {cls.default_kind: cls for cls in CLASSES}
    assert len(defaults) == len(CLASSES)  # no two classes share a default
    for kind, cls in defaults.items():
        assert KINDS[kind].error is cls
        made = cls("at", "x") if cls is SchemaError else cls("x")
        assert made.kind == kind


def test_kinds_are_short_snake_case_ids_with_a_meaning() -> None:
    for kind, entry in KINDS.items():
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", kind), kind
        assert len(kind) <= 24 and entry.meaning


def test_an_unknown_kind_or_one_of_another_class_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot have kind 'no_such_kind'"):
        UsageError("x", kind="no_such_kind")
    with pytest.raises(TypeError, match="SourceError cannot have kind 'no_space'"):
        SourceError("x", kind="no_space")
    # A subclass may carry its base's kinds (an IntegrityError is an ArtifactError) ...
    assert ValueInvariantError("x", kind="word_mismatch").kind == "word_mismatch"
    # ... but not the reverse.
    with pytest.raises(TypeError):
        ArtifactError("x", kind="value_invariant")


def test_every_specific_kind_is_raised_somewhere_in_the_package() -> None:
    source = "\n".join(
        p.read_text(encoding="utf-8")
        for p in (ROOT / "ninfer_convert").rglob("*.py")
        if p.name != "errors.py"
    )
    defaults = {cls.default_kind for cls in CLASSES}
    unused = [k for k in KINDS if k not in defaults and f'"{k}"' not in source]
    assert unused == []


def test_every_kind_a_raise_site_names_is_in_the_table() -> None:
    # A kind outside the table is a TypeError at raise time: catch one on a rare path here.
    named = {}
    for path in (ROOT / "ninfer_convert").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            func = getattr(node, "func", None)
            name = getattr(func, "id", None) or getattr(func, "attr", "")
            if isinstance(node, ast.Call) and (name.endswith("Error") or name == "as_error"):
                for kw in node.keywords:
                    if kw.arg == "kind" and isinstance(kw.value, ast.Constant):
                        named[kw.value.value] = f"{path.name}:{node.lineno}"
    assert named  # the scan sees the raise sites
    assert {k: where for k, where in named.items() if k not in KINDS} == {}


def test_docs_list_exactly_the_table_of_kinds() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = text.split("### Error kinds", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| `(\w+)` \| (\d+) \|", section, re.MULTILINE)
    documented = {kind: (cls, int(code)) for kind, cls, code in rows}
    expected = {k: (e.error.__name__, e.error.exit_code) for k, e in KINDS.items()}
    assert documented == expected


def test_rule_and_where_are_separate_fields() -> None:
    spec = nonfinite_error("w", 1, 0, 2, 0x7FC00000, "F32")
    assert (spec.kind, spec.rule, spec.where) == ("non_finite_value", "spec Section 7", None)
    assert str(spec).startswith("tensor 'w': rule spec Section 7: non-finite source value")
    assert overflow_error("w", 0, 0, 1e9).kind == "scale_overflow"
    located = ArtifactError("bad", path="m.ninfer", where="tensors[3].offset")
    assert (located.rule, located.where) == (None, "tensors[3].offset")
    assert str(located) == "m.ninfer: tensors[3].offset: bad"


def test_schema_error_is_a_ninfer_error_rendered_one_way() -> None:
    assert SchemaErrorOfTheSchema is SchemaError  # one class, re-exported by the schema
    exc = SchemaError("tensors[0].name", "must not be empty")
    assert isinstance(exc, NinferError) and exc.kind == "schema_violation"
    assert str(exc) == "tensors[0].name: must not be empty"
    assert SchemaError("", "x").where == "(root)"
    as_artifact = exc.as_error(ArtifactError, "invalid header", kind="header_invalid", path="m")
    assert type(as_artifact) is ArtifactError and as_artifact.kind == "header_invalid"
    assert (as_artifact.where, as_artifact.path) == ("tensors[0].name", "m")
    assert str(as_artifact) == "m: tensors[0].name: invalid header: must not be empty"


def test_a_layout_error_gets_the_tensor_name_without_changing_the_raised_error(
    tmp_path: Path,
) -> None:
    wrong = make_logical("Q5G64_F16S", (2, 70))  # 5-bit codes do not fit Q4
    with (
        pytest.raises(ValueInvariantError) as info,
        ArtifactWriter(tmp_path / "m", metadata=META, alignment=64) as w,
    ):
        w.add("q", "Q4G64_F16S", wrong, role="r", provenance=provenance("Q4G64_F16S"))
    assert info.value.tensor == "q" and str(info.value).startswith("tensor 'q': Q4G64_F16S")
    original = info.value.__cause__
    assert isinstance(original, ValueInvariantError) and original is not info.value
    assert original.tensor is None and not str(original).startswith("tensor")
    assert original.kind == info.value.kind == "value_invariant"


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (errno.ENOSPC, "no_space"),
        (errno.EDQUOT, "quota_exceeded"),
        (errno.EACCES, "permission_denied"),
        (errno.EPERM, "permission_denied"),
        (errno.EROFS, "read_only"),
        (errno.EIO, "resource_refused"),
    ],
)
def test_resource_errors_have_the_kind_of_their_errno(tmp_path: Path, code: int, kind: str) -> None:
    exc = resource_error(OSError(code, "refused", str(tmp_path)), tmp_path)
    assert isinstance(exc, ResourceError) and exc.kind == kind and exc.exit_code == 7


def test_json_flag_prints_the_error_object_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_an_artifact = tmp_path / "x.bin"
    not_an_artifact.write_bytes(b"abcdefgh")
    assert main(["verify", "--json", str(not_an_artifact)]) == 2
    captured = capsys.readouterr()
    obj = json.loads(captured.out)
    assert obj["kind"] == "ninfer-error" and obj["schema_version"] == 1
    err = obj["error"]
    assert (err["error"], err["kind"], err["exit_code"]) == ("UsageError", "not_an_artifact", 2)
    assert err["path"] == str(not_an_artifact) and err["hint"]
    assert set(err) == {"error", "kind", "exit_code", "message", "path", "tensor", "rule",
                        "where", "hint"}  # fmt: skip
    assert captured.err.startswith(f"error: {not_an_artifact}: not a .ninfer artifact")
    same_shape(doc_example(ROOT / "docs" / "cli.md", "### Error objects"), obj)
    # Without --json: the line on stderr only.
    assert main(["verify", str(not_an_artifact)]) == 2
    assert capsys.readouterr().out == ""


def test_json_flag_after_a_click_usage_error_is_still_one_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["formats", "--json", "--no-such-option"]) == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert (err["error"], err["kind"]) == ("UsageError", "usage")
    assert "--no-such-option" in err["message"]
