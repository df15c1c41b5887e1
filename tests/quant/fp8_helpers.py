"""Quantize a built model's FP8 candidates in place (what the loader does with quantization="fp8")."""

from __future__ import annotations

import torch

from dlmrt.quant.placement import install, quantize_candidates


def quantize_model(model: torch.nn.Module) -> tuple[dict, list[str]]:
    """FP8-install every candidate projection weight. Returns the Fp8Weights and the names
    `use_fp8` declined (dequantized into their parameters)."""
    fp8 = quantize_candidates(model)
    return fp8, install(model, fp8)[1]
