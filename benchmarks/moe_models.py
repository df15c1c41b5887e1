"""Full-size random-weight MoE models for the round benchmarks, and their touched-expert floor.

LLaDA-2.1-mini: 20 layers (layer 0 dense, intermediate 5120), hidden 2048, 16/4 heads of 128,
partial rotary 64, 256 experts x 512 in 8 groups (top-4 groups), top-8, one shared expert, vocab
157184, 32-row blocks. For MoE the byte floor counts only the experts a round's routing touches
(counted from the routing itself), plus every dense weight read once and the KV arena rows read.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.models.llada2_config import LLaDA2Config
from dlmrt.models.moe import Experts, Router


def llada21_mini(layers: int = 20) -> LLaDA2Config:
    return LLaDA2Config(
        architecture="LLaDA2MoeModelLM",
        vocab_size=157184,
        hidden_size=2048,
        intermediate_size=5120,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        rotary_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=600000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        mask_token_id=156895,
        block_size=32,
        num_experts=256,
        top_k=8,
        n_group=8,
        topk_group=4,
        moe_intermediate_size=512,
        num_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        expert_bias=True,
    )


def random_moe_model(
    cls: type[nn.Module], cfg, device: torch.device, dtype=torch.bfloat16
) -> nn.Module:
    """Allocate on the device without initialising, then N(0, 0.02) weights and zero buffers."""
    with torch.device("meta"):
        model = cls(cfg).to(dtype)
    model = model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        for name, b in model.named_buffers():
            b.zero_() if "bias" in name else b.fill_(1)  # expert_bias 0; scalars/scales 1
    model = model.eval().requires_grad_(False)
    model.fuse_projections()
    return model


class TouchedExperts:
    """Counts, per MoE layer, the distinct experts one forward's routing selects (a forward hook)."""

    def __init__(self, model: nn.Module) -> None:
        self.per_layer: list[int] = []
        self.pairs = 0
        self._hooks = [m.register_forward_hook(self._hook) for m in model.modules() if _router(m)]

    def _hook(self, module, args, out) -> None:
        index = out[1]
        self.per_layer.append(int(torch.unique(index).numel()))
        self.pairs += index.numel()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def _router(m: nn.Module) -> bool:
    return isinstance(m, Router) or type(m).__name__ == "Router"


def moe_round_floor(
    model: nn.Module, rows: int, context: int, touched: TouchedExperts
) -> tuple[float, float]:
    """(FLOPs, bytes) of one round: dense weights read once (embedding rows excluded: a gather),
    the touched experts' weights, the KV arena read; FLOPs 2 x rows x dense params + 2 x pairs x
    params per expert + attention."""
    cfg = model.cfg
    expert_params, per_expert, dense = 0, 0, 0
    for name, p in model.named_parameters():
        if "embed" in name:
            continue
        dense += p.numel()
    for m in model.modules():
        if isinstance(m, Experts) or type(m).__name__ == "Experts":
            n = sum(p.numel() for p in m.parameters())
            expert_params += n
            per_expert = n // next(iter(m.parameters())).shape[0]
    dense -= expert_params
    size = model.embed_table.element_size()
    kv_size = cfg.num_key_value_heads * cfg.head_dim
    q_size = cfg.num_attention_heads * cfg.head_dim
    layers = cfg.num_hidden_layers
    nbytes = (dense + sum(touched.per_layer) * per_expert) * size
    nbytes += layers * 2 * (context + rows) * kv_size * size
    flops = 2 * rows * dense + 2 * touched.pairs * per_expert
    flops += layers * 4 * rows * (context + rows) * q_size
    return float(flops), float(nbytes)
