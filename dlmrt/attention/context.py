"""AttnContext: the per-forward attention metadata every layer reads (nano-vllm's Context, made explicit).

Visibility rule (SDAR block-causal): a query at absolute position q sees a key at position k iff
k // block_size <= q // block_size. With block_size 1 this is the ordinary causal mask, which the
transformers-parity test uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class KVArena(Protocol):
    """What attention needs from a KV cache: per-layer key/value tensors [kv_heads, max_len, head_dim]."""

    k: torch.Tensor  # [layers, kv_heads, max_len, head_dim]
    v: torch.Tensor


@dataclass(frozen=True, slots=True)
class AttnContext:
    """Where the rows of this forward sit and which keys they may see.

    positions: [rows] absolute positions (long, on the model's device).
    block_size: block length of the visibility rule.
    kv: the arena. When given, each layer writes its rows' K/V at `positions` and attends over
        arena rows [0, kv_len); when None, rows attend only to each other (the no-cache oracle).
    kv_len: host-side bound on the arena rows to read (CPU). None: each row's visible length is
        derived on the device from its position, over the whole arena (CUDA: static shapes, so
        one captured graph serves every block).
    mask: bool [rows, rows] visibility replacing the block-causal rule when kv is None (training
        layouts such as [prompt | clean response | noisy response], packed documents), or a
        flex_attention `BlockMask` over the same rows (CUDA training; see attention/flex.py).
    one_block: the caller guarantees every row lies in one block (a denoising round's canvas), so
        all rows see the same arena prefix: FlashAttention-4 may serve them (ops/flash_attn4.py).
    """

    positions: torch.Tensor
    block_size: int
    kv: KVArena | None = None
    kv_len: int | None = None
    mask: torch.Tensor | None = None
    one_block: bool = False
