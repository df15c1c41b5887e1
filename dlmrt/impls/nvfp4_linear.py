"""Nvfp4Linear: a bias-free linear whose weight is NVFP4 (E2M1 codes, e4m3 block scales, global
scales), run by `ops.nvfp4.linear_nvfp4` (the W4A16 kernel on CUDA, dequantize + F.linear
otherwise).

It is built from one or more projections stacked along N (gate|up: one GEMM); each keeps its own
global scale, held per output row (`formats.nvfp4.cat_rows`). The codes and scales are buffers, so
`.to(device)` and the state dict carry them. `emulate_w4a4()` (activations="nvfp4") makes the input
NVFP4 quantize-dequantized first, with the projections' largest input scale (one shared input,
one quantizer, as the routed experts' `act_quantizers`).
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.formats.nvfp4 import Nvfp4Weight, cat_rows
from dlmrt.ops import nvfp4 as nvfp4_ops


class Nvfp4Linear(nn.Module):
    def __init__(self, weights: dict[str, Nvfp4Weight]) -> None:
        """weights: {parameter name: its dense NVFP4 weight [N_i, K]}, stacked along N in order."""
        super().__init__()
        w = cat_rows(list(weights.values()))
        self.register_buffer("packed", w.packed.contiguous())
        self.register_buffer("block_scale", w.block_scale.contiguous())
        self.register_buffer("global_scale", w.global_scale.float().contiguous())  # [N]
        # for emulate_w4a4 only (W4A16 reads neither): the shared input scale, what has none
        self.input_scale = w.input_scale
        self.without_input_scale = [n for n, v in weights.items() if v.input_scale is None]
        self.act_scale: torch.Tensor | None = None  # W4A4 emulation's input scale, or None

    @property
    def weight(self) -> Nvfp4Weight:
        return Nvfp4Weight(self.packed, self.block_scale, self.global_scale)

    @property
    def out_features(self) -> int:
        return self.packed.shape[0]

    def emulate_w4a4(self) -> None:
        """Quantize-dequantize the input (`ops.nvfp4.fake_quant_act`) with the largest of the
        projections' input scales; ValueError naming a projection that has none."""
        if self.without_input_scale:
            raise nvfp4_ops.no_input_scale(f"the dense NVFP4 weight {self.without_input_scale[0]}")
        self.act_scale = self.input_scale.to(self.packed.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nvfp4_ops.linear_nvfp4(x, self.weight, self.act_scale)

    def extra_repr(self) -> str:
        n, half = self.packed.shape
        w4 = "W4A4 emulated" if self.act_scale is not None else "W4A16"
        return f"in_features={2 * half}, out_features={n}, nvfp4 {w4}"
