"""Read-ahead requests: chunked WILLNEED advice in order, and the window that feeds it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ninfer_convert import readahead
from ninfer_convert.readahead import CHUNK, ReadAheadWindow


def test_window_requests_in_order_within_the_byte_limit_past_the_started_items() -> None:
    sizes = [100, 50, 50, 50, 300, 10, 10]
    asked: list[int] = []
    window = ReadAheadWindow(list(range(len(sizes))), sizes.__getitem__, asked.append, 150)
    window.started(0)
    assert asked == [0, 1, 2, 3]  # the started item, then 50 + 50 + 50 = 150 beyond it
    window.started(1)
    assert asked == [0, 1, 2, 3]  # 2 and 3 are 100 bytes ahead; item 4 (300) would overflow
    window.started(2)
    assert asked == [0, 1, 2, 3]  # 3 is ahead, and 50 + 300 would overflow
    window.started(3)
    assert asked == [0, 1, 2, 3, 4]  # at least one item ahead, whatever its size
    window.started(4)
    assert asked == [0, 1, 2, 3, 4, 5, 6]
    window.started(3)
    assert asked == [0, 1, 2, 3, 4, 5, 6]  # never twice


def test_window_keeps_at_least_min_items_ahead() -> None:
    asked: list[int] = []
    window = ReadAheadWindow(list(range(8)), lambda i: 100, asked.append, 50, min_items=2)
    window.started(0)
    assert asked == [0, 1, 2]  # two items ahead although each alone exceeds the limit
    window.started(1)
    assert asked == [0, 1, 2, 3]
    window.started(2)
    assert asked == [0, 1, 2, 3, 4]


def test_window_never_skips_an_item_started_out_of_order() -> None:
    asked: list[int] = []
    window = ReadAheadWindow(list(range(7)), lambda i: 10, asked.append, 15)
    window.started(3)  # a later worker got there first: 0..2 are requested before it
    assert asked == [0, 1, 2, 3, 4]
    window.started(0)  # an earlier item started late changes nothing
    assert asked == [0, 1, 2, 3, 4]
    window.started(5)
    assert asked == [0, 1, 2, 3, 4, 5, 6]


def test_window_is_safe_to_call_from_many_threads() -> None:
    asked: list[int] = []
    items = list(range(200))
    window = ReadAheadWindow(items, lambda i: 1, asked.append, 8)
    threads = [
        threading.Thread(target=lambda k=k: [window.started(i) for i in range(k, 200, 4)])
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(asked) == asked == items


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise")
def test_read_ahead_advises_the_whole_range_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\0" * (3 * CHUNK + 5))
    calls: list[tuple[int, int, int]] = []
    done = threading.Event()

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length, advice))
        if offset + length >= 3 * CHUNK + 5:
            done.set()

    monkeypatch.setattr(os, "posix_fadvise", advise)
    readahead.read_ahead(tmp_path / "missing.bin", 0, 10)  # ignored: the real read reports it
    readahead.read_ahead(path, 7, 3 * CHUNK - 2)
    assert done.wait(5.0)
    assert calls == [
        (7, CHUNK, os.POSIX_FADV_WILLNEED),
        (7 + CHUNK, CHUNK, os.POSIX_FADV_WILLNEED),
        (7 + 2 * CHUNK, CHUNK - 2, os.POSIX_FADV_WILLNEED),
    ]


def test_window_cost_is_linear_in_the_item_count() -> None:
    # With tiny items the byte limit covers thousands of them: a window re-summed on every
    # call asks for the sizes n^2 / 2 times (verify of 20,000 tensors took 114 s).
    n = 20_000
    looked_up = 0

    def nbytes(item: int) -> int:
        nonlocal looked_up
        looked_up += 1
        return 1

    asked: list[int] = []
    window = ReadAheadWindow(list(range(n)), nbytes, asked.append, 1 << 30, min_items=2)
    for i in range(n):
        window.started(i)
    assert asked == list(range(n))
    assert looked_up <= 2 * n


def test_read_ahead_merges_back_to_back_requests_of_one_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"\0" * 4096)
    calls: list[tuple[int, int]] = []
    done = threading.Event()
    gate = threading.Event()
    real_open = os.open

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length))
        if offset + length >= 1000:
            done.set()

    def slow_open(p: str, flags: int, *args: int) -> int:
        gate.wait(5.0)  # hold the thread so the requests below queue up behind the first
        return real_open(p, flags, *args)

    monkeypatch.setattr(os, "posix_fadvise", advise)
    monkeypatch.setattr(os, "open", slow_open)
    readahead.read_ahead(path, 0, 8)
    for k in range(1, 100):
        readahead.read_ahead(path, 10 * k, 10)  # back to back, with 2-byte gaps
    gate.set()
    assert done.wait(5.0)
    assert calls[-1][0] + calls[-1][1] == 1000
    assert len(calls) <= 3  # one range, not one request per tensor
