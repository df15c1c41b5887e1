"""GPU time of a call, as the engine's graphs run it: the start-up choices' one timer
(fp8_choice, nvfp4_choice, flash_attn4)."""

from __future__ import annotations

import torch

from dlmrt import capture_guard


def graph_time_us(fn, reps: int = 20) -> float:
    """GPU µs per call of `fn`, replayed from a CUDA graph of `reps` calls (as the rounds run it:
    no Python or launch overhead in the comparison)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * reps)
