"""The RMSNorm slot (`norm.impl(x, residual, weight, eps)`): plain, or quantizing its own output
to FP8 codes in the norm's kernel when every consumer of the norm is an FP8 GEMM that takes them
(`install.py` sets it; the output is then a `QuantAct`). With `residual`, the residual add is fused:
(normed, new residual) come back."""

from __future__ import annotations

import torch

from dlmrt import ops
from dlmrt.ops import fp8 as fp8_ops


def plain_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    if residual is None:
        return ops.rms_norm(x, weight, eps)
    return ops.add_rms_norm(x, residual, weight, eps)


def fp8_out_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    if residual is None:
        return fp8_ops.rms_norm_fp8(x, weight, eps)
    return fp8_ops.add_rms_norm_fp8(x, residual, weight, eps)
