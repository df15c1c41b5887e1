"""Block runners: the three execution modes of one block's denoising loop, behind one interface.

    run_block(buf, kv, kv_len, max_rounds, first) -> rounds   commit(buf, kv, kv_len) -> None
    fold(fb, buf, kv, kv_len) -> None    joint passes [block b | block b+1] until none is discarded

eager        the round in a Python loop; the host reads `done` after every round (CPU and GPU).
round_graph  one CUDA graph per round, replayed from a host loop that reads `done`.
block_graph  the round graph as the body of a conditional WHILE node: one launch per block.
All three run the same `denoise_round` and `joint_pass` on the same static buffers, so they give
the same tokens. `run_block` runs rounds `first`.. until the block's `halt` flag (first = 1 after a
joint pass that ran round 0; zero rounds if that pass already halted the block).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlmrt.engine.fold import FoldBuffers, folds_check, joint_pass, max_passes
from dlmrt.engine.round import BlockBuffers, RoundSpec, commit_pass, denoise_round
from dlmrt.errors import GenerationCancelled

# (round index, (canvas, unresolved, z) the round consumed, buffers after the round)
RoundHook = Callable[[int, tuple, BlockBuffers], None]
StopCheck = Callable[[], bool]  # polled between rounds (host loops) or blocks (block_graph)


def _check(should_stop: StopCheck | None) -> None:
    if should_stop is not None and should_stop():
        raise GenerationCancelled("cancelled by should_stop()")


def _host_fold(spec: RoundSpec, fb: FoldBuffers, run_pass: Callable[[], None], stop) -> None:
    """The joint-pass loop of the host-driven modes: repeat while the check discards b+1's half."""
    for _ in range(max_passes(spec)):
        _check(stop)
        run_pass()
        if not folds_check(spec) or not bool(fb.redo):  # the host reads `redo` after each pass
            return
    raise RuntimeError(f"commit folding: block check still editing after {max_passes(spec)} passes")


def _snapshot(*objs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every tensor of the buffers, cloned: graph warm-ups run real passes, undone by `_restore`."""
    return [(t, t.clone()) for o in objs for t in vars(o).values() if isinstance(t, torch.Tensor)]


def _restore(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for t, c in saved:
        t.copy_(c)


class EagerRunner:
    name = "eager"

    def __init__(self, spec: RoundSpec, on_round: RoundHook | None = None) -> None:
        self.spec, self.on_round = spec, on_round
        self.should_stop: StopCheck | None = None

    def run_block(
        self, buf: BlockBuffers, kv, kv_len: int | None, max_rounds: int, first: int = 0
    ) -> int:
        if first and bool(buf.halt):
            return 0
        for r in range(first, max_rounds):
            _check(self.should_stop)
            seen = None
            if self.on_round is not None:
                z = None if buf.z is None else buf.z.clone()
                seen = (buf.canvas.clone(), buf.unresolved.clone(), z)
            denoise_round(self.spec, buf, kv, kv_len)
            if self.on_round is not None:
                self.on_round(r, seen, buf)
            if bool(buf.halt):  # the host reads the flag each round
                return r + 1 - first
        return max_rounds - first

    def commit(self, buf: BlockBuffers, kv, kv_len: int) -> None:
        commit_pass(self.spec, buf, kv, kv_len)

    def fold(self, fb: FoldBuffers, buf: BlockBuffers, kv, kv_len: int | None) -> None:
        _host_fold(
            self.spec, fb, lambda: joint_pass(self.spec, fb, buf, kv, kv_len), self.should_stop
        )


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
        self.round_graph = self.commit_graph = self.joint_graph = None
        self.should_stop: StopCheck | None = None

    def _ensure(self, buf: BlockBuffers) -> None:
        if self.round_graph is None:
            saved = _snapshot(buf)
            self.round_graph = _capture(
                lambda: denoise_round(self.spec, buf, self.kv), self.stream, self.pool
            )
            self.commit_graph = _capture(
                lambda: commit_pass(self.spec, buf, self.kv), self.stream, self.pool
            )
            _restore(saved)  # undo the warm-up rounds

    def _ensure_fold(self, fb: FoldBuffers, buf: BlockBuffers) -> None:
        # Captured at the first fold: the warm-ups write K/V only into the 2B rows that every
        # joint pass rewrites before it reads them, and the buffers are restored.
        if self.joint_graph is None:
            saved = _snapshot(buf, fb)
            self.joint_graph = _capture(
                lambda: joint_pass(self.spec, fb, buf, self.kv), self.stream, self.pool
            )
            _restore(saved)

    def run_block(self, buf: BlockBuffers, kv, kv_len: int, max_rounds: int, first: int = 0) -> int:
        self._ensure(buf)
        if first and bool(buf.halt):
            return 0
        for r in range(first, max_rounds):
            _check(self.should_stop)
            self.round_graph.replay()
            if bool(buf.halt):
                return r + 1 - first
        return max_rounds - first

    def commit(self, buf: BlockBuffers, kv, kv_len: int) -> None:
        self._ensure(buf)
        self.commit_graph.replay()

    def fold(self, fb: FoldBuffers, buf: BlockBuffers, kv, kv_len: int | None) -> None:
        self._ensure(buf)
        self._ensure_fold(fb, buf)
        _host_fold(self.spec, fb, self.joint_graph.replay, self.should_stop)


class BlockGraphRunner(RoundGraphRunner):
    """One launch per block: WHILE(not halt and step < max_rounds){ round }; one read-back.

    With folding, one more launch before it (no host sync between): WHILE(redo){ joint pass }, the
    fold loop (its own flags: `fb.settled`, `fb.passes`). A WHILE handle defaults to 1, so a body
    always runs once: right for the fold loop (there is always one joint pass), wrong for the
    round loop of a block that the joint pass already halted. So, when folding, the round loop's
    outer graph starts with an init node, the same condition kernel, that sets the handle from
    `halt` and `step` before the conditional node is evaluated: zero rounds when halted.
    """

    name = "block_graph"

    def __init__(
        self, spec: RoundSpec, buf: BlockBuffers, kv, pool, max_rounds: int, fold: bool = False
    ) -> None:
        super().__init__(spec, buf, kv, pool)
        self.max_rounds, self.folds, self.block, self.fold_loop = max_rounds, fold, None, None

    def _ensure(self, buf: BlockBuffers) -> None:
        if self.block is None:
            from dlmrt.engine.conditional import WhileGraph, launch_condition

            super()._ensure(buf)  # warm-up, the commit graph (and a round graph: self-test)

            def body(handle: int) -> None:
                denoise_round(self.spec, buf, self.kv)
                launch_condition(handle, buf.halt, buf.step, self.max_rounds)

            def init(handle: int) -> None:
                launch_condition(handle, buf.halt, buf.step, self.max_rounds)

            init_node = init if self.folds else None
            self.block = WhileGraph(body, self.stream, self.pool, init_node)

    def _ensure_fold(self, fb: FoldBuffers, buf: BlockBuffers) -> None:
        if self.fold_loop is None:
            from dlmrt.engine.conditional import WhileGraph, launch_condition

            super()._ensure_fold(fb, buf)  # warm-up (Triton JIT, cuBLAS at 2B rows), restored
            cap = max_passes(self.spec)

            def body(handle: int) -> None:
                joint_pass(self.spec, fb, buf, self.kv)
                launch_condition(handle, fb.settled, fb.passes, cap)

            self.fold_loop = WhileGraph(body, self.stream, self.pool)

    def run_block(self, buf: BlockBuffers, kv, kv_len: int, max_rounds: int, first: int = 0) -> int:
        self._ensure(buf)
        _check(self.should_stop)  # a WHILE node runs the whole block: check before it
        self.block.launch()
        return int(buf.step) - first  # the one host sync of the block

    def fold(self, fb: FoldBuffers, buf: BlockBuffers, kv, kv_len: int | None) -> None:
        self._ensure(buf)
        self._ensure_fold(fb, buf)
        _check(self.should_stop)
        self.fold_loop.launch()  # no sync: the engine reads `fb` after the block's rounds
