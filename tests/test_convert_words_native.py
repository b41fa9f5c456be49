"""The C kernel's word conversions (``_hostkernel.convert_words``) against the words.py
reference: every binary16 and BF16 word, and binary32 words covering every exponent, both
rounding neighbours of every tie, the overflow boundary and NaN payloads; plus the flags
(first non-finite input, first finite input rounding to infinity)."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_convert.native import optional_module
from ninfer_convert.words import bf16_to_f32_words, f16_to_f32_words, f32_to_bf16_rne

kernel = optional_module("_hostkernel")
pytestmark = pytest.mark.skipif(kernel is None, reason="C kernel not built")

ALL16 = np.arange(1 << 16, dtype=np.uint16)


def _run(op: int, words: np.ndarray, out_dtype: type) -> tuple[np.ndarray, int, int]:
    out = np.empty(words.size, dtype=out_dtype)
    bad_in, bad_over = kernel.convert_words(op, np.ascontiguousarray(words), out)
    return out, bad_in, bad_over


def _f32_words() -> np.ndarray:
    rng = np.random.default_rng(12)
    exps = np.arange(256, dtype=np.uint32) << 23
    lows = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x17FFF, 0x18000, 0x18001]
    lows += [0x7F7FFF, 0x7F8000, 0x7FFFFF, 0x400000, 0x400001]
    grid = (exps[:, None] | np.array(lows, dtype=np.uint32)[None, :]).reshape(-1)
    rand = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    both = np.concatenate([grid, grid | np.uint32(0x80000000), rand])
    return both


def test_f16_to_f32_matches_the_reference_on_every_word() -> None:
    out, bad_in, bad_over = _run(0, ALL16, np.uint32)
    assert np.array_equal(out, f16_to_f32_words(ALL16))
    assert bad_in == 0x7C00 and bad_over == -1  # the first non-finite binary16 word


def test_bf16_to_f32_matches_the_reference_on_every_word() -> None:
    out, bad_in, bad_over = _run(1, ALL16, np.uint32)
    assert np.array_equal(out, bf16_to_f32_words(ALL16))
    assert bad_in == 0x7F80 and bad_over == -1


def test_f16_to_bf16_matches_the_reference_on_every_word() -> None:
    out, bad_in, bad_over = _run(3, ALL16, np.uint16)
    want = f32_to_bf16_rne(f16_to_f32_words(ALL16), keep_nonfinite=True)
    assert np.array_equal(out, want)
    assert bad_in == 0x7C00 and bad_over == -1  # binary16 never overflows BF16


def test_f32_to_bf16_matches_the_reference_with_flags() -> None:
    words = _f32_words()
    out, bad_in, bad_over = _run(2, words, np.uint16)
    assert np.array_equal(out, f32_to_bf16_rne(words, keep_nonfinite=True))
    nonfinite = (words & 0x7F800000) == 0x7F800000
    over = ~nonfinite & ((out & 0x7F80) == 0x7F80)
    assert bad_in == int(np.argmax(nonfinite)) and over.any()
    assert bad_over == int(np.argmax(over))
    finite = words[~nonfinite & ~over]
    out2, bad_in2, bad_over2 = _run(2, finite, np.uint16)
    assert (bad_in2, bad_over2) == (-1, -1)
    assert np.array_equal(out2, f32_to_bf16_rne(finite))


def test_convert_words_refuses_bad_buffers() -> None:
    with pytest.raises(ValueError):
        kernel.convert_words(0, ALL16, np.empty(10, dtype=np.uint32))
    with pytest.raises(ValueError):
        kernel.convert_words(9, ALL16, np.empty(1 << 16, dtype=np.uint32))
