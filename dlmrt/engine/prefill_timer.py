"""PrefillTimer: the time of each request's prefill, recorded only when a caller asks for it.

The engines run the prefill as part of `generate` (block style: the prompt's full blocks that were
not reused; encoder-decoder style: the prompt's encoder pass over the rows not reused), so a
caller cannot time it from outside. A benchmark that wants it sets `engine.prefill_timer =
PrefillTimer()`; each prefill is then bracketed by two CUDA events (on the CPU, where the work is
synchronous: the host clock) and its row count kept. Recording never syncs: `take()` waits for
the last event when the caller reads the spans back. Without a timer (the default) the engines
record nothing and `prefill_span` is a no-op context.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch


class PrefillTimer:
    """The prefills since the last `take()`: rows each ran and their device time."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, object, object]] = []  # rows, start, end (events or seconds)

    @contextlib.contextmanager
    def span(self, rows: int, device: torch.device) -> Iterator[None]:
        """Time the work queued inside the `with` block as one prefill of `rows` rows."""
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self._spans.append((rows, start, end))

    def take(self) -> tuple[int, float]:
        """(rows prefilled, milliseconds) summed over the prefills since the last take, and
        forget them; (0, 0.0) when no prefill ran (a fully reused prompt). Waits for the last
        prefill's end event on CUDA."""
        spans, self._spans = self._spans, []
        rows, ms = 0, 0.0
        for n, start, end in spans:
            rows += n
            if isinstance(start, torch.cuda.Event):
                end.synchronize()
                ms += start.elapsed_time(end)
            else:
                ms += (end - start) * 1e3
        return rows, ms


def prefill_span(
    timer: PrefillTimer | None, rows: int, device: torch.device
) -> contextlib.AbstractContextManager:
    """The engines' hook: `timer.span(rows, device)`, or nothing at all without a timer."""
    return contextlib.nullcontext() if timer is None else timer.span(rows, device)
