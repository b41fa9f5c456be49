"""The converter's fused encode-and-pack path writes exactly the bytes of encode-then-pack."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from ninfer_convert import encode_grouped_words
from ninfer_convert.derive.fused import encode_pack_grouped, equals_packed_grouped
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import FORMATS
from ninfer_convert.layouts import lookup_layout

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
# Both paths of every block: the C encoder and packer, and the numpy fallback that runs where
# they were not built (and must compare and write the same bytes).
KERNELS = ["native", "numpy"]


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize(("n", "k"), [(1, 16), (7, 200), (130, 384), (33, 1000)])
@pytest.mark.parametrize("source", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_planes_equal_encode_then_pack(
    fmt: str, n: int, k: int, source: str, kernel: str
) -> None:
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
    got = encode_pack_grouped(words, source, fmt, threads=2, chunk_elements=3 * k, kernel=kernel)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.tobytes() == np.asarray(b).tobytes(), f"plane {i}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_blocks_go_to_the_sink_and_never_into_the_out_planes(kernel: str) -> None:
    """With a sink (convert's pwrite into the reserved file bytes) the out planes are only
    sized and returned: read-only views work, and the sink receives exactly the packed planes,
    each byte once."""
    n, k = 37, 384
    x = np.random.default_rng(5).standard_normal((n, k)).astype(np.float32)
    words = (x.view(np.uint32) >> 16).astype(np.uint16)
    fmt = "Q5G64_F16S"
    want = encode_pack_grouped(words, "BF16", fmt, threads=1)
    got = [np.zeros_like(p) for p in want]
    seen = [np.zeros(p.size, dtype=np.int64) for p in want]
    out = [np.zeros_like(p) for p in want]
    for plane in out:
        plane.flags.writeable = False

    class Recording:
        def write(self, plane: int, offset: int, data: np.ndarray, /) -> None:
            got[plane][offset : offset + data.size] = data
            seen[plane][offset : offset + data.size] += 1

    planes = encode_pack_grouped(words, "BF16", fmt, threads=2, chunk_elements=5 * k,
                                 kernel=kernel, out=out, sink=Recording())  # fmt: skip
    assert planes is out and all(not p.any() for p in out)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.tobytes() == b.tobytes(), f"plane {i}"
        assert (seen[i] == 1).all(), f"plane {i}"


def test_fused_path_reports_the_global_row_of_a_non_finite_value() -> None:
    words = np.full((50, 64), 0x3F80, dtype=np.uint16)
    words[41, 9] = 0xFF80  # BF16 -inf
    with pytest.raises(EncodeError, match="row 41, column 9"):
        encode_pack_grouped(words, "BF16", "Q4G64_F16S", tensor="w", chunk_elements=640)


@pytest.mark.parametrize("fmt", GROUPED)
@pytest.mark.parametrize(("n", "k"), [(7, 200), (40, 384)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_block_comparison_agrees_with_comparing_whole_planes(
    fmt: str, n: int, k: int, kernel: str
) -> None:
    rng = np.random.default_rng(n + k)
    words = (rng.standard_normal((n, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    planes = encode_pack_grouped(words, "BF16", fmt)
    seen: list[int] = []

    def equals(stored: list[np.ndarray]) -> bool:
        seen.clear()
        digests = [xxhash.xxh3_128() for _ in stored]
        same = equals_packed_grouped(
            words, "BF16", fmt, stored, threads=2, chunk_elements=3 * k,
            on_block=lambda r0, r1, *_: seen.append(r0), digests=digests, kernel=kernel,
        )  # fmt: skip
        # The digests saw every stored byte, in order, whatever the outcome.
        assert [d.hexdigest() for d in digests] == [
            xxhash.xxh3_128_hexdigest(p.tobytes()) for p in stored
        ]
        return same

    assert equals([p.copy() for p in planes])
    assert sorted(seen) == list(range(0, n, 3))  # every block encoded, each once
    for i, plane in enumerate(planes):
        for pos in (0, plane.size // 2, plane.size - 1):
            stored = [p.copy() for p in planes]
            stored[i][pos] ^= 0x10
            assert not equals(stored), (i, pos)
            assert sorted(seen) == list(range(0, n, 3))  # a difference does not stop encoding
        shorter = [p.copy() for p in planes]
        shorter[i] = shorter[i][:-1]
        assert not equals(shorter)
