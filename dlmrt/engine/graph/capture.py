"""Capture helpers shared by the graph runners: warm-up, capture, snapshot/restore, the stop check.

A captured body is warmed up first on the capture stream (Triton JIT, cuBLAS workspaces, lazy
allocations must not happen during capture). Warm-ups run real passes over the static buffers, so
the buffers they change are snapshotted before and restored after: a capture leaves no trace but
the graph (and the arena rows the body writes, which are scratch until a commit rewrites them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from dlmrt import capture_guard
from dlmrt.errors import GenerationCancelled
from dlmrt.outputs import StopCheck

Saved = list[tuple[torch.Tensor, torch.Tensor]]


def check_stop(should_stop: StopCheck | None) -> None:
    """Raise `GenerationCancelled` if the caller asked to stop (polled on the host)."""
    if should_stop is not None and should_stop():
        raise GenerationCancelled("cancelled by should_stop()")


def snapshot(objs: Iterable[object]) -> Saved:
    """Every tensor attribute of the given buffers, cloned."""
    return [(t, t.clone()) for o in objs for t in vars(o).values() if isinstance(t, torch.Tensor)]


def restore(saved: Saved) -> None:
    for t, c in saved:
        t.copy_(c)


def warm_up(fn: Callable[[], None], stream: torch.cuda.Stream, times: int = 2) -> None:
    """Run `fn` on the capture stream, ordered after the current stream's work."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(stream)


def capture(fn: Callable[[], None], stream: torch.cuda.Stream, pool) -> torch.cuda.CUDAGraph:
    """Warm `fn` up, then capture it into a graph in the engine's memory pool."""
    warm_up(fn, stream)
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph, stream=stream, pool=pool):
        fn()
    return graph
