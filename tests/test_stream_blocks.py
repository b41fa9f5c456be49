"""Block streaming of direct entries and derived grouped inputs: for every conversion and
derivation, the words streamed in blocks (block sizes that do not divide the tensor, and a
block of one word) are exactly the whole-tensor words, and errors name the same index."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from recipe_fixtures import RECIPE_HEAD
from safetensors.torch import save_file

from ninfer_convert.errors import EncodeError
from ninfer_convert.logical import DirectWords
from ninfer_convert.recipe import build_plan, loads_recipe, materialize
from ninfer_convert.recipe.materialize import DerivedWords, stream_direct
from ninfer_convert.recipe.plan import PlanEntry
from ninfer_convert.source import SourceCheckpoint, open_source

BLOCKS = [1, 7, 64, 1000, 1 << 20]


def _source(root: Path, tensors: dict[str, torch.Tensor]) -> SourceCheckpoint:
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return open_source(root)


def _entries(body: str, src: SourceCheckpoint) -> dict[str, PlanEntry]:
    plan = build_plan(loads_recipe(RECIPE_HEAD + textwrap.dedent(body)), src)
    return {e.output: e for e in plan.entries}


def _streamed(entry: PlanEntry, src: SourceCheckpoint, block: int) -> np.ndarray:
    stream = stream_direct(entry, src, block_elements=block)
    parts = [p.copy() for p in stream.blocks()]  # a block is valid until the next one
    assert all(p.ndim == 1 and p.size <= max(block, 64 * entry.shape[-1] if entry.shape else 1)
               for p in parts)  # fmt: skip
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=stream.word_dtype)
    assert flat.dtype == stream.word_dtype and flat.size == stream.numel
    return flat


def _whole(entry: PlanEntry, src: SourceCheckpoint) -> np.ndarray:
    value = materialize(entry, src).value
    assert isinstance(value, DirectWords)
    return np.asarray(value.words).reshape(-1)


def _random_words(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Every bit pattern class: random words of the width, then the value edge cases."""
    width = {"u2": np.uint16, "u4": np.uint32}[dtype]
    info = np.iinfo(width)
    w = rng.integers(0, int(info.max) + 1, size=shape, dtype=np.uint64).astype(width)
    return w


@pytest.mark.parametrize("block", BLOCKS)
def test_every_conversion_streams_the_whole_tensor_words(tmp_path: Path, block: int) -> None:
    rng = np.random.default_rng(block)
    # Finite words only for the rounding conversions (they refuse others); every F16 word.
    f16 = np.arange(1 << 16, dtype=np.uint16)
    f16 = f16[(f16 & 0x7C00) != 0x7C00][: 37 * 61].reshape(37, 61)
    f32 = _random_words(rng, (3, 5, 67), "u4")
    f32 = np.where((f32 & 0x7F800000) == 0x7F800000, f32 & 0xBFFFFFFF, f32)
    f32 = np.where((f32 & 0x7FFFFFFF) > 0x7F7F7FFF, f32 & 0x807FFFFF, f32)  # no overflow
    bf16 = _random_words(rng, (1001,), "u2")
    ints = rng.integers(-(2**31), 2**31, size=(13, 29), dtype=np.int64)
    src = _source(
        tmp_path / "m",
        {
            "h": torch.from_numpy(f16.astype("<u2").view(np.int16)).view(torch.float16),
            "h2": torch.from_numpy(f16.astype("<u2").view(np.int16)).view(torch.float16),
            "f": torch.from_numpy(f32.astype("<u4").view(np.int32)).view(torch.float32),
            "f2": torch.from_numpy(f32.astype("<u4").view(np.int32)).view(torch.float32),
            "b": torch.from_numpy(bf16.astype("<u2").view(np.int16)).view(torch.bfloat16),
            "i": torch.from_numpy(ints),
            "s": torch.tensor(1.5, dtype=torch.float16),
        },
    )
    e = _entries(
        """\
        - derive: h2b
          inputs: [h]
          format: BF16
          conversion: f16-to-bf16-rne
          role: a
          evidence: e1
        - derive: h2f
          inputs: [h2]
          format: FP32
          conversion: f16-to-f32
          role: a
        - derive: f2b
          inputs: [f]
          format: BF16
          conversion: f32-to-bf16-rne
          role: a
          evidence: e1
        - derive: f2f
          inputs: [f2]
          format: FP32
          role: a
        - match: b
          format: FP32
          conversion: bf16-to-f32
          role: a
        - match: i
          format: I32
          conversion: int-to-i32
          role: a
        - match: s
          format: FP32
          conversion: f16-to-f32
          role: a
        """,
        src,
    )
    for name, entry in e.items():
        assert np.array_equal(_streamed(entry, src, block), _whole(entry, src)), name


@pytest.mark.parametrize("tile", [(1024, 64), (5, 3), (1, 1)])
@pytest.mark.parametrize("block", BLOCKS)
def test_derivations_stream_in_blocks(
    tmp_path: Path, block: int, tile: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    # The module whose tile and strip sizes the transpose reads at call time.
    derivation_module = importlib.import_module("ninfer_convert.recipe.derivation")

    # Transpose tiles and strips that do not divide the tensor, down to one word.
    monkeypatch.setattr(derivation_module, "TRANSPOSE_TILE", tile[0])
    monkeypatch.setattr(derivation_module, "TRANSPOSE_STRIP", tile[1])
    rng = np.random.default_rng(7)
    a = rng.integers(0, 1 << 15, size=(37, 61), dtype=np.int16)
    b = rng.integers(0, 1 << 15, size=(37, 5), dtype=np.int16)
    c = rng.integers(0, 1 << 15, size=(3, 61), dtype=np.int16)
    arrays = {"a1": a, "a2": a.copy(), "a3": a.copy(), "a4": a.copy(), "b": b, "c": c}
    src = _source(
        tmp_path / "m", {n: torch.from_numpy(x).view(torch.bfloat16) for n, x in arrays.items()}
    )
    e = _entries(
        """\
        - derive: cat1
          inputs: [a1, b]
          concat_axis: 1
          format: BF16
          role: a
        - derive: cat0t
          inputs: [a2, c]
          concat_axis: 0
          transforms: [transpose]
          format: BF16
          role: a
        - derive: t
          inputs: [a3]
          transforms: [transpose, {reshape: [37, 61]}]
          format: BF16
          role: a
        - derive: tf
          inputs: [a4]
          transforms: [transpose]
          format: FP32
          conversion: bf16-to-f32
          role: a
        """,
        src,
    )
    u = {n: x.view(np.uint16) for n, x in (("a", a), ("b", b), ("c", c))}
    want = {
        "cat1": np.concatenate([u["a"], u["b"]], axis=1),
        "cat0t": np.concatenate([u["a"], u["c"]], axis=0).T,
        "t": u["a"].T,
        "tf": u["a"].T.astype(np.uint32) << 16,
    }
    for name, ref in want.items():
        got = _streamed(e[name], src, block)
        assert np.array_equal(got, np.ascontiguousarray(ref).reshape(-1)), name
        assert np.array_equal(_whole(e[name], src), got), name


def test_derived_grouped_rows_are_the_derivation(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 1 << 14, size=(64, 96), dtype=np.int16)
    b = rng.integers(0, 1 << 14, size=(64, 32), dtype=np.int16)
    src = _source(tmp_path / "m", {"a": torch.from_numpy(a).view(torch.bfloat16),
                                   "b": torch.from_numpy(b).view(torch.bfloat16)})  # fmt: skip
    e = _entries(
        """\
        - derive: w
          inputs: [a, b]
          concat_axis: 1
          transforms: [transpose]
          format: Q4G64_F16S
          encoder_profile: MAXABS_F16_RECIP_RNE_V1
          role: a
          evidence: e1
        """,
        src,
    )
    value = materialize(e["w"], src).value
    words = value.words  # type: ignore[union-attr]
    assert isinstance(words, DerivedWords)
    ref = np.ascontiguousarray(np.concatenate([a, b], axis=1).view(np.uint16).T)
    assert words.shape == ref.shape
    for r0 in range(0, 128, 9):
        assert np.array_equal(words[r0 : r0 + 9], ref[r0 : r0 + 9])


@pytest.mark.parametrize("block", [1, 5, 64])
def test_streamed_errors_name_the_index_in_the_whole_tensor(tmp_path: Path, block: int) -> None:
    f32 = np.full((6, 11), 0x3F800000, dtype=np.uint32)
    f32[4, 7] = 0x7F800000  # +inf, in a later block
    f32[5, 2] = 0x7F7FFFFF  # rounds to infinity, but the non-finite source is reported first
    ints = np.zeros((5, 9), dtype=np.int64)
    ints[3, 8] = 2**31
    kept = np.full((6, 11), 0x3F800000, dtype=np.uint32)
    kept[1, 1] = 0x7FC00000  # NaN: kept, so only the overflow is refused
    kept[4, 3] = 0x7F7FFFFF  # rounds to infinity: refused whatever keep_nonfinite says
    src = _source(
        tmp_path / "m",
        {
            "f": torch.from_numpy(f32.view(np.int32)).view(torch.float32),
            "g": torch.from_numpy(kept.view(np.int32)).view(torch.float32),
            "i": torch.from_numpy(ints),
        },
    )
    e = _entries(
        """\
        - match: f
          format: BF16
          conversion: f32-to-bf16-rne
          role: a
          evidence: e1
        - match: g
          format: BF16
          conversion: f32-to-bf16-rne
          keep_nonfinite: true
          role: a
          evidence: e1
        - match: i
          format: I32
          conversion: int-to-i32
          role: a
        """,
        src,
    )
    for name, where in (("f", "row 4, column 7"), ("g", "row 4, column 3"), ("i", "index [3, 8]")):
        with pytest.raises(EncodeError) as whole:
            materialize(e[name], src)
        with pytest.raises(EncodeError) as streamed:
            _streamed(e[name], src, block)
        assert where in str(whole.value)
        assert str(streamed.value) == str(whole.value)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat_blocks_read_only_their_words(tmp_path: Path, axis: int) -> None:
    # A block of a concatenation reads the words of that block, not every whole "row" it
    # touches: along axis 0 there is one row, the whole tensor, and each block concatenated
    # all of it (memory of the tensor per block, time quadratic in the tensor).
    import tracemalloc

    rng = np.random.default_rng(axis)
    shapes = {0: [(96, 8, 64), (32, 8, 64)], 1: [(4, 200, 64), (4, 56, 64)],
              2: [(4, 64, 300), (4, 64, 20)]}[axis]  # fmt: skip
    parts = [rng.integers(0, 1 << 15, size=s, dtype=np.int16) for s in shapes]
    tensors = {f"p{i}": torch.from_numpy(x).view(torch.bfloat16) for i, x in enumerate(parts)}
    src = _source(tmp_path / "m", tensors)
    e = _entries(
        f"""\
        - derive: cat
          inputs: [p0, p1]
          concat_axis: {axis}
          format: BF16
          role: a
        """,
        src,
    )["cat"]
    want = np.concatenate([p.view(np.uint16) for p in parts], axis=axis).reshape(-1)
    block = 1000  # divides neither a part's run nor a row
    stream = stream_direct(e, src, block_elements=block)
    got, peak = [], 0
    blocks = stream.blocks()
    tracemalloc.start()
    try:
        while True:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            part = next(blocks, None)
            peak = max(peak, tracemalloc.get_traced_memory()[1] - base)
            if part is None:
                break
            got.append(part.copy())
    finally:
        tracemalloc.stop()
    assert np.array_equal(np.concatenate(got), want)
    assert peak < 8 * block * 2, f"{peak} bytes traced for a {block}-word block"


@pytest.mark.parametrize("axis", [0, 1])
def test_transpose_of_a_concat_reads_tiles_not_the_concatenation(
    tmp_path: Path, axis: int
) -> None:
    # The strips of a transposed concatenation are read from the mapped parts in tiles, as
    # for a transposed source; the concatenation was built whole (memory of the tensor).
    import tracemalloc

    rng = np.random.default_rng(axis)
    shapes = [(1500, 256), (548, 256)] if axis == 0 else [(2048, 200), (2048, 56)]
    parts = [rng.integers(0, 1 << 15, size=s, dtype=np.int16) for s in shapes]
    tensors = {f"p{i}": torch.from_numpy(x).view(torch.bfloat16) for i, x in enumerate(parts)}
    src = _source(tmp_path / "m", tensors)
    e = _entries(
        f"""\
        - derive: cat
          inputs: [p0, p1]
          concat_axis: {axis}
          transforms: [transpose]
          format: BF16
          role: a
        """,
        src,
    )["cat"]
    want = np.concatenate([p.view(np.uint16) for p in parts], axis=axis).T.reshape(-1)
    stream = stream_direct(e, src, block_elements=1000)
    got, peak = [], 0
    blocks = stream.blocks()
    tracemalloc.start()
    try:
        while True:
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            part = next(blocks, None)
            peak = max(peak, tracemalloc.get_traced_memory()[1] - base)
            if part is None:
                break
            got.append(part.copy())
    finally:
        tracemalloc.stop()
    assert np.array_equal(np.concatenate(got), want)
    # A strip of 64 output rows (256 KiB) and a tile of 1024 x 64 words; the tensor is 1 MiB.
    assert peak < 512 << 10, f"{peak} bytes traced for a 1 MiB tensor"


def test_verify_admits_derived_grouped_inputs_that_stream(tmp_path: Path) -> None:
    # verify counts a grouped tensor against its memory budget only when its input is built
    # whole: a transpose of a concat now streams, a transpose of a transpose does not.
    from ninfer_convert.verify.tensor_checks import input_streams

    a = torch.zeros((64, 64), dtype=torch.bfloat16)
    src = _source(tmp_path / "m", {n: a.clone() for n in ("a", "b", "c", "d")})
    e = _entries(
        """\
        - derive: ct
          inputs: [a, b]
          concat_axis: 1
          transforms: [transpose]
          format: BF16
          role: a
        - derive: tt
          inputs: [c]
          transforms: [transpose, transpose]
          format: BF16
          role: a
        - derive: rt
          inputs: [d]
          transforms: [{reshape: [128, 32]}, transpose]
          format: BF16
          role: a
        """,
        src,
    )
    assert [input_streams(e[n]) for n in ("ct", "tt", "rt")] == [True, False, True]
