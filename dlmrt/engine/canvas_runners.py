"""Canvas runners: DiffusionGemma's three execution modes over the static step (canvas_static.py).

    run_canvas(max_steps) -> steps          advance() -> None (commit this canvas, start the next)

eager        `canvas_step` in a Python loop; the host reads `done` after every step (CPU and GPU).
round_graph  one CUDA graph per step, replayed from a host loop that reads `done`; `advance` is
             a second captured graph.
block_graph  the step graph + condition kernel as the body of a conditional WHILE node (WHILE
             not done and step < max_denoising_steps): one launch per canvas. The commit of the
             previous canvas and the next noise canvas (`advance`) are their own captured graph,
             launched just before on the same stream, with no host sync in between.
All three run the same functions on the same buffers and arena, so they give the same tokens.
Graphs are captured lazily on a request's first canvas and reused by every later canvas and
request until the arena grows (pattern and helpers: engine/runners.py, engine/conditional.py).
"""

from __future__ import annotations

import torch

from dlmrt.engine.canvas_arena import ContextArena
from dlmrt.engine.canvas_static import CanvasBuffers, CanvasSpec, advance, canvas_step
from dlmrt.engine.runners import StopCheck, _capture, _check, _restore, _snapshot


class CanvasEagerRunner:
    name = "eager"

    def __init__(self, spec: CanvasSpec, buf: CanvasBuffers, arena: ContextArena) -> None:
        self.spec, self.buf, self.arena = spec, buf, arena
        self.should_stop: StopCheck | None = None

    def run_canvas(self, max_steps: int) -> int:
        for r in range(max_steps):
            _check(self.should_stop)
            canvas_step(self.spec, self.buf, self.arena)
            if bool(self.buf.done):  # the host reads the flag each step
                return r + 1
        return max_steps

    def advance(self) -> None:
        advance(self.spec, self.buf, self.arena)


class CanvasRoundGraphRunner(CanvasEagerRunner):
    """Captured lazily on the first canvas (warm-ups write only scratch arena rows; the buffers
    are restored after them)."""

    name = "round_graph"

    def __init__(self, spec: CanvasSpec, buf: CanvasBuffers, arena: ContextArena, pool) -> None:
        super().__init__(spec, buf, arena)
        self.pool, self.stream = pool, torch.cuda.Stream()
        self.step_graph = self.advance_graph = None

    def _ensure(self) -> None:
        if self.step_graph is None:
            spec, buf, arena = self.spec, self.buf, self.arena
            saved = _snapshot(buf)
            self.step_graph = _capture(
                lambda: canvas_step(spec, buf, arena), self.stream, self.pool
            )
            self.advance_graph = _capture(lambda: advance(spec, buf, arena), self.stream, self.pool)
            _restore(saved)  # undo the warm-up steps

    def run_canvas(self, max_steps: int) -> int:
        self._ensure()
        for r in range(max_steps):
            _check(self.should_stop)
            self.step_graph.replay()
            if bool(self.buf.done):
                return r + 1
        return max_steps

    def advance(self) -> None:
        self._ensure()
        self.advance_graph.replay()


class CanvasBlockGraphRunner(CanvasRoundGraphRunner):
    """One launch per canvas: WHILE(not done and step < max_denoising_steps){ step }; one read-back."""

    name = "block_graph"

    def __init__(self, spec: CanvasSpec, buf: CanvasBuffers, arena: ContextArena, pool) -> None:
        super().__init__(spec, buf, arena, pool)
        self.max_steps, self.block = spec.settings.max_denoising_steps, None

    def _ensure(self) -> None:
        if self.block is None:
            from dlmrt.engine.conditional import WhileGraph, launch_condition

            spec, buf, arena = self.spec, self.buf, self.arena
            saved = _snapshot(buf)
            super()._ensure()  # warm-up + the advance graph (and a step graph)

            def body(handle: int) -> None:
                canvas_step(spec, buf, arena)
                launch_condition(handle, buf.done, buf.step, self.max_steps)

            self.block = WhileGraph(body, self.stream, self.pool)
            _restore(saved)

    def run_canvas(self, max_steps: int) -> int:
        self._ensure()
        _check(self.should_stop)  # a WHILE node runs the whole canvas: check before it
        self.block.launch()
        return int(self.buf.step)  # the one host sync of the canvas


RUNNERS = {r.name: r for r in (CanvasEagerRunner, CanvasRoundGraphRunner, CanvasBlockGraphRunner)}
