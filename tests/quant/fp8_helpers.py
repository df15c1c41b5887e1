"""Quantize a built model's FP8 candidates in place (what the loader does with quantization="fp8")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlmrt.loading.placement import install, quantize_candidates


def quantize_model(model: torch.nn.Module) -> tuple[dict, list[str]]:
    """FP8-install every candidate projection weight. Returns the Fp8Weights and the names
    `use_quantized` declined (dequantized into their parameters)."""
    fp8 = quantize_candidates(model)
    return fp8, install(model, fp8)[1]


def fp8_sources(tmp_path_factory: pytest.TempPathFactory, name: str) -> dict[str, Path]:
    """One tiny bf16/fp32 checkpoint per family (QwenDLM with the ORL adapter), to quantize."""
    from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
    from dg_helpers import tiny_checkpoint

    root = tmp_path_factory.mktemp(name)
    return {
        "qwen": write_checkpoint(root / "qwen", residual=residual_config()),
        "llada2": write_llada2_checkpoint(root / "llada2"),
        "dg": tiny_checkpoint(tmp_path_factory)[0],
    }
