"""Bounded structured fuzzing of everything the tool parses from untrusted files: safetensors
headers, ``model.safetensors.index.json``, ``config.json`` (through opening, reading every
tensor and planning), and ``.ninfer`` headers and shard indexes (through opening, reading and
both checks).  Every outcome must be acceptance or a typed :class:`NinferError`: any other
exception, or an example that takes more than :data:`LIMIT_S`, fails.

The default run is a few seconds: 40 deterministic examples per test (the CI profile).  For a
long local run set ``NINFER_FUZZ_EXAMPLES``; examples are then drawn at random, new ones each
run (tests/README.md)::

    NINFER_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz_sources.py -x
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from artifact_fixtures import write_small
from hypothesis import given, settings
from hypothesis import strategies as st
from recipe_fixtures import RECIPE_HEAD
from st_helpers import write_safetensors

from ninfer_convert.container import INDEX_NAME, SINGLE_NAME, open_artifact
from ninfer_convert.container.wire import PRELUDE, canonical_json, header_digest
from ninfer_convert.convert import plan_conversion
from ninfer_convert.errors import NinferError
from ninfer_convert.source import DTYPES, OPAQUE_DTYPES, open_source, parse_header

LONG = os.environ.get("NINFER_FUZZ_EXAMPLES")
EXAMPLES = int(LONG) if LONG else 40
LIMIT_S = 10.0
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not LONG)


def bounded(fn: Callable[[], object]) -> None:
    """Run ``fn``: it may return or raise a NinferError; anything else, or a hang, fails."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            fn()
        except NinferError:
            pass
        except BaseException as exc:  # reported in the test's thread below
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(LIMIT_S)
    assert not t.is_alive(), f"no answer within {LIMIT_S} s"
    if "error" in box:
        raise AssertionError(f"untyped {type(box['error']).__name__}") from box["error"]


# -- values and mutations -------------------------------------------------------------------

DTYPE_NAMES = [*DTYPES, *OPAQUE_DTYPES, "F17", "", "bf16", "I4"]
NAMES = st.one_of(
    st.sampled_from(["w", "a.b", "model.layers.0.mlp.weight", "", "\u00e9", "e\u0301", "\ufb01"]),
    st.text(max_size=12),
    st.text(alphabet=st.characters(max_codepoint=0x1F), min_size=1, max_size=3),
    st.just("x" * 5000),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0, 1, 2, 3, 8, 16, 255, 4096, -1, 1 << 31, 1 << 62, 1 << 63, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(DTYPE_NAMES),
    NAMES,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(NAMES, children, max_size=3)
    ),
    max_leaves=8,
)
TEXT_EDITS = st.sampled_from(
    ["none", "lead-space", "lead-newline", "surrogate", "pair", "duplicate", "deep", "cut",
     "garbage", "nan", "bom"]
)  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def mutate_json(data: st.DataObject, value: Any, rounds: int = 3) -> Any:
    """Replace, delete or add values at random places of a JSON tree (1..rounds edits)."""
    for _ in range(data.draw(st.integers(1, rounds))):
        path = data.draw(st.sampled_from(_paths(value)))
        new = data.draw(JSON_VALUES)
        if not path:
            value = new
            continue
        parent = value
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(NAMES)] = new
        else:
            parent[path[-1]] = new
        if not isinstance(value, (dict, list)):
            break
    return value


def edit_text(data: st.DataObject, text: str) -> bytes:
    """A textual edit JSON trees cannot express (escapes, duplicates, nesting, framing)."""
    edit = data.draw(TEXT_EDITS)
    if edit == "lead-space":
        text = " \t" + text
    elif edit == "lead-newline":
        text = "\r\n" + text
    elif edit in ("surrogate", "pair"):
        strings = [m.start() + 1 for m in re.finditer('"', text)]
        if strings:
            at = data.draw(st.sampled_from(strings))
            esc = "\\ud800" if edit == "surrogate" else "\\ud83d\\ude00"
            text = text[:at] + esc + text[at:]
    elif edit == "duplicate" and text.startswith("{") and len(text) > 2:
        first = text[1 : text.find(",") if "," in text else -1]
        text = "{" + first + "," + text[1:]
    elif edit == "deep":
        depth = data.draw(st.sampled_from([63, 64, 65, 1000]))
        at = text.find(":")
        if at > 0:
            text = text[: at + 1] + "[" * depth + "0" + "]" * depth + text[text.find(",", at) :]
    elif edit == "cut":
        text = text[: data.draw(st.integers(0, len(text)))]
    elif edit == "garbage":
        text = text + data.draw(st.sampled_from(["x", "}", "\x00", " ", "\u2028"]))
    elif edit == "nan":
        text = text.replace("0", "NaN", 1)
    raw = text.encode("utf-8", "surrogatepass")
    if edit == "bom":
        raw = b"\xef\xbb\xbf" + raw
    return raw


def safetensors_header(data: st.DataObject) -> tuple[dict[str, Any], bytes]:
    """A valid header of 1..4 small tensors (any dtype, opaque ones included) and its data."""
    count = data.draw(st.integers(1, 4))
    header: dict[str, Any] = {}
    if data.draw(st.booleans()):
        header["__metadata__"] = {"format": "pt"}
    offset = 0
    for i in range(count):
        dtype = data.draw(st.sampled_from([*DTYPES, *OPAQUE_DTYPES]))
        bits = DTYPES[dtype].itemsize * 8 if dtype in DTYPES else OPAQUE_DTYPES[dtype]
        shape = data.draw(st.lists(st.integers(0, 4), max_size=3))
        numel = int(np.prod(shape)) if shape else 1
        if numel * bits % 8:  # sub-byte types: four more elements always fill whole bytes
            shape, numel = [*shape, 4], numel * 4
        nbytes = numel * bits // 8
        offsets = [offset, offset + nbytes]
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        offset += nbytes
    return header, bytes(range(256)) * (offset // 256) + bytes(range(offset % 256))


def write_framed(path: Path, raw: bytes, body: bytes, data: st.DataObject) -> None:
    length = len(raw) + data.draw(st.sampled_from([0, 0, 0, -1, 1, 8, 1 << 40, (1 << 64) - 1]))
    length = max(0, min(length, (1 << 64) - 1))
    path.write_bytes(struct.pack("<Q", length) + raw + body[: data.draw(st.integers(0, 1 << 20))])


def _exercise_source(spec: Path, recipe: Path | None = None) -> None:
    src = open_source(spec)
    for name in src.tensors:
        src.read(name)
    if recipe is not None:
        plan_conversion(src, recipe)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """An emptied folder per test, reused by every example (long runs make no litter)."""
    base = tmp_path_factory.mktemp("fuzz")

    def fresh(name: str) -> Path:
        d = base / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        return d

    return fresh


@pytest.fixture(scope="module")
def skip_all(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("recipe") / "r.yaml"
    p.write_text(RECIPE_HEAD + "- skip: '*'\n  reason: fuzz\n")
    return p


# -- safetensors ----------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_fuzzed_safetensors_headers_are_accepted_or_refused_typed(
    scratch: Callable[[str], Path], skip_all: Path, data: st.DataObject
) -> None:
    root = scratch("st")
    header, body = safetensors_header(data)
    if data.draw(st.booleans()):
        header = mutate_json(data, header)
    raw = edit_text(data, json.dumps(header, ensure_ascii=data.draw(st.booleans())))
    write_framed(root / "model.safetensors", raw, body, data)
    (root / "config.json").write_text('{"model_type": "llama"}')
    bounded(lambda: _exercise_source(root / "model.safetensors"))
    bounded(lambda: _exercise_source(root, skip_all))
    # Differential: what the safetensors project refuses, we refuse too (we are stricter
    # in documented ways -- names, dimensions, duplicate and extra keys -- never looser).
    if not _safetensors_accepts(root / "model.safetensors"):
        with pytest.raises(NinferError):
            parse_header(root / "model.safetensors")


def _safetensors_accepts(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np"):
            return True
    except Exception:  # its errors are untyped for us: any refusal counts
        return False


@FUZZ
@given(data=st.data())
def test_fuzzed_shard_indexes_are_accepted_or_refused_typed(
    scratch: Callable[[str], Path], skip_all: Path, data: st.DataObject
) -> None:
    root = scratch("idx")
    one = {"a": ("U8", np.zeros(2, np.uint8))}
    two = {"b": ("F32", np.zeros(2, np.uint32)), "c": ("BF16", np.zeros(3, np.uint16))}
    write_safetensors(root / "model-00001-of-00002.safetensors", one)
    write_safetensors(root / "model-00002-of-00002.safetensors", two)
    index: Any = {
        "metadata": {"total_size": 22},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors",
        },
    }
    index = mutate_json(data, index)
    raw = edit_text(data, json.dumps(index, ensure_ascii=data.draw(st.booleans())))
    (root / "model.safetensors.index.json").write_bytes(raw)
    (root / "config.json").write_text('{"model_type": "llama"}')
    bounded(lambda: _exercise_source(root, skip_all))


@FUZZ
@given(data=st.data())
def test_fuzzed_config_json_is_accepted_or_refused_typed(
    scratch: Callable[[str], Path], skip_all: Path, data: st.DataObject
) -> None:
    root = scratch("cfg")
    write_safetensors(root / "model.safetensors", {"w": ("F32", np.zeros(2, np.uint32))})
    config: Any = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "n": 1}
    config = mutate_json(data, config)
    raw = edit_text(data, json.dumps(config, ensure_ascii=data.draw(st.booleans())))
    (root / "config.json").write_bytes(raw)
    bounded(lambda: _exercise_source(root, skip_all))


# -- .ninfer --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, bytes]]:
    """A small single-file artifact, and the files of a three-shard one."""
    root = tmp_path_factory.mktemp("art")
    formats = ["BF16", "Q5G64_F16S", "NVFP4"]
    single = write_small(root / "one", formats, side_files={"config.json": b"{}"}, tmp_src=root)
    sharded = write_small(root / "many", formats, max_shard_size=200)
    files = {p.name: p.read_bytes() for p in sharded.iterdir()}
    return (single / SINGLE_NAME).read_bytes(), files


def _exercise_artifact(path: Path) -> None:
    for check in (False, True):
        with open_artifact(path, check_header_digest=check) as art:
            for name in art.tensors:
                art.read(name)
            art.integrity_problems()
            art.padding_problems()


@FUZZ
@given(data=st.data())
def test_fuzzed_ninfer_headers_are_accepted_or_refused_typed(
    scratch: Callable[[str], Path],
    artifacts: tuple[bytes, dict[str, bytes]],
    data: st.DataObject,
) -> None:
    blob = artifacts[0]
    fields = PRELUDE.unpack(blob[:48])
    h_off = fields[4]
    header = mutate_json(data, json.loads(blob[h_off:]))
    raw = (
        edit_text(data, canonical_json(header).decode("utf-8"))
        if isinstance(header, (dict, list))
        else json.dumps(header).encode()
    )
    head = PRELUDE.pack(fields[0], fields[1], fields[2], fields[3], h_off, len(raw), bytes(16))
    root = scratch("nh")
    (root / SINGLE_NAME).write_bytes(head[:32] + header_digest(head, raw) + blob[48:h_off] + raw)
    (root / "config.json").write_bytes(b"{}")
    bounded(lambda: _exercise_artifact(root))


@FUZZ
@given(data=st.data())
def test_fuzzed_ninfer_indexes_are_accepted_or_refused_typed(
    scratch: Callable[[str], Path],
    artifacts: tuple[bytes, dict[str, bytes]],
    data: st.DataObject,
) -> None:
    root = scratch("ni")
    for name, blob in artifacts[1].items():
        (root / name).write_bytes(blob)
    index = mutate_json(data, json.loads(artifacts[1][INDEX_NAME]))
    raw = (
        edit_text(data, canonical_json(index).decode("utf-8"))
        if isinstance(index, (dict, list))
        else json.dumps(index).encode()
    )
    (root / INDEX_NAME).write_bytes(raw)
    bounded(lambda: _exercise_artifact(root))
