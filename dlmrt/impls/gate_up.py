"""Quantized implementations of the gated-MLP slot `mlp.gate_up` (x -> the down projection's input).

- `QuantGateUp`: gate|up as one quantized linear (`Fp8Linear`, `Nvfp4Linear`, a registered
  format's), then an activation op; for an FP8 SwiGLU whose down projection is FP8 too the op is
  `ops.fp8.silu_mul_fp8`, which quantizes its own output for the down GEMM.
- `FusedGlu`: gate|up and the activation as one kernel at the block rows (kernels/fp8_glu_gemm.py,
  chosen by `ops/fp8_glu_choice.py`); the down projection's plan then quantizes y as it loads it.
Modules, so the quantized weights move with `.to()` and sit in the state dict under `gate_up.linear`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dlmrt.account import label
from dlmrt.ops import fp8 as fp8_ops


class QuantGateUp(nn.Module):
    def __init__(self, linear: nn.Module, activation: Callable) -> None:
        super().__init__()
        self.linear, self.activation = linear, activation

    def forward(self, x):
        g = self.linear(x)
        with label("act_mul", g):
            return self.activation(g)


class FusedGlu(nn.Module):
    def __init__(self, linear: nn.Module, plan: fp8_ops.GluPlan, gelu: bool) -> None:
        super().__init__()
        self.linear, self.plan, self.gelu = linear, plan, gelu

    def forward(self, x) -> torch.Tensor:
        lin = self.linear
        return fp8_ops.glu_fp8(x, lin.weight, lin.out_dtype, self.plan, self.gelu)

    def extra_repr(self) -> str:
        return f"one kernel {self.plan.config} at {self.plan.rows} rows, gelu={self.gelu}"
