"""flex_attention backend for training layouts: a `BlockMask` in `AttnContext.mask` routes here.

Tiles the mask cannot see are skipped, so a packed row of many short documents costs about the
sum of its documents' attention, not N^2. Differentiable; compiled once on CUDA (eager
flex_attention materialises the scores and has no CPU backward: CPU training uses the dense twin).
"""

from __future__ import annotations

import torch

_compiled = None


def is_block_mask(mask: object) -> bool:
    return mask is not None and not isinstance(mask, torch.Tensor)


def flex_block_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, rows, head_dim]
    v: torch.Tensor,  # [kv_heads, rows, head_dim]
    block_mask,  # torch.nn.attention.flex_attention.BlockMask over [rows, rows]
    scale: float,
) -> torch.Tensor:  # [heads, rows, head_dim] in v's dtype
    global _compiled
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if q.is_cuda:
        if _compiled is None:
            _compiled = torch.compile(flex_attention, dynamic=False)
        fn = _compiled
    # Under autocast the normed q/k come out in fp32 and v in bf16; flex needs one dtype.
    dtype = (
        torch.get_autocast_dtype(q.device.type)
        if torch.is_autocast_enabled(q.device.type)
        else v.dtype
    )
    out = fn(
        q.unsqueeze(0).to(dtype),
        k.unsqueeze(0).to(dtype),
        v.unsqueeze(0).to(dtype),
        block_mask=block_mask,
        scale=scale,
        enable_gqa=q.shape[0] != k.shape[0],
    )
    return out.squeeze(0)
