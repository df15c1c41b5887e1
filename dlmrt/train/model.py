"""The trainable model: dlmrt's own `QwenDLM`, built unfused with fp32 parameters that need grad.

Inference loads checkpoints through `load_checkpoint`, which fuses q/k/v and gate/up into views
of one non-grad tensor; training builds the same class from its `ModelConfig` without fusing,
on the meta device, then allocates once and initialises deterministically (CPU generator, so
the initial weights are the same on every device).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors.torch import load_file

from dlmrt.models.config import ModelConfig
from dlmrt.models.qwen_dlm import QwenDLM
from dlmrt.train.export import save_tensors

INIT_STD = 0.02


def build_model(cfg: ModelConfig, device: torch.device, seed: int) -> QwenDLM:
    with torch.device("meta"):
        model = QwenDLM(cfg)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings is not False:
        model.tie_lm_head()
    init_weights(model, seed)
    return model.train()


@torch.no_grad()
def init_weights(model: QwenDLM, seed: int) -> None:
    """N(0, 0.02) matrices and embeddings, output projections / sqrt(2 L) (GPT-2), norms 1."""
    gen = torch.Generator().manual_seed(seed)
    out_std = INIT_STD / math.sqrt(2 * model.cfg.num_hidden_layers)
    for name, p in model.named_parameters():  # a tied lm_head is listed once, as the embedding
        if name.endswith("norm.weight"):
            value = torch.ones(p.shape)
        else:
            std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
            value = torch.randn(p.shape, generator=gen) * std
        p.copy_(value)


def is_tied(model: QwenDLM) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


def state_tensors(model: QwenDLM, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """HF-named tensors for `model.safetensors` (a tied lm_head is left out, as transformers does)."""
    tied = is_tied(model)
    return {
        name: t.detach().to("cpu", dtype).contiguous()
        for name, t in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }


def save_weights(model: QwenDLM, path: Path, dtype: torch.dtype = torch.float32) -> None:
    save_tensors(state_tensors(model, dtype), path)


@torch.no_grad()
def load_weights(model: QwenDLM, path: Path) -> None:
    """Strict copy of `path`'s tensors into the model's parameters (keeping them trainable)."""
    tensors = load_file(str(path))
    expected = state_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    params = model.state_dict()
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(params[name].shape):
            raise ValueError(f"{path}: '{name}' has shape {list(t.shape)}")
        params[name].copy_(t)


def count_parameters(model: QwenDLM) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors counted once
