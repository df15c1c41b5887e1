"""The stream's lag (engine/block/stream_lag.py): from a round's publish (device clock, plus the
calibrated offset) to the feed's hand-over of the rows it made final, recorded against the
oldest slot of a poll whose rows grew the final prefix. CPU, with a fake ring and host clock; the
calibration and the kernel's clock: tests/engine/test_token_stream_gpu.py."""

from __future__ import annotations

import pytest

from dlmrt.blocks import layout
from dlmrt.engine.block import stream_lag
from dlmrt.engine.block.row_stream import Slot
from dlmrt.engine.block.stream_lag import StreamLag
from dlmrt.engine.block.token_feed import TokenFeed


class _Rows:
    """A ring that returns the queued polls: each a list of (rows, published_ns)."""

    def __init__(self) -> None:
        self.queue: list[list[tuple[list[int], int]]] = []

    def poll(self) -> list[Slot]:
        polled = self.queue.pop(0) if self.queue else []
        return [
            Slot(i + 1, 4, False, rows, None, None, None, ns) for i, (rows, ns) in enumerate(polled)
        ]

    def clear(self) -> None:
        pass


@pytest.fixture
def recorder(monkeypatch):
    monkeypatch.setattr(stream_lag, "clock", lambda: 50_000)  # the host's clock at a hand-over
    rec = StreamLag(offset_ns=1_000)  # host = device + 1000
    monkeypatch.setattr(stream_lag, "RECORDER", rec)
    return rec


def _feed():
    calls: list[list[int]] = []
    rows = _Rows()
    feed = TokenFeed(calls.append, layout(5, 12, 4), set(), 12, False, rows)
    feed.start_block(1, [])  # block 1: row 0 is the prompt's tail
    return feed, rows, calls


def test_the_lag_runs_from_the_oldest_slot_that_grew_the_final_prefix(recorder):
    feed, rows, calls = _feed()
    rows.queue = [[([99, 7, -1, -1], 10_000), ([99, 7, 8, -1], 20_000), ([99, 7, 8, 9], 30_000)]]
    feed.poll()
    assert calls == [[7, 8, 9]]
    assert recorder.lags_ns == [50_000 - (10_000 + 1_000)]  # row 1 waited since the first slot
    rows.queue = [[([99, 7, 8, -1], 40_000)]]  # nothing new: no hand-over, nothing recorded
    feed.poll()
    assert recorder.lags_ns == [39_000]


def test_a_slot_that_only_repeats_the_prefix_is_not_where_the_wait_began(recorder):
    feed, rows, calls = _feed()
    rows.queue = [
        [([99, 7, -1, -1], 10_000)],
        [([99, 7, -1, -1], 20_000), ([99, 7, 8, -1], 30_000)],
    ]
    feed.poll()
    feed.poll()
    assert calls == [[7], [7, 8]]
    assert recorder.lags_ns == [39_000, 50_000 - 31_000]  # the second from the slot that grew


def test_a_prompt_tail_row_is_not_a_grown_prefix(recorder):
    feed, rows, calls = _feed()  # block 1's row 0 is the prompt's tail (always resolved)
    rows.queue = [[([99, -1, -1, -1], 10_000), ([99, 7, -1, -1], 20_000)]]
    feed.poll()
    assert calls == [[7]] and recorder.lags_ns == [50_000 - 21_000]


def test_the_hand_over_is_timed_before_the_listener_runs(monkeypatch):
    ticks = iter([50_000, 90_000])  # the second would be after the listener
    monkeypatch.setattr(stream_lag, "clock", lambda: next(ticks))
    rec = StreamLag(offset_ns=0)
    monkeypatch.setattr(stream_lag, "RECORDER", rec)
    feed, rows, calls = _feed()
    rows.queue = [[([99, 7, -1, -1], 10_000)]]
    feed.poll()
    assert rec.lags_ns == [40_000]


def test_an_unstamped_slot_records_nothing(recorder):
    feed, rows, calls = _feed()
    rows.queue = [[([99, 7, 8, 9], 0)]]  # the CPU ring: no device clock
    feed.poll()
    assert calls == [[7, 8, 9]] and recorder.lags_ns == []
    assert recorder.summary() == {"lag_count": 0, "lag_ms_median": None, "lag_ms_max": None}


def test_the_summary_is_in_milliseconds():
    rec = StreamLag(0)
    for ns in (1_000_000, 3_000_000, 2_000_000):
        rec.record(ns + 10, handed_ns=2 * ns + 10)
    assert rec.summary() == {"lag_count": 3, "lag_ms_median": 2.0, "lag_ms_max": 3.0}
