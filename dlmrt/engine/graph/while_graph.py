"""CUDA conditional WHILE nodes through cuda.bindings (PyTorch 2.11 has no conditional-node API).

The "compose" design: capture one loop body with torch (plus the
condition kernel from csrc/block_cond.cu, compiled once with NVRTC: `nvrtc.py`), then hand-build an outer graph
WHILE(handle){child(body)} and instantiate it. Imported only on CUDA machines.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
from cuda.bindings import driver
from cuda.bindings import runtime as cudart

from dlmrt import capture_guard
from dlmrt.engine.graph import nvrtc
from dlmrt.engine.graph.nvrtc import ck

MIN_DRIVER = 12040  # WHILE nodes: driver >= 12.4
CUDA13 = int(__import__("cuda.bindings").bindings.__version__.split(".")[0]) >= 13


def condition_kernel():
    """dlmrt_block_cond for the current device (compiled once per process)."""
    if ck(driver.cuDriverGetVersion()) < MIN_DRIVER:
        raise RuntimeError(f"CUDA driver older than {MIN_DRIVER} (no conditional WHILE nodes)")
    return nvrtc.function("block_cond.cu", "dlmrt_block_cond")


def launch_condition(handle: int, done: torch.Tensor, step: torch.Tensor, max_rounds: int) -> None:
    """Enqueue the condition kernel on torch's current stream (only valid inside the WHILE body)."""
    fn, _ = condition_kernel()
    args = (
        (handle, done.data_ptr(), step.data_ptr(), int(max_rounds)),
        (ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong),
    )
    nvrtc.launch(fn, 1, args)


def _handle_int(h) -> int:
    try:
        return int(h)
    except TypeError:
        return ctypes.c_ulonglong.from_address(h.getPtr()).value


def _assign_default_flag() -> int:
    flags = getattr(cudart, "cudaGraphConditionalHandleFlags", None)
    if flags is not None and hasattr(flags, "cudaGraphCondAssignDefault"):
        return int(flags.cudaGraphCondAssignDefault.value)
    return 1


def _add_child(graph, deps: list, fn, stream: torch.cuda.Stream, pool, keep: list):
    """A child-graph node of `graph` after `deps` running `fn()` as captured by torch."""
    torch_graph = torch.cuda.CUDAGraph(keep_graph=True)  # its pool backs the captured work
    with capture_guard.graph(torch_graph, stream=stream, pool=pool):
        fn()
    keep.append(torch_graph)
    raw = torch_graph.raw_cuda_graph()
    return ck(cudart.cudaGraphAddChildGraphNode(graph, deps, len(deps), raw))


def _add_while(graph, deps: list, handle: int):
    """A WHILE(handle) node of `graph` after `deps`; returns (node, its body graph)."""
    params = cudart.cudaGraphNodeParams()
    params.type = cudart.cudaGraphNodeType.cudaGraphNodeTypeConditional
    params.conditional.handle = handle
    params.conditional.type = cudart.cudaGraphConditionalNodeType.cudaGraphCondTypeWhile
    params.conditional.size = 1
    if CUDA13:  # default (zeroed) edges, spelled out where there are dependencies
        edges = [cudart.cudaGraphEdgeData() for _ in deps] or None
        node = ck(cudart.cudaGraphAddNode(graph, deps, edges, len(deps), params))
    else:
        node = ck(cudart.cudaGraphAddNode(graph, deps, len(deps), params))
    return node, params.conditional.phGraph_out[0]


Segment = Callable[[], None] | tuple[Callable[[int], None], Callable[[int], None] | None]


class GraphChain:
    """Segments run in order by ONE graph launch. A segment is either a pass, `fn()` captured as a
    child graph, or a loop `(body, init)`: [child(init) ->] WHILE(handle, default 1){ child(body) }
    with a conditional handle of its own; `body(handle)` and `init(handle)` are captured by torch.

    `init`, when given, runs once per launch before the conditional node is evaluated, upstream of
    it in the same outer graph (as the body's condition kernel runs inside it): it can set the
    handle, e.g. to 0 so that the body runs zero times. Several loops and passes in one chain are
    what lets the block engine start a block, fold the previous commit, run the rounds and pack the
    read-back in one launch (`dlmrt/engine/graph/loop.py: BlockGraphRunner.chain`).
    """

    def __init__(self, segments: list[Segment], stream: torch.cuda.Stream, pool) -> None:
        with capture_guard.guard():  # one collection for all the children's captures
            self._build(segments, stream, pool)

    def _build(self, segments: list[Segment], stream: torch.cuda.Stream, pool) -> None:
        self.outer = ck(cudart.cudaGraphCreate(0))
        self.keep: list[torch.cuda.CUDAGraph] = []  # the captured children (and their pools)
        deps: list = []
        for seg in segments:
            if callable(seg):
                deps = [_add_child(self.outer, deps, seg, stream, pool, self.keep)]
                continue
            body, init = seg
            flag = _assign_default_flag()
            h = _handle_int(ck(cudart.cudaGraphConditionalHandleCreate(self.outer, 1, flag)))
            if init is not None:
                deps = [
                    _add_child(self.outer, deps, lambda i=init, h=h: i(h), stream, pool, self.keep)
                ]
            node, inner = _add_while(self.outer, deps, h)
            _add_child(inner, [], lambda b=body, h=h: b(h), stream, pool, self.keep)
            deps = [node]
        self.exec = ck(cudart.cudaGraphInstantiate(self.outer, 0))

    def launch(self) -> None:
        ck(cudart.cudaGraphLaunch(self.exec, torch.cuda.current_stream().cuda_stream))

    def __del__(self) -> None:  # exec before graph; the torch graphs (and their pool) go last
        try:
            cudart.cudaGraphExecDestroy(self.exec)
            cudart.cudaGraphDestroy(self.outer)
        except Exception:
            pass


class WhileGraph(GraphChain):
    """One loop: outer = [child(init) ->] WHILE(handle, default 1){ child(body) }."""

    def __init__(self, body, stream: torch.cuda.Stream, pool, init=None) -> None:
        super().__init__([(body, init)], stream, pool)


def self_test(op=None, device: str | torch.device = "cuda") -> None:
    """Build a WHILE loop around a counter increment and check it runs exactly 3 rounds. `op`:
    more work for the body, captured before the increment (tensor parallelism's all-reduce:
    `dlmrt/distributed/setup.py`); the caller checks what it did."""
    step = torch.zeros((), dtype=torch.long, device=device)
    done = torch.zeros((), dtype=torch.bool, device=device)
    stream = torch.cuda.Stream(device)

    def body(handle: int) -> None:
        if op is not None:
            op()
        step.add_(1)
        launch_condition(handle, done, step, 3)

    graph = WhileGraph(body, stream, torch.cuda.graph_pool_handle())
    step.zero_()
    graph.launch()
    torch.cuda.synchronize()
    if int(step) != 3:
        raise RuntimeError(f"WHILE self-test ran {int(step)} rounds instead of 3")


def init_self_test() -> None:
    """A WHILE loop with an init node: it runs zero rounds when the flags say done before launch."""
    step = torch.zeros((), dtype=torch.long, device="cuda")
    done = torch.ones((), dtype=torch.bool, device="cuda")
    stream = torch.cuda.Stream()

    def body(handle: int) -> None:
        step.add_(1)
        launch_condition(handle, done, step, 3)

    def init(handle: int) -> None:
        launch_condition(handle, done, step, 3)

    graph = WhileGraph(body, stream, torch.cuda.graph_pool_handle(), init)
    for flag, rounds in ((True, 0), (False, 3)):
        step.zero_()
        done.fill_(flag)
        graph.launch()
        torch.cuda.synchronize()
        if int(step) != rounds:
            raise RuntimeError(f"WHILE init self-test ran {int(step)} rounds instead of {rounds}")
