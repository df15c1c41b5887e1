"""FP8 W8A8 routed experts (e4m3 activations x e4m3 weights), resolved like every op.

CUDA (bf16 / fp16 x) -> kernels/moe_mlp_fp8.py: the activations quantized per (row, group) and
the MMA in FP8. Otherwise the twin, "dequantize, then the bf16 op": x and the hidden
act(gate) * up are quantize-dequantized with the kernel's groups (`fake_quant_groups`: x per 128
columns, the hidden per HIDDEN_GROUP), the weights dequantized per output channel, then
`reference.moe_mlp`. The two differ only in where the dequantized values are rounded and in
the accumulation order, so tests compare them within rounding.
"""

from __future__ import annotations

import importlib

import torch

from dlmrt.formats.fp8 import FP8, FP8_MAX, MIN_SCALE
from dlmrt.ops import implementation, reference

X_GROUP = 128  # kernels/moe_mlp_fp8.py's GROUP: x's scale group along the hidden dim
# The gate|up kernel's BN: the hidden's scale group (and the down K step). H200, one layer
# (benchmarks/results/moe_quant_h200_2026-12-03.json): 128 against 64, DiffusionGemma 238 vs
# 259 us, LLaDA-2.1-mini 157 vs 170 us.
HIDDEN_GROUP = 128


def fake_quant_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., K] quantized to e4m3 per `group` columns (scale = amax / 448, as the kernel's
    `_quant`; a last partial group scaled on its own), dequantized back to x's dtype."""
    k = x.shape[-1]
    pad = -k % group
    v = torch.nn.functional.pad(x.float(), (0, pad)).unflatten(-1, (-1, group))
    scale = (v.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp_min(MIN_SCALE)
    q = (v / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float()
    return (q * scale).flatten(-2)[..., :k].to(x.dtype)


def moe_mlp_w8a8(
    x: torch.Tensor,
    weights: torch.Tensor,
    index: torch.Tensor,
    gate_up: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    down: torch.Tensor,
    activation: str,
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    sum_dtype: torch.dtype | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """`ops.moe_mlp` with e4m3 weight codes (gate / up [E, I, H] or fused [E, 2I, H], down
    [E, H, I]) and per-output-channel `scales` (gate [E, I], up [E, I], down [E, H]), the
    activations quantized to e4m3 too (W8A8); `add`: the shared experts' output, as there."""
    gate, up = gate_up if isinstance(gate_up, tuple) else gate_up.chunk(2, dim=1)
    half = x.dtype in (torch.bfloat16, torch.float16)  # fp32 models: the twin
    if x.is_cuda and half and implementation("moe_mlp") == "triton":
        kernel = importlib.import_module("dlmrt._kernels.moe_mlp_fp8").moe_mlp_fp8
        return kernel(
            x, weights, index, (gate, up), down, activation, scales, bn=HIDDEN_GROUP, add=add
        )
    g, u, d = ((w.float() * s.unsqueeze(-1)).to(x.dtype) for w, s in zip((gate, up, down), scales))
    xq = fake_quant_groups(x, X_GROUP)
    hook = lambda h: fake_quant_groups(h, HIDDEN_GROUP)  # noqa: E731
    y = reference.moe_mlp(xq, weights, index, (g, u), d, activation, sum_dtype, hook)
    return y if add is None else y + add
