"""The three execution modes, over one interface that knows nothing of model families.

A style (block, encoder-decoder) describes its work as two kinds of program over static buffers:

    Loop(body, flag, counter, cap)   while not flag and counter < cap: body()
                                     (the body advances the counter and may set the flag)
    Pass(body)                       body(), once (a commit, an encoder pass)

and a runner executes them:

    eager        the body from a Python loop; the host reads the flag after every body (CPU, GPU).
    round_graph  each body captured once as a CUDA graph, replayed from the same host loop.
    block_graph  a loop is one conditional WHILE node (`while_graph.py`): an init node sets the
                 condition from (flag, counter, cap), the body graph ends with the condition
                 kernel; one launch per loop and no host sync inside it. Passes as round_graph.

`chain(parts)` runs loops and passes in order: in eager and round_graph one after the other; in
block_graph as ONE launch of a graph holding them all (`while_graph.GraphChain`), so a block's
start, its folded commit, its rounds and its read-back copy cost the host one launch (issue 23).

All three run the same bodies on the same buffers, so they produce the same tokens. Graphs are
captured lazily, at a program's first use, and kept by the runner until it is dropped (the
runner cache, or an arena growth: graphs hold pointers into the arena). Bodies must be pure
device work: no host sync, no shape that depends on data (see `dlmrt/decoding/base.py`).
`run` never reads device values back in block_graph: the caller reads the counters it needs
(one sync per block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrt.config import BLOCK_GRAPH, EAGER, ROUND_GRAPH
from dlmrt.engine.graph.capture import capture, check_stop, restore, snapshot, warm_up
from dlmrt.outputs import StopCheck


@dataclass(frozen=True, eq=False, slots=True)
class Loop:
    """A device-side loop: `while not flag and counter < cap: body()`."""

    name: str  # the runner caches its graph under this name
    body: Callable[[], None]
    flag: torch.Tensor  # [] bool, set by the body when the loop is done
    counter: torch.Tensor  # [] int64, advanced by 1 per body
    cap: int
    state: tuple[object, ...]  # buffers the body changes: restored after warm-up runs


@dataclass(frozen=True, eq=False, slots=True)
class Pass:
    """A body run once per call."""

    name: str
    body: Callable[[], None]
    state: tuple[object, ...]


Program = Loop | Pass


def host_loop(loop: Loop, step: Callable[[], None], should_stop: StopCheck | None) -> None:
    """`loop`'s condition evaluated on the host, `step` (its body, or the body's graph) between."""
    n = int(loop.counter)
    while n < loop.cap and not bool(loop.flag):  # the host reads the flag every body
        check_stop(should_stop)
        step()
        n += 1


class EagerRunner:
    name = EAGER

    def run(self, loop: Loop, should_stop: StopCheck | None = None) -> None:
        host_loop(loop, loop.body, should_stop)

    def once(self, program: Pass) -> None:
        program.body()

    def chain(self, parts: tuple[Program, ...], should_stop: StopCheck | None = None) -> None:
        """`parts` in order (a Loop run, a Pass once)."""
        for p in parts:
            self.run(p, should_stop) if isinstance(p, Loop) else self.once(p)


class RoundGraphRunner:
    """One CUDA graph per body, replayed from the host loop."""

    name = ROUND_GRAPH

    def __init__(self, pool) -> None:
        self.pool, self.stream = pool, torch.cuda.Stream()
        self.graphs: dict[str, object] = {}

    def _graph(self, program: Loop | Pass) -> torch.cuda.CUDAGraph:
        if program.name not in self.graphs:
            saved = snapshot(program.state)
            self.graphs[program.name] = capture(program.body, self.stream, self.pool)
            restore(saved)  # undo the warm-up runs
        return self.graphs[program.name]

    def run(self, loop: Loop, should_stop: StopCheck | None = None) -> None:
        host_loop(loop, self._graph(loop).replay, should_stop)

    def once(self, program: Pass) -> None:
        self._graph(program).replay()

    chain = EagerRunner.chain


class BlockGraphRunner(RoundGraphRunner):
    """A loop is one launch of a WHILE graph: [init: condition] -> WHILE { body; condition }."""

    name = BLOCK_GRAPH

    def _segment(self, program: Program):
        """`program` as a GraphChain segment: a pass's body, or a loop's (body, init)."""
        if isinstance(program, Pass):
            return program.body
        from dlmrt.engine.graph.while_graph import launch_condition

        loop = program

        def body(handle: int) -> None:
            loop.body()
            launch_condition(handle, loop.flag, loop.counter, loop.cap)

        def init(handle: int) -> None:  # zero bodies when the loop is already done
            launch_condition(handle, loop.flag, loop.counter, loop.cap)

        return body, init

    def _chain_graph(self, key: str, parts: tuple[Program, ...]):
        if key not in self.graphs:
            from dlmrt.engine.graph.while_graph import GraphChain

            # warm up in order (each part sees the buffers its predecessors leave), then undo it
            saved = snapshot(dict.fromkeys(o for p in parts for o in p.state))
            warm_up(lambda: [p.body() for p in parts], self.stream)
            restore(saved)
            segments = [self._segment(p) for p in parts]
            self.graphs[key] = GraphChain(segments, self.stream, self.pool)
        return self.graphs[key]

    def run(self, loop: Loop, should_stop: StopCheck | None = None) -> None:
        self.chain((loop,), should_stop)

    def chain(self, parts: tuple[Program, ...], should_stop: StopCheck | None = None) -> None:
        names = [p.name for p in parts]
        key = "while:" + names[0] if len(parts) == 1 else "chain:" + "+".join(names)
        graph = self._chain_graph(key, parts)
        check_stop(should_stop)  # the graph runs every part with no host in between: check first
        graph.launch()


RUNNERS = {r.name: r for r in (EagerRunner, RoundGraphRunner, BlockGraphRunner)}
Runner = EagerRunner | RoundGraphRunner | BlockGraphRunner


def make_runner(mode: str, pool) -> Runner:
    """A fresh runner (no graphs yet) for `mode`, capturing into `pool`."""
    return EagerRunner() if mode == EAGER else RUNNERS[mode](pool)
