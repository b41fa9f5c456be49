"""The converter's fused encode-and-pack path writes exactly the bytes of encode-then-pack."""

from __future__ import annotations

import numpy as np
import pytest

from ninfer_convert import encode_grouped_words
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import FORMATS
from ninfer_convert.fused import encode_pack_grouped
from ninfer_convert.layouts import lookup_layout

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize(("n", "k"), [(1, 16), (7, 200), (130, 384), (33, 1000)])
@pytest.mark.parametrize("source", ["BF16", "F16", "F32"])
def test_fused_planes_equal_encode_then_pack(fmt: str, n: int, k: int, source: str) -> None:
    rng = np.random.default_rng(n * k)
    x = rng.standard_normal((n, k)).astype(np.float32)
    if source == "BF16":
        words = (x.view(np.uint32) >> 16).astype(np.uint16)
    elif source == "F16":
        words = x.astype(np.float16).view(np.uint16)
    else:
        words = x.view(np.uint32)
    layout = lookup_layout(FORMATS[fmt].layout)
    want = layout.pack(fmt, encode_grouped_words(words, source, fmt))
    # Tiny chunks force many blocks, uneven last block and both threads.
    got = encode_pack_grouped(words, source, fmt, threads=2, chunk_elements=3 * k)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.tobytes() == np.asarray(b).tobytes(), f"plane {i}"


def test_fused_path_reports_the_global_row_of_a_non_finite_value() -> None:
    words = np.full((50, 64), 0x3F80, dtype=np.uint16)
    words[41, 9] = 0xFF80  # BF16 -inf
    with pytest.raises(EncodeError, match="row 41, column 9"):
        encode_pack_grouped(words, "BF16", "Q4G64_F16S", tensor="w", chunk_elements=640)
