"""NVFP4 ops: routed experts and dense linears with NVFP4 weights (weight-only W4A16), resolved like
every op.

CUDA -> kernels/moe_mlp_nvfp4.py / kernels/linear_nvfp4.py (E2M1 codes and e4m3 block scales
decoded in registers, bf16 multiplies); otherwise the twin: dequantize the weights to x's dtype,
then `reference.moe_mlp` / `F.linear`. The models call the expert op for routed experts and
`linear_nvfp4` for dense MLPs whose gate, up and down are all NVFP4 (`impls/nvfp4_linear.py`:
on CUDA, and on the CPU under W4A4 emulation; otherwise the CPU dequantizes them at load).
The ops take `Nvfp4Weight`s, not a kernel's argument list, so a Blackwell kernel with FP4 tensor
cores (W4A4) can be slotted in behind them later. Optional W4A4 emulation on Hopper: `act_scales`
/ `act_scale`.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from dlmrt.formats.fp8 import FP8, FP8_MAX
from dlmrt.formats.nvfp4 import BLOCK, E2M1_MAX, Nvfp4Weight
from dlmrt.ops import _MOE_DTYPES, implementation, reference


def _kernel():
    return importlib.import_module("dlmrt._kernels.moe_mlp_nvfp4").moe_mlp_nvfp4


def linear_nvfp4(
    x: torch.Tensor, w: Nvfp4Weight, act_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """y = x @ W^T for an NVFP4 weight W [N, K] (global scale [] or one per row [N]): [..., K] ->
    [..., N]. `act_scale` (the input scale): W4A4 emulation, x NVFP4 quantize-dequantized per 16
    (`fake_quant_act`) first, on both paths; None: W4A16."""
    if act_scale is not None:
        x = fake_quant_act(x, act_scale)
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
    act_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """`ops.moe_mlp` with NVFP4 stacked weights gate / up [E, I, H], down [E, H, I] (`add`: as
    there, the shared experts' output added in the kernel's last pass).

    `act_scales` (x's, the hidden's input scale; `act_quantizers`): W4A4 emulation, both GEMM
    inputs NVFP4 quantize-dequantized per 16 (`fake_quant_act`) on both paths; None: W4A16."""
    hook = None
    if act_scales is not None:
        x = fake_quant_act(x, act_scales[0])
        hook = lambda h: fake_quant_act(h, act_scales[1])  # noqa: E731
    if x.is_cuda and x.dtype in _MOE_DTYPES and implementation("moe_mlp") == "triton":
        args = (_args(gate), _args(up), _args(down))
        return _kernel()(x, weights, index, *args, activation, hidden_hook=hook, add=add)
    g, u, d = (w.dequantize(x.dtype) for w in (gate, up, down))
    y = reference.moe_mlp(x, weights, index, (g, u), d, activation, sum_dtype, hook)
    return y if add is None else y + add


def fake_quant_act(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4 quantize-dequantize of activations x [..., K] per 16 along K with the global
    `input_scale` (ModelOpt's, amax / (6 * 448)): Blackwell's W4A4 activation numerics in x's dtype.

    The values of `encode(x, amax16 / 6, input_scale).dequantize(x.dtype)` (tests/quant/
    test_nvfp4_act.py), computed without tables or host data so it can be captured in a CUDA graph:
    on the E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} nearest-even rounding is torch.round (half to
    even) at step 1/2 below 2 and step 1 below 4 (the even codes sit on the even multiples), and
    4 / 6 split at 5 (a tie goes to 4, code 6)."""
    g = input_scale.float().reshape(())
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    amax16 = blocks.abs().amax(dim=-1, keepdim=True)
    step = ((amax16 / E2M1_MAX) / g).clamp(0, FP8_MAX).to(FP8).float() * g  # e4m3 block scale
    a = torch.where(step > 0, blocks.abs() / step.clamp_min(1e-30), 0.0).clamp(max=E2M1_MAX)
    q = torch.where(a < 2, torch.round(2 * a) / 2, torch.where(a < 4, torch.round(a), 0.0))
    q = torch.where(a >= 4, torch.where(a <= 5, 4.0, E2M1_MAX), q)
    return torch.where(blocks < 0, -q, q).mul(step).flatten(-2).to(x.dtype)


def act_quantizers(gate: Nvfp4Weight, up: Nvfp4Weight, down: Nvfp4Weight) -> tuple:
    """(x's, the hidden's) input scales for `moe_mlp_nvfp4`'s W4A4 emulation: gate and up share
    one input, so the larger of their scales. Raises ValueError when a weight has none."""
    for name, w in (("gate", gate), ("up", up), ("down", down)):
        if w.input_scale is None:
            raise no_input_scale(f"the {name} projection's NVFP4 weight")
    return torch.maximum(gate.input_scale, up.input_scale), down.input_scale


def no_input_scale(what: str) -> ValueError:
    """The error for an NVFP4 weight (`what`) without the input scale W4A4 emulation needs."""
    return ValueError(
        f"activations='nvfp4': {what} has no input scale (the checkpoint must store static "
        "activation scales: ModelOpt `input_scale`, compressed-tensors `input_global_scale`; "
        "`dlmrt quantize` writes them)"
    )
