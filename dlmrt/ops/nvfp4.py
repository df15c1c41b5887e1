"""NVFP4 ops: routed experts and dense linears with NVFP4 weights (weight-only W4A16), resolved like
every op.

CUDA -> kernels/moe_mlp_nvfp4.py / kernels/linear_nvfp4.py (E2M1 codes and e4m3 block scales
decoded in registers, bf16 multiplies); otherwise the twin: dequantize the weights to x's dtype,
then `reference.moe_mlp` / `F.linear`. The models call the expert op; the loader still dequantizes
dense NVFP4 weights at load (docs/quantization.md), so `linear_nvfp4` has no model caller yet.
The op takes `Nvfp4Weight`s, not a kernel's argument list, so a Blackwell kernel with FP4 tensor
cores (W4A4) can be slotted in behind it later. Optional activation emulation: `fake_quant_act`.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from dlmrt.ops import _MOE_DTYPES, implementation, reference
from dlmrt.quant.nvfp4 import BLOCK, E2M1_MAX, Nvfp4Weight, encode


def _kernel():
    return importlib.import_module("dlmrt._kernels.moe_mlp_nvfp4").moe_mlp_nvfp4


def linear_nvfp4(x: torch.Tensor, w: Nvfp4Weight) -> torch.Tensor:
    """y = x @ W^T for an NVFP4 weight W [N, K] (one global scale): [..., K] -> [..., N]."""
    if x.is_cuda and x.dtype in _MOE_DTYPES and implementation("linear_nvfp4") == "triton":
        kernel = importlib.import_module("dlmrt._kernels.linear_nvfp4").linear_nvfp4
        return kernel(x, w.packed, w.block_scale, w.global_scale)
    return F.linear(x, w.dequantize(x.dtype))


def _args(w: Nvfp4Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = w.global_scale.float().reshape(-1).expand(w.packed.shape[0]).contiguous()
    return w.packed, w.block_scale, g


def split_gate_up(gate_up: Nvfp4Weight) -> tuple[Nvfp4Weight, Nvfp4Weight]:
    """A fused [E, 2I, H] gate|up weight as its gate and up halves (views)."""
    inter = gate_up.shape[1] // 2
    return gate_up.narrow(0, inter), gate_up.narrow(inter, inter)


def moe_mlp_nvfp4(
    x: torch.Tensor,
    weights: torch.Tensor,
    index: torch.Tensor,
    gate: Nvfp4Weight,
    up: Nvfp4Weight,
    down: Nvfp4Weight,
    activation: str,
    sum_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`ops.moe_mlp` with NVFP4 stacked weights gate / up [E, I, H], down [E, H, I]."""
    if x.is_cuda and x.dtype in _MOE_DTYPES and implementation("moe_mlp") == "triton":
        return _kernel()(x, weights, index, _args(gate), _args(up), _args(down), activation)
    g, u, d = (w.dequantize(x.dtype) for w in (gate, up, down))
    return reference.moe_mlp(x, weights, index, (g, u), d, activation, sum_dtype)


def fake_quant_act(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4 quantize-dequantize of activations x [M, K] per 16 along K with the global
    `input_scale` (ModelOpt's, amax / (6 * 448)): Blackwell's W4A4 activation numerics in x's dtype."""
    amax16 = x.float().abs().unflatten(-1, (-1, BLOCK)).amax(dim=-1)
    q = encode(x, amax16 / E2M1_MAX, input_scale.float().reshape(()))
    return q.dequantize(x.dtype)
