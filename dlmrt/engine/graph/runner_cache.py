"""RunnerCache: the engines' programs (static buffers + a runner's captured graphs) per request shape, bounded.

A runner is keyed by what its graphs bake in as constants (block length, rule and its thresholds,
temperature; DiffusionGemma's canvas settings), so every distinct per-request override builds a new
one. Each holds device buffers and, in graph modes, graphs in the engine's memory pool (a
DiffusionGemma-26B runner's self-conditioning buffer alone is 128 MiB), so a client sweeping a
setting must not grow them without bound: the least recently used runner is dropped beyond
`MAX_RUNNERS` (its graphs and buffers are freed, once no capture runs: `dlmrt/capture_guard.py`;
asking for it again rebuilds and recaptures).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from dlmrt import capture_guard

log = logging.getLogger("dlmrt")
MAX_RUNNERS = 4


class RunnerCache(OrderedDict):
    """An ordered dict of runners that evicts the least recently used beyond `max_size`."""

    def __init__(self, max_size: int = MAX_RUNNERS) -> None:
        super().__init__()
        self.max_size = max_size

    def fetch(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The runner for `key`, built on first use; the least recently used one beyond
        `max_size` is evicted."""
        if key in self:
            self.move_to_end(key)
            return self[key]
        item = self[key] = build()
        while len(self) > self.max_size:
            old, runner = self.popitem(last=False)
            capture_guard.release(runner)  # its graphs die once no capture runs
            log.info("runner cache full (%d): dropped the runner for %s", self.max_size, old)
        return item
