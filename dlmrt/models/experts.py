"""Routed gated-MLP experts, stacked [E, ...]: one module for every MoE family.

The family supplies its routing (its router, outside this module) and the experts' shape: the
`activation` ("silu": LLaDA2's SwiGLU, "gelu_tanh": DiffusionGemma's GeGLU), whether gate and up
are one stored stack (`fused_gate_up`: gate_up_proj [E, 2I, H], gate rows first) or two
(gate_proj, up_proj [E, I, H]), and whether the weighted sum is kept in the model dtype
(transformers' DiffusionGemma accumulates its experts there) or in fp32. down_proj is [E, H, I].
How they run is the `impl` slot (dlmrt/impls/experts.py: bf16, FP8 W8A16 / W8A8, NVFP4), chosen
at load; the forward never asks.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.impls.experts import DENSE


class Experts(nn.Module):
    def __init__(
        self,
        num_experts: int,
        hidden: int,
        inter: int,
        activation: str,
        fused_gate_up: bool,
        sum_in_model_dtype: bool = False,
    ) -> None:
        super().__init__()
        self.activation, self.fused_gate_up = activation, fused_gate_up
        self.sum_in_model_dtype = sum_in_model_dtype
        if fused_gate_up:
            self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        else:
            self.gate_proj = nn.Parameter(torch.empty(num_experts, inter, hidden))
            self.up_proj = nn.Parameter(torch.empty(num_experts, inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))
        self.impl = DENSE

    @property
    def projs(self) -> tuple[str, ...]:
        """The stored stacks' parameter names, in the order the checkpoint lists them."""
        if self.fused_gate_up:
            return ("gate_up_proj", "down_proj")
        return ("gate_proj", "up_proj", "down_proj")

    def gate_up(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The first half's stacks as the expert ops take them: one fused stack or (gate, up)."""
        return self.gate_up_proj if self.fused_gate_up else (self.gate_proj, self.up_proj)

    def forward(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        index: torch.Tensor,
        add: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The routed experts' weighted sum per row ([rows, k] fp32 `weights`, expert `index`),
        plus `add` (the shared experts' output, added in the expert op's last pass)."""
        sum_dtype = x.dtype if self.sum_in_model_dtype else None
        return self.impl(self, x, weights, index, sum_dtype, add)
