"""Model families: HF `architectures` name -> (config parser, model class), imported lazily."""

from __future__ import annotations

import importlib
from typing import Any

# architecture -> (module, model class, config parser)
_REGISTRY: dict[str, tuple[str, str, str]] = {
    "SDARForCausalLM": (
        "dlmrt.models.qwen_dlm",
        "QwenDLM",
        "dlmrt.models.config:model_config_from_hf",
    ),
    "Qwen3ForCausalLM": (
        "dlmrt.models.qwen_dlm",
        "QwenDLM",
        "dlmrt.models.config:model_config_from_hf",
    ),
    "LLaDA2MoeModelLM": (
        "dlmrt.models.llada2",
        "LLaDA2",
        "dlmrt.models.llada2_config:llada2_config_from_hf",
    ),
    "DiffusionGemmaForBlockDiffusion": (
        "dlmrt.models.diffusion_gemma",
        "DiffusionGemma",
        "dlmrt.models.diffusion_gemma_config:diffusion_gemma_config_from_hf",
    ),
}


def supported_architectures() -> list[str]:
    return sorted(_REGISTRY)


def resolve(architecture: str) -> tuple[type, Any]:
    """Return (model class, config parser) for an HF architecture name; KeyError if unknown."""
    module, cls, parser = _REGISTRY[architecture]
    pmod, pfn = parser.split(":")
    return getattr(importlib.import_module(module), cls), getattr(
        importlib.import_module(pmod), pfn
    )
