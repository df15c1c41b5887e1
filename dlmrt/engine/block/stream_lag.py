"""StreamLag: how long a row that became final in a round takes to reach `on_tokens` (issue 54).

The publish kernel stamps each slot with the device's clock (`%globaltimer`, ns:
`csrc/slot_publish.cu`); the host knows its own clock (`time.perf_counter_ns`) when it hands rows
to `on_tokens`. The two clocks differ by an offset, measured once (`calibrate`): a one-thread
kernel writes the device's clock into pinned, mapped host memory and the host, spinning on it,
notes its own clock when the value appears. offset = host - device is then the true offset plus
the write's trip to the host (a few µs); the smallest of several tries is kept, so a lag computed
with it (host at the hand-over - (device at the publish + offset)) is short of the true lag by
that trip at most: an underestimate of a few µs, against a round of milliseconds.

A row is final from the round that resolved it (`token_feed.py`); when a poll hands over new
rows, the lag recorded is the hand-over's host time minus the publish of the oldest slot of that
poll whose rows grew the final prefix: the longest any row of the hand-over waited.

Measurement only: off (`RECORDER is None`) unless a benchmark or test sets it (`start`), and then
only CUDA slots carry a clock (a CPU slot's 0 is skipped).
"""

from __future__ import annotations

import ctypes
import statistics
import time

import torch

TRIES = 20  # calibration launches; the smallest offset is the tightest
SPIN_S = 5.0  # a calibration stamp not seen by then: the launch failed


class StreamLag:
    def __init__(self, offset_ns: int) -> None:
        """offset_ns: host clock - device clock (`calibrate`)."""
        self.offset_ns = offset_ns
        self.lags_ns: list[int] = []  # one per hand-over that had a stamped slot

    def record(self, published_ns: int, handed_ns: int) -> None:
        """A hand-over at `handed_ns` (host clock, just before `on_tokens` was called) of rows
        final since the publish stamped `published_ns` (device clock; 0: unstamped, ignored)."""
        if published_ns:
            self.lags_ns.append(handed_ns - (published_ns + self.offset_ns))

    def summary(self) -> dict:
        """Median and max lag in ms, and how many hand-overs were measured."""
        if not self.lags_ns:
            return {"lag_count": 0, "lag_ms_median": None, "lag_ms_max": None}
        ms = [v / 1e6 for v in self.lags_ns]
        return {
            "lag_count": len(ms),
            "lag_ms_median": round(statistics.median(ms), 4),
            "lag_ms_max": round(max(ms), 4),
        }


RECORDER: StreamLag | None = None


def clock() -> int:
    """The host's clock, ns (`time.perf_counter_ns`; a function of this module: tests set it)."""
    return time.perf_counter_ns()


def calibrate(tries: int = TRIES) -> int:
    """CUDA: host clock - device clock in ns (the smallest of `tries` round trips)."""
    from dlmrt.engine.block.row_stream import device_pointer
    from dlmrt.engine.graph import nvrtc

    fn, _ = nvrtc.function("clock_stamp.cu", "dlmrt_clock_stamp")
    cell = torch.zeros(1, dtype=torch.long, pin_memory=True)
    view, ptr = cell.numpy(), device_pointer(cell)
    best = None
    for _ in range(tries):
        torch.cuda.synchronize()
        view[0] = 0
        nvrtc.launch(fn, 1, ((ptr,), (ctypes.c_void_p,)))
        deadline = time.monotonic() + SPIN_S
        while view[0] == 0:  # spin: the kernel's store reaches host memory
            if time.monotonic() > deadline:
                torch.cuda.synchronize()  # raises a failed launch's error, if it left one
                raise RuntimeError(f"calibrate: no device clock stamp within {SPIN_S} s")
        offset = clock() - int(view[0])
        best = offset if best is None else min(best, offset)
    torch.cuda.synchronize()
    return best


def start(device: torch.device) -> StreamLag:
    """Record lags from now on (CUDA: calibrated; CPU: nothing is stamped, nothing recorded)."""
    global RECORDER
    RECORDER = StreamLag(calibrate() if device.type == "cuda" else 0)
    return RECORDER


def stop() -> StreamLag | None:
    """Stop recording; returns what was recorded."""
    global RECORDER
    out, RECORDER = RECORDER, None
    return out
