"""quantize_per_tensor: one FP8 scale per matrix (per expert for [E, N, K]), held per channel.

The scheme of ModelOpt `FP8` and compressed-tensors `strategy: "tensor"` checkpoints; the writer
(`writer.py`) and the round-trip tests use it. The scale is broadcast to every row, so the result is
an ordinary per-channel `Fp8Weight` (`fp8.py`) and runs on the same kernels.
"""

from __future__ import annotations

import torch

from dlmrt.formats.fp8 import FP8, FP8_MAX, MIN_SCALE, Fp8Weight


def quantize_per_tensor(w: torch.Tensor) -> Fp8Weight:
    """w [N, K] or [E, N, K]: scale = amax(matrix) / 448 (an all-zero matrix: MIN_SCALE)."""
    if w.dim() not in (2, 3) or not w.is_floating_point():
        raise ValueError(
            f"quantize_per_tensor: expected a float [N, K] or [E, N, K], got {w.dtype} "
            f"{list(w.shape)}"
        )
    amax = w.detach().float().abs().flatten(-2).amax(dim=-1)  # [] or [E]
    scale = (amax / FP8_MAX).clamp_min(MIN_SCALE)
    scale = scale[..., None].expand(w.shape[:-1]).contiguous()
    q = (w.detach().float() / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return Fp8Weight(q, scale)
