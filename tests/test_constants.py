"""Constants and small helpers are written once: the container digest in container/wire.py, the
IEEE field masks in encoder/oracle.py's BinaryFormat, ceil division in layouts/base.py."""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from pathlib import Path

import numpy as np
import xxhash

from ninfer_convert.container import wire
from ninfer_convert.ieee import BFLOAT16, BINARY16, BINARY32
from ninfer_convert.recipe.materialize import nonfinite_mask
from ninfer_convert.source.checkpoint import digest_bytes

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ninfer_convert"


@functools.cache
def _sources() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for p in sorted(PACKAGE.rglob("*.py"))
    }


@functools.cache
def _modules() -> dict[str, ast.Module]:
    return {path: ast.parse(text) for path, text in _sources().items()}


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_only_wire_computes_container_digests() -> None:
    users = {path for path, tree in _modules().items() if "xxhash" in _imports(tree)}
    # verify/compare.py: xxh64 of a tensor name seeds the oracle sample, not a digest.
    assert users == {"ninfer_convert/container/wire.py", "ninfer_convert/verify/compare.py"}
    sha = {path for path, tree in _modules().items() if "hashlib" in _imports(tree)}
    # signing/: the signature's own SHA-256 (Sigstore statement's files, key fingerprints).
    assert sha == {
        "ninfer_convert/container/wire.py",
        "ninfer_convert/signing/files.py",
        "ninfer_convert/signing/keys.py",
    }


def test_the_digests_are_the_documented_algorithms() -> None:
    data = bytes(range(256)) * 3
    assert wire.digest_hex(data) == xxhash.xxh3_128_hexdigest(data)
    h = wire.new_digest()
    h.update(data[:100])
    h.update(data[100:])
    assert h.hexdigest() == xxhash.xxh3_128(data, seed=0).hexdigest()
    assert digest_bytes(data) == "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)
    text = "name: é\n"
    assert wire.recipe_digest(text) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", wire.recipe_digest(""))


def test_ceil_division_is_written_once() -> None:
    written = [
        f"{path}:{node.lineno}"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.BinOp)
        and isinstance(node.operand.op, ast.FloorDiv)
        and isinstance(node.operand.left, ast.UnaryOp)
        and isinstance(node.operand.left.op, ast.USub)
    ]
    # The one definition: layouts.base.ceil_div.
    assert [w.rsplit(":", 1)[0] for w in written] == ["ninfer_convert/layouts/base.py"]


IEEE_MASKS = {0x7F800000, 0x7FFFFF, 0x7FFFFFFF, 0x80000000, 0x7C00, 0x3FF, 0x7F80, 0x8000}


def test_no_module_writes_an_ieee_mask_as_a_literal() -> None:
    written = []
    for path, tree in _modules().items():
        if path == "ninfer_convert/ieee.py":
            continue
        lines = _sources()[path].splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and type(node.value) is int:
                if node.value not in IEEE_MASKS:
                    continue
                spelled = lines[node.lineno - 1][node.col_offset : node.end_col_offset]
                # A mask is spelled in hex; 1023 as a count is not one.
                if spelled.lower().startswith("0x"):
                    written.append(f"{path}:{node.lineno}: {spelled}")
    assert written == []


def test_binary_format_masks() -> None:
    assert (BINARY32.sign_mask, BINARY32.exp_mask, BINARY32.frac_mask) == (
        0x80000000,
        0x7F800000,
        0x007FFFFF,
    )
    assert (BINARY16.sign_mask, BINARY16.exp_mask, BINARY16.frac_mask) == (0x8000, 0x7C00, 0x3FF)
    assert (BFLOAT16.sign_mask, BFLOAT16.exp_mask, BFLOAT16.frac_mask) == (0x8000, 0x7F80, 0x7F)
    for fmt in (BINARY32, BINARY16, BFLOAT16):
        assert fmt.sign_mask | fmt.exp_mask | fmt.frac_mask == (fmt.sign_mask << 1) - 1
        assert fmt.magnitude_mask == fmt.exp_mask | fmt.frac_mask
        assert fmt.sign_mask & fmt.exp_mask == fmt.exp_mask & fmt.frac_mask == 0


def test_nonfinite_mask_over_every_16_bit_word() -> None:
    words = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    as_f16 = words.view(np.float16)
    assert np.array_equal(nonfinite_mask(words, "F16"), ~np.isfinite(as_f16))
    as_bf16 = (words.astype(np.uint32) << np.uint32(16)).view(np.float32)  # exact widening
    assert np.array_equal(nonfinite_mask(words, "BF16"), ~np.isfinite(as_bf16))


def test_docstrings_cite_no_issue_numbers() -> None:
    # Issue numbers belong in git history; measurements in docs/performance.md.
    cited = [
        f"{path}:{node.lineno}"
        for path, tree in _modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.search(r"\bissues? #?\d", node.value, re.IGNORECASE)
    ]
    assert cited == []
