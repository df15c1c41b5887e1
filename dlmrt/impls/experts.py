"""Implementations of the routed-experts slot: `experts.impl(experts, x, weights, index, sum_dtype,
add)` -> the weighted sum of each row's experts, plus `add` (the shared experts' output, added in
the expert op's last pass).

`experts` (models/experts.py) gives its stacked weights (`gate_up()`: one [E, 2I, H] stack or the
(gate, up) pair; `down_proj` [E, H, I]) and its `activation`; the family supplies only routing and
activation. `DenseExperts` runs the module's own stacks (bf16, or FP8 codes weight-only W8A16 when
it holds their `scales`); `W8A8Experts` the FP8 codes with the activations quantized too
(kernels/moe_mlp_fp8.py); `Nvfp4Experts` NVFP4 stacks it holds itself (kernels/moe_mlp_nvfp4.py),
with `act_scales` under W4A4 emulation. Plain objects: the stacks they read are the module's
parameters (FP8 codes replace the bf16 ones under the same names) or tensors placed at install.
"""

from __future__ import annotations

import torch

from dlmrt import ops
from dlmrt.formats.nvfp4 import Nvfp4Weight
from dlmrt.ops.moe_fp8 import moe_mlp_w8a8
from dlmrt.ops.nvfp4 import moe_mlp_nvfp4


class DenseExperts:
    def __init__(self, scales: tuple[torch.Tensor, ...] | None = None) -> None:
        self.scales = scales  # FP8 codes' per-channel scales (gate, up, down), or None (bf16)

    def __call__(self, m, x, weights, index, sum_dtype, add):
        return ops.moe_mlp(
            x, weights, index, m.gate_up(), m.down_proj, m.activation, sum_dtype, self.scales, add
        )


class W8A8Experts:
    def __init__(self, scales: tuple[torch.Tensor, ...]) -> None:
        self.scales = scales

    def __call__(self, m, x, weights, index, sum_dtype, add):
        w = (m.gate_up(), m.down_proj, m.activation, self.scales)
        return moe_mlp_w8a8(x, weights, index, *w, sum_dtype, add=add)


class Nvfp4Experts:
    def __init__(self, stacks: tuple[Nvfp4Weight, Nvfp4Weight, Nvfp4Weight]) -> None:
        self.stacks = stacks  # (gate, up, down) on the device
        self.act_scales: tuple[torch.Tensor, torch.Tensor] | None = None  # W4A4 emulation

    def __call__(self, m, x, weights, index, sum_dtype, add):
        w4 = (*self.stacks, m.activation, sum_dtype)
        return moe_mlp_nvfp4(x, weights, index, *w4, act_scales=self.act_scales, add=add)


DENSE = DenseExperts()  # what a built model runs until a quantized format is installed
