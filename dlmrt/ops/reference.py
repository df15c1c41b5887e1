"""Plain-PyTorch twins of every custom op: the spec the Triton kernels are tested against (CPU-capable)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def arena_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, arena, head_dim]
    v: torch.Tensor,  # [kv_heads, arena, head_dim]
    kv_end: torch.Tensor,  # [] int64: keys [0, kv_end) are visible to every row
    scale: float,
) -> torch.Tensor:
    visible = torch.arange(k.shape[1], device=k.device) < kv_end  # [arena]
    groups = q.shape[0] // k.shape[0]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
    mask = visible.expand(q.shape[1], -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def token_stats(
    logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [rows, vocab] -> argmax, its probability, entropy (nats), log_z of softmax(logits / T)."""
    x = logits.float()
    if temperature > 0:
        x = x / temperature
    log_z = torch.logsumexp(x, dim=-1)
    p = torch.exp(x - log_z.unsqueeze(-1))
    # p * x is 0 where p underflows to 0, also for -inf logits (0 * -inf would be nan).
    entropy = log_z - torch.where(p > 0, p * x, 0.0).sum(-1)
    token = torch.argmax(x, dim=-1)
    confidence = torch.exp(x.gather(-1, token.unsqueeze(-1)).squeeze(-1) - log_z)
    return token, confidence, entropy, log_z
