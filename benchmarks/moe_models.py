"""The touched-expert floor of the round benchmarks' MoE models (LLaDA-2.1-mini, DiffusionGemma;
their configs: `dlmrt/model_shapes.py`). For MoE the byte floor counts only the experts a round's
routing touches (counted from the routing itself), plus every dense weight read once and the KV
arena rows read.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.models.moe import Experts, Router


class TouchedExperts:
    """Counts, per MoE layer, the distinct experts a forward's routing selects (a forward hook);
    `rows` keeps only passes over that many rows (e.g. the canvas, not the prompt's encoding)."""

    def __init__(self, model: nn.Module, rows: int | None = None) -> None:
        self.per_layer: list[int] = []
        self.pairs, self.rows = 0, rows
        self._hooks = [m.register_forward_hook(self._hook) for m in model.modules() if _router(m)]

    def _hook(self, module, args, out) -> None:
        index = out[1]
        if self.rows is None or index.shape[0] == self.rows:
            self.per_layer.append(int(torch.unique(index).numel()))
            self.pairs += index.numel()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def _router(m: nn.Module) -> bool:
    return isinstance(m, Router) or type(m).__name__ == "Router"


def _attention_dims(cfg) -> list[tuple[int, int, int | None]]:
    """Per layer (q size, K+V size, sliding window or None)."""
    if hasattr(cfg, "head_dims"):  # DiffusionGemma: per-layer heads and windows
        return [
            (
                cfg.num_attention_heads * d,
                2 * kv * d,
                cfg.sliding_window if t != "full_attention" else None,
            )
            for d, kv, t in zip(cfg.head_dims, cfg.kv_heads, cfg.layer_types, strict=True)
        ]
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim
    return [(cfg.num_attention_heads * cfg.head_dim, kv, None)] * cfg.num_hidden_layers


def moe_round_floor(
    model: nn.Module, rows: int, context: int, touched: TouchedExperts
) -> tuple[float, float]:
    """(FLOPs, bytes) of one round: dense weights read once (embedding rows excluded: a gather;
    a tied LM head counted once), the touched experts' weights, the K/V rows attention reads
    (sliding layers: the window); FLOPs 2 x rows x dense params + 2 x pairs x params per
    expert + attention."""
    expert_params, per_expert, dense = 0, 0, 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if "embed" not in name:
            dense += p.numel()
    for m in model.modules():
        if isinstance(m, Experts) or type(m).__name__ == "Experts":
            n = sum(p.numel() for p in m.parameters())
            expert_params += n
            per_expert = n // next(iter(m.parameters())).shape[0]
    dense -= expert_params
    size = model.embed_table.element_size()
    nbytes = (dense + sum(touched.per_layer) * per_expert) * size
    flops = 2 * rows * dense + 2 * touched.pairs * per_expert
    for q_size, kv_size, window in _attention_dims(model.cfg):
        keys = (context if window is None else min(context, window - 1)) + rows
        nbytes += keys * kv_size * size
        flops += 4 * rows * keys * q_size
    return float(flops), float(nbytes)


def route_to_first(model: nn.Module, n: int) -> int:
    """Bias every MoE router of `model` so each row picks its experts among the layer's first `n`
    only (random weights route a block's rows to about every expert; a real model's canvas
    touches fewer). LLaDA2: the selection-only `expert_bias` (no extra kernel); DiffusionGemma
    (no bias): a forward hook adds -1e4 to the other experts' logits (one elementwise kernel a
    layer). Returns n; ValueError if n is not in [top_k, experts]."""
    routers = [m for m in model.modules() if _router(m)]
    for router in routers:
        experts = router.weight.shape[0] if hasattr(router, "weight") else router.proj.out_features
        top_k = getattr(router, "top_k", None) or router.k
        if not top_k <= n <= experts:
            raise ValueError(f"--route-to: expected {top_k}..{experts} experts, got {n}")
        bias = torch.zeros(experts, device=next(router.parameters()).device)
        bias[n:] = -1e4
        if getattr(router, "expert_bias", None) is not None:
            router.expert_bias.copy_(bias)
        else:
            router.proj.register_forward_hook(lambda _m, _a, out, b=bias: out + b.to(out.dtype))
    return n
