"""dlmrt/model_shapes.py: each full-size config builds its model, whose size is the one the
released model's name gives (a wrong width changes the count)."""

from __future__ import annotations

import pytest
import torch

from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini, qwen_dlm_4b


def _params(cls, cfg) -> tuple[float, float]:
    """(all parameters, those of the routed experts), in billions; built on the meta device."""
    with torch.device("meta"):
        model = cls(cfg)
    if cfg.tie_word_embeddings:
        model.tie_lm_head()
    named = list(model.named_parameters())
    experts = sum(p.numel() for n, p in named if ".experts." in n)
    return sum(p.numel() for _, p in named) / 1e9, experts / 1e9


def test_qwen_dlm_4b_is_qwen3_4b_plus_the_adapter():
    from dlmrt.models.qwen_dlm import QwenDLM

    cfg = qwen_dlm_4b()
    total, _ = _params(QwenDLM, cfg)
    adapter = 3 * cfg.hidden_size * cfg.residual.intermediate_size / 1e9
    assert total - adapter == pytest.approx(4.02, abs=0.01)  # Qwen3-4B, tied embeddings


def test_llada21_mini_is_16b():
    from dlmrt.models.llada2 import LLaDA2

    total, _ = _params(LLaDA2, llada21_mini())
    assert total == pytest.approx(16.26, abs=0.01)


def test_diffusion_gemma_26b_is_a4b():
    """The text tower of 26B-A4B (its ~0.5 B vision tower aside): ~4 B parameters active, the
    routed experts counted at top-k of their number."""
    from dlmrt.models.diffusion_gemma import DiffusionGemma

    cfg = diffusion_gemma_26b()
    total, experts = _params(DiffusionGemma, cfg)
    active = total - experts + experts * cfg.top_k_experts / cfg.num_experts
    assert total == pytest.approx(25.25, abs=0.01) and 3.5 < active < 4.5


def test_fewer_layers_keep_the_widths():
    short, full = diffusion_gemma_26b(6), diffusion_gemma_26b()
    assert short.layer_types == full.layer_types[:6] and short.head_dims == full.head_dims[:6]
    assert llada21_mini(3).hidden_size == llada21_mini().hidden_size
    assert qwen_dlm_4b(2).num_hidden_layers == 2
