"""Block runners: the three execution modes of one block's denoising loop, behind one interface.

    run_block(buf, kv, kv_len, max_rounds) -> rounds     commit(buf, kv, kv_len) -> None

eager        the round in a Python loop; the host reads `done` after every round (CPU and GPU).
round_graph  one CUDA graph per round, replayed from a host loop that reads `done`.
block_graph  the round graph as the body of a conditional WHILE node: one launch per block.
All three run the same `denoise_round` on the same static buffers, so they give the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlmrt.engine.round import BlockBuffers, RoundSpec, commit_pass, denoise_round
from dlmrt.errors import GenerationCancelled

# (round index, (canvas, unresolved, z) the round consumed, buffers after the round)
RoundHook = Callable[[int, tuple, BlockBuffers], None]
StopCheck = Callable[[], bool]  # polled between rounds (host loops) or blocks (block_graph)


def _check(should_stop: StopCheck | None) -> None:
    if should_stop is not None and should_stop():
        raise GenerationCancelled("cancelled by should_stop()")


class EagerRunner:
    name = "eager"

    def __init__(self, spec: RoundSpec, on_round: RoundHook | None = None) -> None:
        self.spec, self.on_round = spec, on_round
        self.should_stop: StopCheck | None = None

    def run_block(self, buf: BlockBuffers, kv, kv_len: int | None, max_rounds: int) -> int:
        for r in range(max_rounds):
            _check(self.should_stop)
            seen = None
            if self.on_round is not None:
                z = None if buf.z is None else buf.z.clone()
                seen = (buf.canvas.clone(), buf.unresolved.clone(), z)
            denoise_round(self.spec, buf, kv, kv_len)
            if self.on_round is not None:
                self.on_round(r, seen, buf)
            if bool(buf.done):  # the host reads the flag each round
                return r + 1
        return max_rounds

    def commit(self, buf: BlockBuffers, kv, kv_len: int) -> None:
        commit_pass(self.spec, buf, kv, kv_len)


def _capture(fn: Callable[[], None], stream: torch.cuda.Stream, pool) -> torch.cuda.CUDAGraph:
    """Warm up `fn` on the capture stream (Triton JIT, cuBLAS workspaces), then capture it."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, pool=pool):
        fn()
    return graph


class RoundGraphRunner:
    """Captured lazily on the first block (warm-up rounds write only that block's scratch KV rows)."""

    name = "round_graph"

    def __init__(self, spec: RoundSpec, buf: BlockBuffers, kv, pool) -> None:
        self.spec, self.buf, self.kv, self.pool = spec, buf, kv, pool
        self.stream = torch.cuda.Stream()
        self.round_graph = self.commit_graph = None
        self.should_stop: StopCheck | None = None

    def _ensure(self, buf: BlockBuffers) -> None:
        if self.round_graph is None:
            snapshot = (buf.canvas.clone(), buf.unresolved.clone())
            self.round_graph = _capture(
                lambda: denoise_round(self.spec, buf, self.kv), self.stream, self.pool
            )
            self.commit_graph = _capture(
                lambda: commit_pass(self.spec, buf, self.kv), self.stream, self.pool
            )
            buf.load(*snapshot, int(buf.block_start), int(buf.seed))  # undo the warm-up rounds

    def run_block(self, buf: BlockBuffers, kv, kv_len: int, max_rounds: int) -> int:
        self._ensure(buf)
        for r in range(max_rounds):
            _check(self.should_stop)
            self.round_graph.replay()
            if bool(buf.done):
                return r + 1
        return max_rounds

    def commit(self, buf: BlockBuffers, kv, kv_len: int) -> None:
        self._ensure(buf)
        self.commit_graph.replay()


class BlockGraphRunner(RoundGraphRunner):
    """One launch per block: WHILE(not done and step < max_rounds){ round }; one read-back."""

    name = "block_graph"

    def __init__(self, spec: RoundSpec, buf: BlockBuffers, kv, pool, max_rounds: int) -> None:
        super().__init__(spec, buf, kv, pool)
        self.max_rounds, self.block = max_rounds, None

    def _ensure(self, buf: BlockBuffers) -> None:
        if self.block is None:
            from dlmrt.engine.conditional import WhileGraph, launch_condition

            snapshot = (buf.canvas.clone(), buf.unresolved.clone())
            super()._ensure(
                buf
            )  # warm-up + the commit graph (and a round graph, for the self-test)

            def body(handle: int) -> None:
                denoise_round(self.spec, buf, self.kv)
                launch_condition(handle, buf.done, buf.step, self.max_rounds)

            self.block = WhileGraph(body, self.stream, self.pool)
            buf.load(*snapshot, int(buf.block_start), int(buf.seed))

    def run_block(self, buf: BlockBuffers, kv, kv_len: int, max_rounds: int) -> int:
        self._ensure(buf)
        _check(self.should_stop)  # a WHILE node runs the whole block: check before it
        self.block.launch()
        return int(buf.step)  # the one host sync of the block
