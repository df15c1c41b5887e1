"""A gated MLP's first half in the model dtype: act(x @ gate^T) * (x @ up^T) from the stacked
gate|up weight [2I, K], as one kernel (kernels/fp8_glu_gemm.py's unscaled form) or as the unfused
pair it replaces (its twin): the gate|up GEMM rounded to the dtype, then the fused activation
(`ops.silu_mul`, or `gemma.gelu_mul` for GeGLU).

The kernel runs only on CUDA under the Triton implementation (`implementation("silu_mul")`), at
the rows its plan was measured for (`ops/bf16_glu_choice.py`), for operands its TMA loads take
(`fits`); anything else takes the twin, so a prefill or a CPU run computes what it always did.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from dlmrt import ops
from dlmrt.ops import gemma, implementation
from dlmrt.ops.fp8 import GluPlan

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _kernel():
    return importlib.import_module("dlmrt._kernels.fp8_glu_gemm")


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the kernel takes x [M, K] and w [2I, K]: CUDA, one floating dtype, K-major with
    16-byte aligned rows and bases (TMA descriptors)."""
    if not (x.is_cuda and x.dim() == 2 and x.dtype in KERNEL_DTYPES and w.dtype == x.dtype):
        return False
    row_bytes = x.shape[1] * x.element_size()
    aligned = all(
        t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0 for t in (x, w)
    )
    return x.stride(1) == 1 and w.stride(1) == 1 and row_bytes % 16 == 0 and aligned


def twin(x: torch.Tensor, weight: torch.Tensor, gelu: bool) -> torch.Tensor:
    """The unfused path: gate|up rounded to the dtype, then act(gate) * up."""
    gate_up = F.linear(x, weight)
    return gemma.gelu_mul(gate_up) if gelu else ops.silu_mul(gate_up)


def glu_bf16(
    x: torch.Tensor, weight: torch.Tensor, gelu: bool, plan: GluPlan | None
) -> torch.Tensor:
    """act(x @ gate^T) * (x @ up^T) for x [M, K] and weight = gate|up [2I, K] (act: SiLU, or
    gelu_tanh with `gelu`): one kernel where `plan` covers M rows and it fits, else the twin."""
    if (
        plan is not None
        and x.shape[0] == plan.rows
        and fits(x, weight)
        and implementation("silu_mul") == "triton"
    ):
        return _kernel().glu_gemm(x, weight, plan.config, gelu)
    return twin(x, weight, gelu)
