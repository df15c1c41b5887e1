"""Fp8Linear: a bias-free linear whose weight is e4m3 codes with per-output-channel scales.

It takes a plain activation (quantized per row by `ops.fp8.quant_rows`) or a `QuantAct` from a
producer that quantized its own output (RMSNorm with `fp8_out`, `ops.fp8.silu_mul_fp8`). The
codes and scales are buffers, so `.to(device)` and the state dict carry them.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.ops import fp8 as fp8_ops
from dlmrt.quant.fp8 import Fp8Weight, QuantAct


class Fp8Linear(nn.Module):
    def __init__(self, weight: Fp8Weight, out_dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("qweight", weight.qweight.contiguous())
        self.register_buffer("scale", weight.scale.float().contiguous())
        self.out_dtype = out_dtype

    @property
    def weight(self) -> Fp8Weight:
        return Fp8Weight(self.qweight, self.scale)

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    def forward(self, x: torch.Tensor | QuantAct) -> torch.Tensor:
        return fp8_ops.fp8_linear(x, self.weight, self.out_dtype)

    def extra_repr(self) -> str:
        n, k = self.qweight.shape
        return f"in_features={k}, out_features={n}, fp8_e4m3 per-channel"
