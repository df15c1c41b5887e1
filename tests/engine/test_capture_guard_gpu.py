"""GPU: a CUDA graph in cyclic garbage is not destroyed during a later capture.

The failure this guards against: a graph held by a dead reference cycle (a dropped runner) is
freed by Python's own GC, triggered by allocations while another graph is being captured; CUDA
refuses to destroy a graph during a capture and invalidates it ("operation not permitted when
stream is capturing"). Here the cycle dies inside the capture and the GC threshold is low, so
without the guard the GC collects it mid-capture; no explicit gc.collect() is involved.

Run on the device machine: pytest -m gpu. The CPU twin: tests/test_capture_guard.py.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from dlmrt.engine.graph.capture import capture

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class Holder:
    def __init__(self, graph: object) -> None:
        self.graph, self.me = graph, self  # a cycle: only the cyclic GC frees it


def _chain(body, stream, pool):
    """The block_graph route: one pass captured as a child of a GraphChain (cuda.bindings)."""
    pytest.importorskip("cuda.bindings")
    from dlmrt.engine.graph.while_graph import GraphChain

    graph = GraphChain([body], stream, pool)
    return graph.launch


def _round(body, stream, pool):
    """The round_graph / prefill route: `capture`."""
    return capture(body, stream, pool).replay


@pytest.mark.parametrize("route", [_round, _chain], ids=["capture", "graph_chain"])
def test_a_graph_in_cyclic_garbage_outlives_a_later_capture(route):
    stream, pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()
    x = torch.zeros(4, device="cuda")
    old = [capture(lambda: x.add_(1), stream, pool)]  # a list: the body below drops it
    seen: dict[str, object] = {}

    def body() -> None:
        x.add_(10)
        if torch.cuda.is_current_stream_capturing():  # not in the warm-up runs
            holder = Holder(old.pop())
            seen["ref"] = weakref.ref(holder)
            del holder  # the cycle, and the captured graph it holds, are garbage now
            junk = [[] for _ in range(20_000)]  # Python's GC runs many times (threshold 10)
            seen["alive"] = seen["ref"]() is not None
            del junk

    thresholds = gc.get_threshold()
    gc.set_threshold(10, 1, 1)
    try:
        launch = route(body, stream, pool)
    finally:
        gc.set_threshold(*thresholds)
    assert seen["alive"], "the GC destroyed a graph during the capture"
    x.zero_()
    launch()
    torch.cuda.synchronize()
    assert x.tolist() == [10.0] * 4
    gc.collect()
    assert seen["ref"]() is None  # it dies after the capture
