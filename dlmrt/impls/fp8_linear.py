"""Fp8Linear: a bias-free linear whose weight is e4m3 codes with per-output-channel scales.

It takes a plain activation (quantized per row by `ops.fp8.quant_rows`) or a `QuantAct` from a
producer that quantized its own output (an RMSNorm with `norm.impl = norms.fp8_out_norm`,
`ops.fp8.silu_mul_fp8`). The codes and scales are buffers, so `.to(device)` and the state dict
carry them. `plan` (CUDA): run the GEMM at the block rows on kernels/fp8_gemm.py
(`ops/fp8_choice.py` picked it); else cuBLAS.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from dlmrt.formats.fp8 import Fp8Weight, QuantAct
from dlmrt.ops import fp8 as fp8_ops


class Fp8Linear(nn.Module):
    def __init__(
        self, weight: Fp8Weight, out_dtype: torch.dtype, plan: fp8_ops.GemmPlan | None = None
    ) -> None:
        super().__init__()
        self.plan = plan
        if plan is not None:
            self.set_plan(plan)
        self.register_buffer("qweight", weight.qweight.contiguous())
        self.register_buffer("scale", weight.scale.float().contiguous())
        self.out_dtype = out_dtype

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        if self.plan is not None:  # `.to(device)` moved the counters: the plan follows
            self.plan = dataclasses.replace(self.plan, counts=self.gemm_counts)
        return self

    def set_plan(self, plan: fp8_ops.GemmPlan) -> None:
        """Run the block rows on kernels/fp8_gemm.py with `plan`; the kernel's counters are a
        buffer, so they move with the module (not saved)."""
        self.plan = plan
        self.register_buffer("gemm_counts", plan.counts, persistent=False)

    @property
    def weight(self) -> Fp8Weight:
        return Fp8Weight(self.qweight, self.scale)

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    def forward(self, x: torch.Tensor | QuantAct) -> torch.Tensor:
        return fp8_ops.fp8_linear(x, self.weight, self.out_dtype, self.plan)

    def extra_repr(self) -> str:
        n, k = self.qweight.shape
        gemm = "" if self.plan is None else f", kernel {self.plan.config} at {self.plan.rows} rows"
        return f"in_features={k}, out_features={n}, fp8_e4m3 per-channel{gemm}"
