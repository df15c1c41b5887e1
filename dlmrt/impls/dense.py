"""The unquantized implementations of the linear and gated-MLP slots (`dlmrt/impls/__init__.py`).

Plain objects, not modules: they hold the layer's own `nn.Linear`s (or a fused view of their
weights, `models.layers.fuse_weights`), so the state dict keeps the checkpoint's names and a
parameter is never registered twice."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt.account import label
from dlmrt.impls.activation import act, act_mul
from dlmrt.ops.bf16_glu import glu_bf16
from dlmrt.ops.fp8 import GluPlan


class ProjectionConcat:
    """Several projections of one input as one [rows, sum N] tensor, each its own GEMM (unfused:
    training, the CPU reference paths)."""

    def __init__(self, linears: Sequence[nn.Module]) -> None:
        self.linears = tuple(linears)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.linears) == 1:
            return self.linears[0](x)
        return torch.cat([lin(x) for lin in self.linears], dim=-1)


class StackedProjection:
    """The same as one GEMM over the projections' concatenated weights (after loading); `name`
    labels it in a kernel account (`dlmrt/account.py`)."""

    def __init__(self, weight: torch.Tensor, name: str = "qkv") -> None:
        self.weight, self.name = weight, name
        self.gemm = F.linear  # `deepgemm_install.py` may put DeepGEMM's here

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with label(self.name, x, self.weight):
            return self.gemm(x, self.weight)


class SeparateGateUp:
    """act(gate(x)) * up(x) with two GEMMs: exactly transformers' MLPs (training, parity)."""

    def __init__(self, gate: nn.Module, up: nn.Module, activation: str) -> None:
        self.gate, self.up, self.act = gate, up, act(activation)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate(x), self.up(x)
        with label("act_mul", g, u):
            return self.act(g) * u


class StackedGateUp:
    """act(gate) * up from one GEMM over the fused [2I, H] weight and one fused activation."""

    def __init__(self, weight: torch.Tensor, activation: str) -> None:
        self.weight, self.activation, self.act_mul = weight, activation, act_mul(activation)
        self.gemm = F.linear  # `deepgemm_install.py` may put DeepGEMM's here

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with label("gate_up", x, self.weight):
            g = self.gemm(x, self.weight)
        with label("act_mul", g):
            return self.act_mul(g)


class FusedGateUp:
    """The same in one kernel at the plan's rows (kernels/fp8_glu_gemm.py's unscaled form, chosen
    by `ops/bf16_glu_choice.py`: `glu_install.install_bf16_glu`); other rows, a CPU, or no plan
    run `StackedGateUp`'s two steps (`ops.bf16_glu.twin`)."""

    def __init__(self, weight: torch.Tensor, activation: str, plan: GluPlan | None) -> None:
        act(activation)  # checks the name
        self.weight, self.activation, self.plan = weight, activation, plan

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with label("gate_up_act", x, self.weight):
            return glu_bf16(x, self.weight, self.activation == "gelu_tanh", self.plan)
