"""The torch twin of DiffusionGemma's arena attention (kernels/canvas_attention.py): masked SDPA.

This is the path the model ran before the kernel, bit for bit: full layers attend over the whole
arena under a [rows, max_len] mask; sliding layers gather a fixed slice of window - 1 + rows arena
rows starting window - 1 rows before the pass start (clamped at 0, rows before position 0 masked),
exactly the keys transformers' sliding cache holds. Every shape depends on `rows` and the arena
length only (one captured graph serves every canvas). See `dlmrt/models/diffusion_gemma_context.py`.
"""

from __future__ import annotations

import torch

from dlmrt.attention import block_attention
from dlmrt.ops.reference import select_rows


def kernel_fits(head_dim: int) -> bool:
    """Whether kernels/canvas_attention.py tiles this head dim: a power of two >= 16 (one tile of
    the dot products), or a multiple of 128 (128-wide chunks; DiffusionGemma's 256 and 512)."""
    if head_dim > 128:
        return head_dim % 128 == 0
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def canvas_masks(
    positions: torch.Tensor, max_len: int, decoder: bool, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(full mask [rows, max_len], sliding mask [rows, window - 1 + rows], sliding gather indices).

    Decoder (a canvas): every row sees the context and the whole canvas; encoder (context rows):
    causal, sliding layers within the window. The pass starts at positions[0] (device-side)."""
    rows, dev = positions.shape[0], positions.device
    start = positions[:1]
    keys = torch.arange(max_len, device=dev).unsqueeze(0)
    slide = start - (window - 1) + torch.arange(window - 1 + rows, device=dev)
    q = positions.unsqueeze(1)
    if decoder:
        full = (keys < start + rows).expand(rows, max_len)
        sliding = (slide >= 0).unsqueeze(0).expand(rows, slide.shape[0])
    else:
        full = keys <= q
        sliding = (slide >= 0) & (slide <= q) & (q - slide < window)
    return full.contiguous(), sliding.contiguous(), slide.clamp(min=0)


def canvas_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, max_len, head_dim] (one arena layer, this pass's rows written)
    v: torch.Tensor,  # [kv_heads, max_len, head_dim]
    positions: torch.Tensor,  # [rows] consecutive positions start, start + 1, ...
    decoder: bool,
    window: int,  # the sliding window; 0: a full layer
    scale: float,
) -> torch.Tensor:  # [heads, rows, head_dim]
    """Attention of this pass's rows over the arena (see `canvas_masks` for who sees what)."""
    full, sliding, gather = canvas_masks(positions, k.shape[1], decoder, max(window, 1))
    mask = full
    if window > 0:
        k, v, mask = select_rows(k, 1, gather), select_rows(v, 1, gather), sliding
    # an FP8 arena is read dequantized
    k, v = k.to(q.dtype), v.to(q.dtype)
    return block_attention(q, k, v, positions, positions, 1, scale, mask)
