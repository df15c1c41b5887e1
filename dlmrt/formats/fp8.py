"""FP8 (e4m3) weights with per-output-channel scales, and per-row quantized activations.

A weight w [N, K] (or stacked experts [E, N, K]) is stored as `qweight` e4m3 and `scale` fp32
[N] ([E, N]) with w ≈ qweight * scale[..., None]: one scale per output channel, so a GEMM applies
it to its output columns (`torch._scaled_mm`'s row-wise scaling, or the expert kernel's epilogue).
An activation x [M, K] meets it as a `QuantAct`: e4m3 rows and one fp32 scale per row, computed
by the kernel that produces x (RMSNorm, SiLU·up: `dlmrt/ops/fp8.py`). Pure torch: runs on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
MIN_SCALE = 1e-12  # an all-zero row gets this scale (its codes are all zero)


@dataclass(frozen=True, eq=False)
class Fp8Weight:
    """qweight e4m3 [N, K] / [E, N, K]; scale fp32 [N] / [E, N]; w ≈ qweight * scale[..., None]."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.qweight.float() * self.scale.unsqueeze(-1)).to(dtype)

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + 4 * self.scale.numel()

    def to(self, device: torch.device | str) -> Fp8Weight:
        return Fp8Weight(self.qweight.to(device), self.scale.to(device))

    def narrow(self, start: int, rows: int) -> Fp8Weight:
        """Output channels [start, start + rows) (the last but one dim): a view."""
        dim = self.qweight.dim() - 2
        return Fp8Weight(self.qweight.narrow(dim, start, rows), self.scale.narrow(dim, start, rows))


class QuantAct(NamedTuple):
    """An activation as e4m3 rows [M, K] and per-row fp32 scales [M, 1]: x ≈ q * scale."""

    q: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.q.float() * self.scale).to(dtype)


class AmaxAct(NamedTuple):
    """An activation x [M, K] in the model dtype with its rows' amax [M] fp32, for a consumer that
    quantizes it while loading it (kernels/fp8_gemm.py's `amax` form): made by a producer that
    sees only tiles of a row (kernels/fp8_glu_gemm.py); quantize_rows(x) gives the same codes."""

    x: torch.Tensor
    amax: torch.Tensor


CHUNK = (
    1 << 24
)  # weights quantized at a time: fp32 temporaries of ~64 MB each, not of a whole stack


def quantize_per_channel(w: torch.Tensor) -> Fp8Weight:
    """Round w [..., N, K] to e4m3 with one scale per output channel (amax / 448). Channels are
    independent, so a large stack (DiffusionGemma's experts: 0.5 G weights) is done CHUNK weights
    at a time, which keeps an FP8 load's peak near the bf16 model's."""
    rows = w.detach().reshape(-1, w.shape[-1])
    q = torch.empty(rows.shape, dtype=FP8, device=w.device)
    scale = torch.empty(rows.shape[0], dtype=torch.float32, device=w.device)
    step = max(1, CHUNK // max(1, w.shape[-1]))
    for i in range(0, rows.shape[0], step):
        part = rows[i : i + step].float()
        s = (part.abs().amax(dim=-1) / FP8_MAX).clamp_min(MIN_SCALE)
        q[i : i + step] = (part / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        scale[i : i + step] = s
    return Fp8Weight(q.view(w.shape), scale.view(w.shape[:-1]))


def quantize_rows(x: torch.Tensor) -> QuantAct:
    """Per-row e4m3 quantization of x [M, K] (the torch twin of the fused producers)."""
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    scale = (amax / FP8_MAX).clamp_min(MIN_SCALE)
    return QuantAct((x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale)
