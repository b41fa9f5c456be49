"""The torch operations the grouped encoder relies on are IEEE round-to-nearest-even without
flush-to-zero, on every device present (CPU in CI, CUDA when a GPU is available).

Each test compares raw result words with numpy (whose float32 arithmetic is IEEE RNE) on
boundary values and on a large random sample; docs/formats.md and torch_backend.py say why each
operation must behave so.  The converter's parity gate re-checks the whole encoder on the
device before the first GPU-encoded tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer_convert import encode_grouped_words
from ninfer_convert.encoder.corpus import boundary_corpus
from ninfer_convert.encoder.parity import cuda_parity_gate, first_difference
from ninfer_convert.formats import FORMATS

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]


def _words(n: int, seed: int) -> np.ndarray:
    """Finite binary32 words over every binade, subnormals included, plus named boundaries."""
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    w = w[(w & 0x7F800000) != 0x7F800000]
    edges = np.array(
        [0x00000001, 0x007FFFFF, 0x00800000, 0x80000001, 0x3F800000, 0x7F7FFFFF, 0x33800000,
         0x477FE000, 0x477FEFFF, 0x477FF000, 0x387FC000, 0x38800000, 0x33000000, 0x33000001],
        dtype=np.uint32,
    )  # fmt: skip
    return np.concatenate([edges, w])


def _t(words: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(words.view(np.int32).copy()).view(torch.float32).to(device)


def _back(t: torch.Tensor) -> np.ndarray:
    return t.cpu().view(torch.int32).numpy().view(np.uint32)


@pytest.mark.parametrize("device", DEVICES)
def test_division_and_reciprocal_are_correctly_rounded(device: str) -> None:
    a, b = _words(200_000, 1), _words(200_000, 2)
    n = min(a.size, b.size)
    a, b = a[:n], b[:n]
    with np.errstate(all="ignore"):
        want_div = (a.view(np.float32) / b.view(np.float32)).view(np.uint32)
        want_rcp = (np.float32(1.0) / b.view(np.float32)).view(np.uint32)
    got_div = _back(torch.div(_t(a, device), _t(b, device)))
    got_rcp = _back(torch.div(torch.ones(n, device=device), _t(b, device)))
    ok = ~np.isnan(want_div.view(np.float32))
    assert np.array_equal(got_div[ok], want_div[ok])
    assert np.array_equal(got_rcp, want_rcp)


@pytest.mark.parametrize("device", DEVICES)
def test_multiply_keeps_subnormals(device: str) -> None:
    a, b = _words(200_000, 3), _words(200_000, 4)
    n = min(a.size, b.size)
    a, b = a[:n], b[:n]
    with np.errstate(all="ignore"):
        want = (a.view(np.float32) * b.view(np.float32)).view(np.uint32)
    got = _back(torch.mul(_t(a, device), _t(b, device)))
    assert np.array_equal(got, want)
    tiny = _t(np.array([0x00000001, 0x00400000], np.uint32), device)
    assert _back(tiny * 1.0).tolist() == [0x00000001, 0x00400000]  # no flush-to-zero


@pytest.mark.parametrize("device", DEVICES)
def test_float_to_half_rounds_to_nearest_even_with_subnormals(device: str) -> None:
    w = _words(400_000, 5)
    # Concentrate on the binary16 range, where rounding decisions happen.
    w = np.where((w & 0x7F800000) > 0x47800000, w & 0x807FFFFF | 0x33000000, w).astype(np.uint32)
    with np.errstate(all="ignore"):
        want = w.view(np.float32).astype(np.float16).view(np.uint16)
    got = _t(w, device).to(torch.float16).cpu().view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, want)
    half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = (half & 0x7C00) != 0x7C00
    back = torch.from_numpy(half.view(np.int16)).view(torch.float16).to(device).float()
    want32 = half.view(np.float16).astype(np.float32).view(np.uint32)
    assert np.array_equal(_back(back)[finite], want32[finite])  # exact widening, all words


@pytest.mark.parametrize("device", DEVICES)
def test_round_is_half_to_even(device: str) -> None:
    x = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 127.5, 0.49999997], np.float32)
    got = torch.round(torch.from_numpy(x).to(device)).cpu().numpy()
    assert got.tolist() == np.rint(x).tolist() == [0, -0, 2, -2, 2, -2, 126, -126, 128, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", GROUPED)
def test_torch_encoder_matches_oracle_on_the_boundary_corpus(device: str, fmt: str) -> None:
    entry = FORMATS[fmt]
    assert entry.group_size is not None
    for case, words in boundary_corpus(entry):
        ref = encode_grouped_words(words, "F32", fmt, backend="oracle")
        got = encode_grouped_words(words, "F32", fmt, backend="torch", device=device)
        assert first_difference(ref, got, entry.group_size) is None, (case, device)


@pytest.mark.parametrize("device", DEVICES)
def test_parity_gate_passes_on_this_device(device: str) -> None:
    cuda_parity_gate(GROUPED, device=device)


def test_parity_gate_stops_on_a_wrong_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device whose division is not the spec's (simulated) must stop conversion."""
    from ninfer_convert.errors import EncodeError

    def sloppy_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # Division rewritten as a multiply by a perturbed reciprocal: not Section 7.
        return torch.mul(a, torch.reciprocal(b) * (1 + 2**-20))

    monkeypatch.setattr(torch, "div", sloppy_div)
    with pytest.raises(EncodeError, match="parity gate failed"):
        cuda_parity_gate(GROUPED, device="cpu")
