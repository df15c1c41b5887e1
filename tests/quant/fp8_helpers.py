"""Quantize a built model's FP8 candidates in place (what the loader does with quantization="fp8")."""

from __future__ import annotations

import torch

from dlmrt.quant.fp8 import quantize_per_channel
from dlmrt.quant.policy import is_candidate


def quantize_model(model: torch.nn.Module) -> tuple[dict, list[str]]:
    """FP8-install every 2-D/3-D projection weight; the rest keep their weights. Returns the
    Fp8Weights and the names `use_fp8` left (dequantized here into their parameters)."""
    fp8 = {
        name: quantize_per_channel(p.detach())
        for name, p in model.named_parameters()
        if p.dim() >= 2 and is_candidate(name)
    }
    left = model.use_fp8(fp8)
    with torch.no_grad():
        for name in left:
            model.get_parameter(name).copy_(fp8[name].dequantize(torch.float32))
    return fp8, left
