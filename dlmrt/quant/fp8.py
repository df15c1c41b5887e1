"""Fp8Weight: an e4m3 weight with one float32 scale per output row (per (expert, row) when stacked).

The contract between the loader and the models' FP8 execution (`use_fp8`): `qweight` keeps the
stored [N, K] ([E, N, K]) layout, K unpadded; `w ~= qweight.float() * scale[..., None]`. Pure torch,
so the CPU path and every FP8 kernel's twin ("dequantize, then the bf16 op") share this code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0


@dataclass(frozen=True)
class Fp8Weight:
    """qweight float8_e4m3fn [N, K] or [E, N, K]; scale float32 [N] or [E, N]."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def __post_init__(self) -> None:
        if self.qweight.dtype != FP8_DTYPE:
            raise ValueError(f"qweight: expected {FP8_DTYPE}, got {self.qweight.dtype}")
        if self.qweight.dim() not in (2, 3):
            raise ValueError(
                f"qweight: expected [N, K] or [E, N, K], got {list(self.qweight.shape)}"
            )
        if self.scale.dtype != torch.float32 or self.scale.shape != self.qweight.shape[:-1]:
            raise ValueError(
                f"scale: expected float32 {list(self.qweight.shape[:-1])}, "
                f"got {self.scale.dtype} {list(self.scale.shape)}"
            )

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """qweight * scale in float32, then one rounding to `dtype`."""
        return (self.qweight.float() * self.scale[..., None]).to(dtype)

    def to(self, device: torch.device | str) -> Fp8Weight:
        return Fp8Weight(self.qweight.to(device), self.scale.to(device))

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * 4


def quantize_per_channel(w: torch.Tensor) -> Fp8Weight:
    """Per output row (per (expert, row) for [E, N, K]): scale = amax / 448, q = w / scale.

    An all-zero row gets scale 1 (q = 0), never a division by zero; values are clamped to +-448
    before the cast (the scaled amax is exactly 448, rounding cannot overflow)."""
    if w.dim() not in (2, 3) or not w.is_floating_point():
        raise ValueError(f"quantize_per_channel: expected a float [N, K] or [E, N, K], got {w.dtype} "
                         f"{list(w.shape)}")  # fmt: skip
    amax = w.detach().abs().amax(dim=-1).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return Fp8Weight(_cast(w, scale), scale)


def quantize_per_tensor(w: torch.Tensor) -> Fp8Weight:
    """One scale for the whole matrix (per expert for [E, N, K]), broadcast to every row: the
    per-tensor scheme of ModelOpt `FP8` checkpoints, held in the per-channel layout."""
    if w.dim() not in (2, 3) or not w.is_floating_point():
        raise ValueError(f"quantize_per_tensor: expected a float [N, K] or [E, N, K], got {w.dtype} "
                         f"{list(w.shape)}")  # fmt: skip
    amax = w.detach().abs().flatten(-2).amax(dim=-1).float()  # [] or [E]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    scale = scale[..., None].expand(w.shape[:-1]).contiguous()
    return Fp8Weight(_cast(w, scale), scale)


def _cast(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    q = (w.detach().float() / scale[..., None]).clamp_(-FP8_MAX, FP8_MAX)
    return q.to(FP8_DTYPE)
