"""Whether FP8 routed experts run W8A8 (activations quantized, FP8 MMA) or weight-only W8A16:
measured once per expert shape at start-up.

The W8A8 kernel (kernels/moe_mlp_fp8.py) reads the same weight bytes as the W8A16 one
(kernels/moe_mlp.py with `scales`) but feeds the codes straight to an FP8 dot instead of
converting each weight tile to bf16 in registers; it pays one extra launch (x's quantizer).
Which wins depends on the rows and the routing, so on CUDA both are timed on the layer's own
weights with uniformly random routing of the model's block rows (`timing.graph_time_us`: a
replayed CUDA graph, GPU time only) and the faster kept, logged by the installer.
DLMRT_FP8_EXPERTS=w8a8 / w8a16 forces one. CPU: W8A8 (the twin of what CUDA normally runs).
"""

from __future__ import annotations

import torch

from dlmrt import envs, ops
from dlmrt.ops.moe_fp8 import moe_mlp_w8a8
from dlmrt.ops.timing import graph_time_us

_MEASURED: dict[tuple, tuple[float, float]] = {}


def measure(rows: int, top_k: int, gate_up: tuple, down: torch.Tensor, scales: tuple,
            activation: str) -> tuple[float, float]:  # fmt: skip
    """(W8A16 µs, W8A8 µs) of one expert layer call at `rows` rows (cached per shape)."""
    experts, hidden, inter = down.shape
    key = (rows, top_k, experts, hidden, inter, activation)
    if key not in _MEASURED:
        g = torch.Generator(device=down.device).manual_seed(0)
        x = torch.randn(rows, hidden, device=down.device, generator=g, dtype=torch.bfloat16)
        logits = torch.rand(rows, experts, device=down.device, generator=g)
        weights, index = logits.topk(top_k, dim=-1)
        args = (x, weights, index, gate_up, down, activation)
        w8a16 = graph_time_us(lambda: ops.moe_mlp(*args, scales=scales))
        w8a8 = graph_time_us(lambda: moe_mlp_w8a8(*args, scales))
        _MEASURED[key] = (w8a16, w8a8)
    return _MEASURED[key]


def use_w8a8(rows: int, top_k: int, gate_up: tuple, down: torch.Tensor, scales: tuple,
             activation: str) -> tuple[bool, str]:  # fmt: skip
    """(run these FP8 experts W8A8?, why) for `rows` rows routed to `top_k` experts each."""
    policy = envs.fp8_experts()
    if policy != "measured" or down.device.type != "cuda":
        return policy != "w8a16", f"DLMRT_FP8_EXPERTS={policy}" if down.is_cuda else "CPU"
    w8a16, w8a8 = measure(rows, top_k, gate_up, down, scales, activation)
    return w8a8 < w8a16, f"{rows} rows: W8A16 {w8a16:.1f} us, W8A8 {w8a8:.1f} us"
