"""The capture guard: no CUDA graph is destroyed while another is being captured.

CUDA refuses to destroy a graph (its exec, its graph, its share of a memory pool) while a stream
is capturing in the default "global" mode: the capture is invalidated ("operation not permitted
when stream is capturing"). Graphs die at moments a capture cannot foresee:

- Python's cyclic GC, which any allocation can trigger, collects a dead cycle that holds a graph
  (a dropped runner: its bodies' closures refer back to the buffers and runner that hold them);
- a cache drops the last reference to one (the runner cache's eviction, an arena growth).

So every capture runs inside `guard()` (or `graph()`, which also captures): the outermost one
first collects the cyclic garbage, then disables the cyclic GC and freezes every tracked object
until it ends, and restores both as they were, also when the capture raises; `release(obj)` holds
what a cache drops until no capture runs. Nesting and captures on several threads share one
count: only the outermost guard collects, disables and restores.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_lock = threading.RLock()  # reentrant: a finalizer run by gc.collect() may call release()
_depth = 0  # guards open now, on every thread
_pending: list[object] = []  # what release() held back while a capture ran
_restore: tuple[bool, bool] = (False, False)  # (GC was enabled, we froze) at the outermost entry


def capturing() -> bool:
    """Whether a capture guard is open (on any thread)."""
    return _depth > 0


def release(obj: object) -> None:
    """Drop a reference to `obj` (something that may hold graphs): now when no capture runs,
    else when the last open guard closes."""
    with _lock:
        if _depth > 0:
            _pending.append(obj)


@contextmanager
def guard() -> Iterator[None]:
    """Run the body with the cyclic GC collected, then disabled and frozen (see the module)."""
    _enter()
    try:
        yield
    finally:
        _exit()


@contextmanager
def graph(
    cuda_graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream | None = None, pool=None
) -> Iterator[None]:
    """`torch.cuda.graph(cuda_graph, stream=stream, pool=pool)` inside `guard()`: the one way
    dlmrt captures a CUDA graph."""
    with guard(), torch.cuda.graph(cuda_graph, stream=stream, pool=pool):
        yield


def _enter() -> None:
    global _depth, _restore
    with _lock:
        if _depth == 0:
            gc.collect()  # dead graphs go now, while nothing captures
            enabled, unfrozen = gc.isenabled(), gc.get_freeze_count() == 0
            gc.disable()
            if unfrozen:  # freeze only from nothing frozen, so that exit can restore exactly
                gc.freeze()  # an explicit gc.collect() during the capture sees none of these
            _restore = (enabled, unfrozen)
        _depth += 1


def _exit() -> None:
    global _depth
    with _lock:
        _depth -= 1
        if _depth > 0:
            return
        enabled, froze = _restore
        if froze:
            gc.unfreeze()
        if enabled:
            gc.enable()
        _pending.clear()  # under the lock: no guard can open while what it held dies
