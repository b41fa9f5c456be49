"""The C modules write their constants once and legibly: the IEEE word masks are named in
ninfer_convert/_ieee.h (equal to ieee.py's BinaryFormat, the one description of those words) and
nowhere else spelled out, and a float constant that is not a small integer is a C99 hex float
whose decimal value stands in a comment on the same line.  Every header a module includes is
listed in its pyproject ``depends`` (else the sdist lacks it and a build from it silently skips
the optional module)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninfer_convert.ieee import BFLOAT16, BINARY16, BINARY32, BinaryFormat

PACKAGE = Path(__file__).resolve().parent.parent / "ninfer_convert"
HEADER = PACKAGE / "_ieee.h"
C_FILES = sorted(PACKAGE.glob("*.[ch]"))
FORMATS = {"F32": BINARY32, "F16": BINARY16, "BF16": BFLOAT16}
FIELDS = {"SIGN": "sign_mask", "EXP": "exp_mask", "FRAC": "frac_mask", "MAG": "magnitude_mask"}
MASKS = {getattr(fmt, field) for fmt in FORMATS.values() for field in FIELDS.values()}


def _code(path: Path) -> list[str]:
    """The file's lines with comments blanked (line numbers kept)."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S)
    return [re.sub(r"//.*", "", line) for line in text.splitlines()]


def test_the_c_sources_are_found() -> None:
    names = {p.name for p in C_FILES}
    assert {"_hostkernel.c", "_msekernel.c", "_gptqkernel.c", "_rowsplit.c", "_ieee.h"} <= names


def test_header_masks_are_ieee_py_masks() -> None:
    defined = dict(
        re.findall(r"^#define ((?:F32|F16|BF16)_[A-Z]+) (0x[0-9A-F]+)u$", HEADER.read_text(), re.M)
    )
    want = {
        f"{prefix}_{suffix}": getattr(fmt, field)
        for prefix, fmt in FORMATS.items()
        for suffix, field in FIELDS.items()
    }
    assert {name: int(value, 16) for name, value in defined.items()} == want
    assert isinstance(BINARY16, BinaryFormat)


@pytest.mark.parametrize("path", [p for p in C_FILES if p != HEADER], ids=lambda p: p.name)
def test_no_c_source_spells_an_ieee_mask(path: Path) -> None:
    written = [
        f"{path.name}:{number}: {literal}"
        for number, line in enumerate(_code(path), 1)
        for literal in re.findall(r"(?<![\w.])0[xX][0-9A-Fa-f]+[uUlL]*(?![\w.])", line)
        if int(literal.rstrip("uUlL"), 16) in MASKS
    ]
    assert written == []


_DECIMAL_FLOAT = re.compile(
    r"(?<![\w.])(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?(?![\w.])|(?<![\w.])\d+[eE][-+]?\d+[fF]?"
)
_DECIMAL = re.compile(r"(?<![\w.^])\d+(?:\.\d*)?(?:[eE][-+]?\d+)?(?![\w.])")
_HEX_FLOAT = re.compile(r"(?<![\w.])0[xX][0-9A-Fa-f]*\.?[0-9A-Fa-f]*[pP][-+]?\d+[fFlL]?")


@pytest.mark.parametrize("path", C_FILES, ids=lambda p: p.name)
def test_float_constants_are_hex_with_their_decimal_beside(path: Path) -> None:
    text = path.read_text(encoding="utf-8").splitlines()
    decimal, unexplained = [], []
    for number, line in enumerate(_code(path), 1):
        for literal in _DECIMAL_FLOAT.findall(line):
            value = float(literal.rstrip("fF"))
            if not (value.is_integer() and abs(value) < 1024):  # 0.0, 1.0, 32.0 say themselves
                decimal.append(f"{path.name}:{number}: {literal}")
        comment = text[number - 1][len(line.rstrip()) :]  # what _code blanked: the comment
        beside = {float(d) for d in _DECIMAL.findall(comment)}
        for literal in _HEX_FLOAT.findall(line):
            if float.fromhex(literal.rstrip("fFlL")) not in beside:
                unexplained.append(f"{path.name}:{number}: {literal}")
    assert decimal == []
    assert unexplained == []


def test_every_included_header_is_a_listed_dependency() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    modules = pyproject["tool"]["setuptools"]["ext-modules"]
    assert len(modules) == 5
    for module in modules:
        included = {
            h
            for source in module["sources"]
            for h in re.findall(r'^#include "([^"]+)"', (PACKAGE.parent / source).read_text(), re.M)
        }
        assert sorted(module.get("depends", [])) == sorted(f"ninfer_convert/{h}" for h in included)
