"""The capture guard on the CPU: the cyclic GC collected, then disabled and frozen inside, restored
after (also on an exception, also nested); what the caches drop during a capture dies after it.

The GPU twin (a real graph in cyclic garbage during a real capture): tests/engine/test_capture_guard_gpu.py.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from dlmrt import capture_guard
from dlmrt.config import EAGER
from dlmrt.engine.graph.runner_cache import RunnerCache
from dlmrt.engine.graph.workspace import Workspace


class Node:
    """A cycle: unreachable once its last outside reference goes, but only the cyclic GC frees it."""

    def __init__(self) -> None:
        self.me = self


class Leaf:
    """No cycle: freed the moment its last reference goes (as a runner a cache drops)."""


def _cycle() -> weakref.ref:
    """A weak reference to a fresh cycle that is already garbage."""
    node = Node()
    ref = weakref.ref(node)
    del node
    return ref


@pytest.fixture(autouse=True)
def gc_as_found():
    """Each test leaves the interpreter's GC as it found it, even when a check fails."""
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    gc.enable() if enabled else gc.disable()
    assert not capture_guard.capturing()


def test_inside_the_gc_is_off_and_frozen_and_after_it_is_as_before():
    gc.enable()
    with capture_guard.guard():
        assert capture_guard.capturing()
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    with capture_guard.guard():
        assert not gc.isenabled()
    assert not gc.isenabled()  # it was off before: it stays off


def test_it_collects_dead_cycles_first():
    gc.enable()
    ref = _cycle()
    with capture_guard.guard():
        assert ref() is None


def test_allocations_inside_collect_nothing():
    """The GPU failure's mechanism: a cycle dying during the capture, then allocations enough for
    Python's own GC to run many times over (threshold 10); the cycle must outlive the guard."""
    gc.enable()
    gc.set_threshold(10, 1, 1)
    with capture_guard.guard():
        ref = _cycle()
        junk = [[] for _ in range(10_000)]
        assert ref() is not None
        del junk
    gc.collect()
    assert ref() is None


def test_an_explicit_collection_inside_spares_what_lived_at_entry():
    """A library's gc.collect() during a capture: what was alive when the guard opened is frozen
    (a runner a cache drops mid-capture), so it outlives the guard."""
    gc.enable()
    live = Node()
    ref = weakref.ref(live)
    with capture_guard.guard():
        del live
        gc.collect()
        assert ref() is not None
    gc.collect()
    assert ref() is None


def test_an_exception_restores_the_gc():
    gc.enable()
    with pytest.raises(RuntimeError, match="capture failed"):
        with capture_guard.guard():
            raise RuntimeError("capture failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert not capture_guard.capturing()


def test_nested_guards_restore_only_at_the_outermost():
    gc.enable()
    with capture_guard.guard():
        with capture_guard.guard():
            pass
        assert capture_guard.capturing()
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        with pytest.raises(ValueError):
            with capture_guard.guard():
                raise ValueError("inner")
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_objects_frozen_by_the_caller_stay_frozen():
    gc.enable()
    gc.freeze()
    with capture_guard.guard():
        assert not gc.isenabled()
    assert gc.get_freeze_count() > 0 and gc.isenabled()  # not unfrozen by the guard


def test_release_holds_a_reference_until_the_last_guard_closes():
    held = Leaf()
    ref = weakref.ref(held)
    with capture_guard.guard():
        with capture_guard.guard():
            capture_guard.release(held)
            del held
        assert ref() is not None  # an outer capture still runs
    assert ref() is None
    outside = torch.zeros(1)
    ref = weakref.ref(outside)
    capture_guard.release(outside)  # no capture: nothing held
    del outside
    assert ref() is None


def test_the_runner_cache_evicts_after_the_capture():
    cache = RunnerCache(1)
    first = cache.fetch("a", Leaf)
    ref = weakref.ref(first)
    del first
    with capture_guard.guard():
        cache.fetch("b", Leaf)
        assert list(cache) == ["b"]
        assert ref() is not None
    assert ref() is None


def test_an_arena_growth_drops_programs_after_the_capture():
    ws = Workspace(EAGER, lambda rows: type("Arena", (), {"max_len": rows})(), torch.device("cpu"))
    ws.reserve(1)
    program = ws.program("p", lambda runner: Leaf())
    extra = ws.extra("e", Leaf)
    refs = weakref.ref(program), weakref.ref(extra)
    del program, extra
    with capture_guard.guard():
        ws.reserve(ws.arena.max_len + 1)
        assert not ws.programs and not ws.extras
        assert all(r() is not None for r in refs)
    assert all(r() is None for r in refs)


def test_an_arena_growth_gives_the_graphs_a_fresh_pool(monkeypatch):
    """torch's allocator asserts when a capture goes into a pool whose graphs all died while a
    tensor it lent lives on: so the graphs over a grown arena capture into a new pool."""
    handles = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(handles)))
    monkeypatch.setattr("dlmrt.engine.graph.workspace.use_expandable_segments", lambda device: None)
    arena = lambda rows: type("Arena", (), {"max_len": rows})()  # noqa: E731
    ws = Workspace("block_graph", arena, torch.device("cpu"))
    ws.reserve(1)
    first = ws.pool
    ws.reserve(ws.arena.max_len)
    assert ws.pool == first  # no growth, no new pool
    ws.reserve(ws.arena.max_len + 1)
    assert ws.pool not in (None, first)
