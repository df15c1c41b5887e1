"""Pick the execution mode once at start-up: block_graph, else round_graph, else eager (logged, with why)."""

from __future__ import annotations

import logging

import torch

from dlmrt import capture_guard
from dlmrt.config import AUTO, BLOCK_GRAPH, EAGER, MODES, ROUND_GRAPH

log = logging.getLogger("dlmrt")


def _round_graph_self_test() -> None:
    x = torch.zeros(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with capture_guard.graph(graph, stream=stream):
        x.add_(1)
    graph.replay()
    graph.replay()
    if x.sum().item() != 8:
        raise RuntimeError("per-round graph self-test replayed wrongly")


def _block_graph_self_test() -> None:
    from dlmrt.engine.graph.while_graph import init_self_test, self_test  # cuda.bindings + NVRTC

    self_test()
    init_self_test()  # the init node commit folding puts before the round loop


def select_mode(requested: str, device: torch.device, moe: bool = False) -> tuple[str, str]:
    """Return (mode, reason). A forced graph mode that cannot work raises ValueError naming `mode`.

    moe: the model routes through `ops.moe_*`; their torch twins sync with the host (DLMRT_OPS=torch
    or no Triton), so graph modes then need the Triton kernels: auto falls back to eager."""
    mode, reason = _select(requested, device)
    if moe and mode != EAGER:
        from dlmrt import ops

        if ops.implementation("moe_mlp") != "triton":
            why = "the MoE ops run their torch twins (host syncs: not capturable)"
            if requested != AUTO:
                raise ValueError(f"mode: {requested} needs the Triton MoE kernels; {why}")
            return EAGER, why
    return mode, reason


def _select(requested: str, device: torch.device) -> tuple[str, str]:
    if requested not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {requested!r}")
    if requested == EAGER:
        return EAGER, "forced by mode='eager'"
    if device.type != "cuda":
        if requested != "auto":
            raise ValueError(f"mode: {requested} needs a CUDA device, got {device}")
        return EAGER, f"device {device} has no CUDA graphs"
    failures = []
    for mode, test in (
        (BLOCK_GRAPH, _block_graph_self_test),
        (ROUND_GRAPH, _round_graph_self_test),
    ):
        if requested not in ("auto", mode):
            continue
        try:
            test()
            return mode, "self-test passed" + (f" ({'; '.join(failures)})" if failures else "")
        except Exception as e:  # any failure of an optional fast path means: fall back, say why
            failures.append(f"{mode} unavailable: {type(e).__name__}: {e}")
            if requested == mode:
                raise ValueError(f"mode: {mode} failed its self-test ({e})") from e
    return EAGER, "; ".join(failures)
