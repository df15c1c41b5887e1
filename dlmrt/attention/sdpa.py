"""Reference attention (torch SDPA, CPU or GPU): the spec that faster backends are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlmrt.attention.flex import flex_block_attention, is_block_mask


def visibility_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Bool [rows, keys]: key k visible to query q iff k // block_size <= q // block_size."""
    return (k_pos // block_size).unsqueeze(0) <= (q_pos // block_size).unsqueeze(1)


def block_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, keys, head_dim]
    v: torch.Tensor,  # [kv_heads, keys, head_dim]
    q_pos: torch.Tensor,  # [rows]
    k_pos: torch.Tensor,  # [keys]
    block_size: int,
    scale: float,
    mask: torch.Tensor | None = None,  # [rows, keys] bool (or a flex BlockMask): overrides the rule
) -> torch.Tensor:  # [heads, rows, head_dim]
    """Grouped-query attention under the block-causal visibility rule (or an explicit mask)."""
    if is_block_mask(mask):  # training layouts on CUDA: flex_attention skips invisible tiles
        return flex_block_attention(q, k, v, mask, scale)
    if mask is None:
        mask = visibility_mask(q_pos, k_pos, block_size)
    groups = q.shape[0] // k.shape[0]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=0)
        v = v.repeat_interleave(groups, dim=0)
    # 4-D (batch 1), as transformers calls it: on the CPU a 3-D call takes another kernel whose
    # bf16 roundings differ from transformers' (the oracle of the parity tests).
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale)
    return out[0]
