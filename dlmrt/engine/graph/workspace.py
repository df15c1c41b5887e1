"""Workspace: an engine's device memory, the same for both styles.

- one arena (the style's KV storage), sized to the largest request so far, rounded up to
  `ARENA_QUANTUM` rows; a growth drops every program (their graphs hold pointers into the old
  arena), so the next request recaptures;
- one CUDA graph memory pool shared by every graph of the engine (they never run concurrently),
  a fresh one with each arena (torch releases the old one's cached memory, once its graphs and
  tensors are gone, at an allocation that would otherwise fail or at `empty_cache`),
  over an allocator with expandable segments (`dlmrt/engine/allocator.py`: reserved memory stays
  near allocated memory);
- `extras`: other graphs over the arena (the block style's prefill graphs), dropped with it;
- programs (static buffers + the runner that holds their graphs) per request shape, in a bounded
  LRU cache (`runner_cache.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import torch

from dlmrt import capture_guard
from dlmrt.config import EAGER
from dlmrt.engine.allocator import use_expandable_segments
from dlmrt.engine.graph.loop import Runner, make_runner
from dlmrt.engine.graph.runner_cache import RunnerCache

ARENA_QUANTUM = 1024  # the arena grows in steps of this many rows (each growth recaptures graphs)
A = TypeVar("A")


class Workspace(Generic[A]):
    def __init__(self, mode: str, new_arena: Callable[[int], A], device: torch.device) -> None:
        use_expandable_segments(device)  # before the arena and the graphs' pool are allocated
        self.mode = mode
        self._new_arena = new_arena  # rows -> a zeroed arena of that many rows
        self.arena: A | None = None  # KVCache or ContextArena: both have `max_len`
        self.programs = RunnerCache()
        # Other holders of graphs over the arena (the block style's prefill graphs, by name):
        # dropped with the programs when the arena grows.
        self.extras: dict[str, Any] = {}
        self.pool = torch.cuda.graph_pool_handle() if mode != EAGER else None

    def reserve(self, rows: int) -> A:
        """The arena, grown first if it holds fewer than `rows` rows."""
        if self.arena is None or self.arena.max_len < rows:
            self.arena = None  # free the old one before allocating the new one
            # graphs hold pointers into the old arena; they die once no capture runs
            capture_guard.release((list(self.programs.values()), list(self.extras.values())))
            self.programs.clear()
            self.extras.clear()
            if self.pool is not None:  # a fresh pool: a capture into one whose graphs all died
                # while tensors it lent are alive asserts in torch's allocator (use_count 0)
                self.pool = torch.cuda.graph_pool_handle()
            self.arena = self._new_arena(-(-rows // ARENA_QUANTUM) * ARENA_QUANTUM)
        return self.arena

    def extra(self, key: str, build: Callable[[], Any]) -> Any:
        """`extras[key]`, built on first use over the current arena (dropped when it grows)."""
        if key not in self.extras:
            self.extras[key] = build()
        return self.extras[key]

    def program(self, key: Hashable, build: Callable[[Runner], Any]) -> Any:
        """The program for `key`, built with a fresh runner of the engine's mode on first use."""
        return self.programs.fetch(key, lambda: build(make_runner(self.mode, self.pool)))
