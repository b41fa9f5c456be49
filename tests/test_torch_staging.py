"""The torch encoder's chunk pipeline and its staging (issue 6).

The pipeline (slot alternation, one chunk of look-ahead, in-order collection, deferred error
reports) is shared by every device, so the CPU runs here test it with many small chunks: output
bit-identical to the numpy backend and the oracle, errors identical to the numpy backend with
the same chunking.  The same tests run on CUDA when torch sees a GPU.  On a CPU-only build the
pinned CUDA stager is additionally driven through fake streams and events, which checks its
buffer views and slot bookkeeping and that every event is recorded before it is waited on; the
real overlap is only observable on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from parity import assert_same_encoding

from ninfer_convert.encoder import encode_grouped_words, staging, torch_backend
from ninfer_convert.encoder.numpy_backend import encode_numpy
from ninfer_convert.encoder.torch_backend import encode_torch
from ninfer_convert.errors import EncodeError
from ninfer_convert.formats import NumericFormat, lookup_format
from ninfer_convert.logical import GroupedCodes

GROUPED = ["Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S"]
DTYPES = ["BF16", "F16", "F32"]
NO_CUDA = not torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(NO_CUDA, reason="no CUDA"))]


def finite_words(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> np.ndarray:
    """Finite source words from subnormals up to 2^17 (no scale can overflow binary16)."""
    w = rng.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(np.uint32)
    exp = (w >> 23) & 0xFF
    w = np.where(exp > 127 + 17, w & 0x807FFFFF | ((exp % 145) << 23), w).astype(np.uint32)
    w[rng.random(shape) < 0.05] &= 0x80000000  # signed zeros make all-zero groups likely
    if dtype == "BF16":
        return (w >> 16).astype(np.uint16)
    if dtype == "F16":
        h = rng.integers(0, 1 << 16, size=shape, dtype=np.uint32).astype(np.uint16)
        return np.where((h & 0x7C00) == 0x7C00, h & 0x83FF, h).astype(np.uint16)
    return w


def assert_bit_identical(expected: GroupedCodes, got: GroupedCodes, fmt: NumericFormat) -> None:
    assert fmt.group_size is not None
    assert got.codes.dtype == np.int8 and got.scales.dtype == np.uint16
    assert_same_encoding(expected, got, fmt.group_size)
    assert np.array_equal(expected.codes, got.codes)
    assert np.array_equal(expected.scales, got.scales)


def error_of(fn: Any) -> str:
    with pytest.raises(EncodeError) as info:
        fn()
    return str(info.value)


# --- bit identity with many chunks ------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt_name", GROUPED)
@pytest.mark.parametrize("dtype", DTYPES)
def test_many_chunks_match_oracle_and_numpy(device: str, fmt_name: str, dtype: str) -> None:
    fmt = lookup_format(fmt_name)
    # 37 rows of K=100 (not a multiple of 32 or 64) in chunks of 3 rows: 13 chunks, the last
    # holding a single row, so both slots are reused many times and the tail chunk is short.
    words = finite_words(np.random.default_rng(7), (37, 100), dtype)
    oracle = encode_grouped_words(words, dtype, fmt, backend="oracle")
    numpy_ = encode_numpy(words, dtype, fmt)
    got = encode_torch(words, dtype, fmt, device=device, chunk_elements=300)
    assert_bit_identical(oracle, got, fmt)
    assert_bit_identical(numpy_, got, fmt)


@pytest.mark.parametrize("device", DEVICES)
@given(
    n=st.integers(1, 12),
    k=st.integers(1, 150),
    chunk=st.integers(1, 400),
    fmt_name=st.sampled_from(GROUPED),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_chunking_is_bit_identical_to_numpy(
    device: str, n: int, k: int, chunk: int, fmt_name: str, dtype: str, seed: int
) -> None:
    fmt = lookup_format(fmt_name)
    words = finite_words(np.random.default_rng(seed), (n, k), dtype)
    got = encode_torch(words, dtype, fmt, device=device, chunk_elements=chunk)
    assert_bit_identical(encode_numpy(words, dtype, fmt), got, fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_tensor_sources_including_strided(device: str, dtype: str) -> None:
    fmt = lookup_format("Q4G64_F16S")
    words = finite_words(np.random.default_rng(3), (90, 41), dtype)
    want = encode_numpy(words, dtype, fmt)
    kind = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype]
    t = torch.from_numpy(words.view(np.int32 if dtype == "F32" else np.int16)).view(kind)
    before = t.clone()
    strided = t.t().contiguous().t()  # same values, column-major storage
    assert not strided.is_contiguous()
    for src in (t, strided, t.to(device)):
        got = encode_torch(src, dtype, fmt, device=device, chunk_elements=200)
        assert_bit_identical(want, got, fmt)
    assert torch.equal(t, before)  # the source is only read


# --- errors: the same row/column/group as the numpy backend with the same chunking ----------


def _with_bad(
    dtype: str, shape: tuple[int, int], bad: list[tuple[int, int, float]], seed: int = 1
) -> np.ndarray:
    words = finite_words(np.random.default_rng(seed), shape, dtype)
    for r, c, value in bad:
        f32 = np.array([value], np.float32)
        if dtype == "F32":
            words[r, c] = f32.view(np.uint32)[0]
        elif dtype == "BF16":
            words[r, c] = np.uint16(f32.view(np.uint32)[0] >> 16)
        else:
            with np.errstate(over="ignore"):  # 1e30 becomes binary16 inf, as intended
                words[r, c] = f32.astype(np.float16).view(np.uint16)[0]
    return words


def _assert_same_error(
    words: np.ndarray, dtype: str, fmt_name: str, device: str, chunk: int
) -> str:
    fmt = lookup_format(fmt_name)
    want = error_of(lambda: encode_numpy(words, dtype, fmt, tensor="w", chunk_elements=chunk))
    got = error_of(
        lambda: encode_torch(words, dtype, fmt, device=device, tensor="w", chunk_elements=chunk)
    )
    assert got == want
    return got


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_in_a_later_chunk_reports_its_row_and_column(
    device: str, dtype: str, bad: float
) -> None:
    # K=70, 2 rows per chunk: row 13 is in chunk 6, column 66 in group 1 of Q4 (G=64).
    words = _with_bad(dtype, (20, 70), [(13, 66, bad)])
    msg = _assert_same_error(words, dtype, "Q4G64_F16S", device, chunk=140)
    assert "row 13, column 66 (group 1)" in msg


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["BF16", "F32"])  # F16 sources cannot overflow a scale
def test_overflow_in_a_later_chunk_reports_its_row_and_group(device: str, dtype: str) -> None:
    words = _with_bad(dtype, (21, 70), [(20, 66, 1e30)])  # the last, one-row chunk
    msg = _assert_same_error(words, dtype, "W8G32_F16S", device, chunk=140)
    assert "row 20, group 2: scale" in msg


@pytest.mark.parametrize("device", DEVICES)
def test_the_first_failing_chunk_wins_over_the_look_ahead_chunk(device: str) -> None:
    # Chunk 3 (rows 6-7) overflows and chunk 4 (rows 8-9), already encoded when chunk 3 is
    # collected, holds a NaN: the overflow in the earlier chunk is the one reported.
    words = _with_bad("F32", (12, 70), [(7, 3, 1e30), (8, 0, np.nan)])
    msg = _assert_same_error(words, "F32", "Q6G64_F16S", device, chunk=140)
    assert "row 7, group 0: scale" in msg
    # Within one chunk the first non-finite value wins, as in the numpy backend.
    msg = _assert_same_error(words, "F32", "Q6G64_F16S", device, chunk=10_000)
    assert "row 8, column 0 (group 0)" in msg


@pytest.mark.parametrize("device", DEVICES)
@given(
    n=st.integers(1, 10),
    k=st.integers(1, 100),
    chunk=st.integers(1, 300),
    dtype=st.sampled_from(DTYPES),
    cells=st.lists(
        st.tuples(
            st.floats(0, 1, exclude_max=True),
            st.floats(0, 1, exclude_max=True),
            st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30]),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_errors_match_numpy_for_any_chunking(
    device: str, n: int, k: int, chunk: int, dtype: str, cells: list[tuple[float, float, float]]
) -> None:
    bad = [(int(r * n), int(c * k), v) for r, c, v in cells]
    words = _with_bad(dtype, (n, k), bad)  # 1e30 is inf in binary16: non-finite there
    _assert_same_error(words, dtype, "Q5G64_F16S", device, chunk)


# --- staging selection: nothing pinned on the CPU ----------------------------------------------


def test_cpu_never_requests_pinned_memory_streams_or_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("CUDA staging requested on the CPU path")

    for name in ("empty", "zeros"):
        real = getattr(torch, name)

        def guarded(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if kwargs.get("pin_memory"):
                raise AssertionError("pin_memory requested on the CPU path")
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch, name, guarded)
    monkeypatch.setattr(torch.Tensor, "pin_memory", refuse)
    for name in ("Stream", "Event", "current_stream", "stream", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    fmt = lookup_format("Q4G64_F16S")
    words = finite_words(np.random.default_rng(5), (9, 70), "BF16")
    got = encode_torch(words, "BF16", fmt, device="cpu", chunk_elements=100)
    assert_bit_identical(encode_numpy(words, "BF16", fmt), got, fmt)
    got = encode_torch(words, "BF16", fmt, chunk_elements=100)  # default device
    assert_bit_identical(encode_numpy(words, "BF16", fmt), got, fmt)
    assert isinstance(
        torch_backend._make_stager(words, "BF16", torch.device("cpu"), 1, 70, 64),
        staging.HostStager,
    )


@pytest.mark.skipif(NO_CUDA, reason="no CUDA")
def test_cuda_uses_the_pinned_stager() -> None:
    words = finite_words(np.random.default_rng(5), (9, 70), "BF16")
    stager = torch_backend._make_stager(words, "BF16", torch.device("cuda"), 4, 70, 64)
    assert isinstance(stager, staging.CudaStager)
    assert all(b.is_pinned() for b in stager._in_host + stager._codes + stager._bits)


# --- the CUDA stager's ordering on the CPU, through fake streams and events -----------------
#
# The fakes keep a small happens-before model: every record or wait is one operation on its
# stream; a host synchronize on an event completes its stream up to the record and, through
# the waits that stream had enqueued by then, the streams it waited for.  The checks are the
# hazards the stager must exclude; the copies themselves run synchronously on the CPU.

Snapshot = tuple["_FakeStream", int]


class _Log:
    def __init__(self) -> None:
        self.entries: list[tuple[str, ...]] = []
        self.events: dict[str, _FakeEvent] = {}
        self.streams: dict[str, _FakeStream] = {}


class _FakeStream:
    def __init__(self, log: _Log, name: str) -> None:
        self.log, self.name = log, name
        self.ops = 0  # operations enqueued
        self.done = 0  # operations known complete to the host
        self.waits: list[tuple[int, Snapshot]] = []
        log.streams[name] = self

    def wait_event(self, event: _FakeEvent) -> None:
        # CUDA makes a wait on a never-recorded event a no-op: it would order nothing.
        assert event.snap is not None, f"{self.name} waits on {event.name} before its record"
        self.ops += 1
        self.waits.append((self.ops, event.snap))
        self.log.entries.append(("wait", self.name, event.name))

    def wait_stream(self, other: _FakeStream) -> None:
        self.ops += 1
        self.waits.append((self.ops, (other, other.ops)))
        self.log.entries.append(("wait_stream", self.name, other.name))

    def waited_for(self, other: _FakeStream, seq: int) -> bool:
        return any(s is other and n >= seq for _, (s, n) in self.waits)

    def complete(self, seq: int) -> None:
        if seq <= self.done:
            return
        self.done = seq
        for at, (stream, n) in self.waits:
            if at <= seq:
                stream.complete(n)

    def synchronize(self) -> None:
        self.complete(self.ops)
        self.log.entries.append(("drain", self.name))


class _FakeEvent:
    def __init__(self, log: _Log, name: str) -> None:
        self.log, self.name = log, name
        self.snap: Snapshot | None = None
        log.events[name] = self

    def record(self, stream: _FakeStream) -> None:
        kind, slot = self.name[:-1], self.name[-1]
        if self.snap is not None and kind == "uploaded":
            prev_stream, prev = self.snap
            # The pinned input is refilled only after the copy that last read it completed.
            assert prev_stream.done >= prev, f"pinned input {slot} refilled while in flight"
            # The device input is overwritten only after the encode that last read it.
            encode = self.log.events[f"computed{slot}"].snap
            assert encode is not None and stream.waited_for(*encode), f"device input {slot}"
        if kind == "computed":  # the encode read the upload of its own chunk
            upload = self.log.events[f"uploaded{slot}"].snap
            assert upload is not None and stream.waited_for(*upload), f"encode {slot} unordered"
        if kind == "downloaded":  # the download read the results of its own chunk
            encode = self.log.events[f"computed{slot}"].snap
            assert encode is not None and stream.waited_for(*encode), f"download {slot}"
        if self.snap is not None and kind == "downloaded":
            prev_stream, prev = self.snap
            assert prev_stream.done >= prev, f"pinned output {slot} reused before collected"
        stream.ops += 1
        self.snap = (stream, stream.ops)
        self.log.entries.append(("record", self.name, stream.name))

    def synchronize(self) -> None:
        assert self.snap is not None, f"host waits on {self.name} before its record"
        self.snap[0].complete(self.snap[1])
        self.log.entries.append(("sync", self.name))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Log]:
    """Run CudaStager on the CPU: streams and events are fakes, 'pinned' buffers are plain."""
    log = _Log()
    names = iter(["copy", "d2h"])
    kinds = ("uploaded", "computed", "downloaded")
    events = iter(f"{kind}{slot}" for kind in kinds for slot in (0, 1))
    compute = _FakeStream(log, "compute")
    monkeypatch.setattr(staging, "_new_stream", lambda dev: _FakeStream(log, next(names)))
    monkeypatch.setattr(staging, "_new_event", lambda: _FakeEvent(log, next(events)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    for name in ("empty", "zeros"):
        real = getattr(torch, name)

        def unpinned(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            kwargs.pop("pin_memory", None)
            return _real(*args, **kwargs)

        monkeypatch.setattr(torch, name, unpinned)

    def make(values: Any, dtype: str, dev: Any, rows: int, k: int, g: int) -> Any:
        return staging.CudaStager(values, dtype, dev, rows, k, g)

    monkeypatch.setattr(torch_backend, "_make_stager", make)
    yield log


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [23, 24, 3, 1])
def test_cuda_stager_ordering_with_fake_streams(fake_cuda: _Log, dtype: str, rows: int) -> None:
    fmt = lookup_format("Q5G64_F16S")
    words = finite_words(np.random.default_rng(11), (rows, 100), dtype)
    got = encode_torch(words, dtype, fmt, device="cpu", chunk_elements=300)  # 3 rows a chunk
    assert_bit_identical(encode_numpy(words, dtype, fmt), got, fmt)
    log = fake_cuda.entries
    assert log[0] == ("wait_stream", "copy", "compute")  # before the first upload
    chunks = -(-rows // 3)
    assert sum(e[:2] == ("record", "computed0") for e in log) == -(-chunks // 2)
    assert sum(e[:2] == ("record", "computed1") for e in log) == chunks // 2
    # No drain on success, because nothing of the call is pending after the last collect.
    assert not any(e[0] == "drain" for e in log)
    for stream in fake_cuda.streams.values():
        assert stream.done == stream.ops, f"{stream.name} still has work in flight"


def test_fake_streams_catch_a_missing_wait(
    fake_cuda: _Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model must be able to fail: without the copy stream's wait for the encode, chunk
    # i + 2's upload could overwrite the device buffer chunk i's encode still reads.
    real = _FakeStream.wait_event

    def skip_copy_waits(self: _FakeStream, event: _FakeEvent) -> None:
        if not (self.name == "copy" and event.name.startswith("computed")):
            real(self, event)

    monkeypatch.setattr(_FakeStream, "wait_event", skip_copy_waits)
    words = finite_words(np.random.default_rng(1), (9, 100), "F32")
    with pytest.raises(AssertionError, match="device input"):
        encode_torch(words, "F32", lookup_format("Q4G64_F16S"), device="cpu", chunk_elements=300)


def test_cuda_stager_error_path_with_fake_streams(fake_cuda: _Log) -> None:
    words = _with_bad("BF16", (15, 100), [(10, 99, np.nan), (13, 0, 1e30)])
    msg = _assert_same_error(words, "BF16", "Q4G64_F16S", "cpu", chunk=300)
    assert "row 10, column 99 (group 1)" in msg
    assert {e for e in fake_cuda.entries if e[0] == "drain"} == {
        ("drain", s) for s in ("copy", "compute", "d2h")
    }
    for stream in fake_cuda.streams.values():
        assert stream.done == stream.ops
