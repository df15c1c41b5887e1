"""The block-diffusion training mask over a packed row of [clean | noisy] documents.

Layout of one example (prompt P tokens, response padded so that P + R = K * B; blocks sit on
absolute positions 0, B, 2B, ... exactly as at inference, see `dlmrt/blocks.py`):

    clean copy   positions 0 .. (K-1)*B - 1          blocks 0 .. K-2   (prompt, then response)
    noisy copy   positions f*B .. K*B - 1            blocks f .. K-1   (f = P // B)

The noisy copy holds every decode block: block f starts with the prompt tail (P mod B clean
prompt tokens, never masked: at inference they are resolved rows of the first decode block),
then response tokens, some replaced by <|MASK|>. Noisy rows reuse the clean rows' positions.
The last clean block is left out: no noisy block may see it, so it could change nothing.

Visibility (query row q, key row k; `blk` = absolute position // B):

    different documents                      never (pads are single-row documents)
    clean q, clean k                         blk[k] <= blk[q]   (block-causal, as prefill/commit)
    noisy q, clean k                         blk[k] <  blk[q]   (the KV arena of the prefix)
    noisy q, noisy k                         blk[k] == blk[q]   (its own block, bidirectional)
    clean q, noisy k                         never

so noisy block b sees exactly what the engine shows block b at inference: the prompt blocks and
the committed clean blocks before b, and its own canvas (prompt tail included for b = f).

One `mask_mod` encodes the rules; `dense_mask` evaluates it into a bool [N, N] tensor (the CPU
twin, used with SDPA), `block_mask` compiles it into a flex_attention `BlockMask` (CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

FLEX_TILE = 128  # flex_attention's default tile: packed rows are padded to a multiple of it


@dataclass(frozen=True, slots=True)
class MaskMeta:
    """Per-row metadata of a packed row [N]: which document, clean or noisy, which block."""

    doc: torch.Tensor  # int32; examples 0, 1, ...; pad row i is its own document -(i + 1)
    noisy: torch.Tensor  # bool
    block: torch.Tensor  # int32 absolute block index (position // B); 0 for pads


def make_mask_mod(meta: MaskMeta) -> Callable:
    """The visibility rule as a flex_attention `mask_mod(b, h, q_idx, kv_idx)` (also broadcastable)."""
    doc, noisy, block = meta.doc, meta.noisy, meta.block

    def mask_mod(b, h, q, kv):
        same = doc[q] == doc[kv]
        qn, kn = noisy[q], noisy[kv]
        clean_rule = ~qn & ~kn & (block[kv] <= block[q])
        noisy_self = qn & kn & (block[kv] == block[q])
        noisy_ctx = qn & ~kn & (block[kv] < block[q])
        return same & (clean_rule | noisy_self | noisy_ctx)

    return mask_mod


def dense_mask(meta: MaskMeta) -> torch.Tensor:
    """Bool [N, N]: query row q may see key row k (the CPU twin of `block_mask`)."""
    n = meta.doc.shape[0]
    idx = torch.arange(n, device=meta.doc.device)
    return make_mask_mod(meta)(None, None, idx.unsqueeze(1), idx.unsqueeze(0))


_create_block_mask = None


def block_mask(meta: MaskMeta):
    """A flex_attention `BlockMask` for the packed row (compiled builder on CUDA, eager on CPU).

    Compiled once; new metadata values with the same row length reuse the compiled builder.
    """
    global _create_block_mask
    from torch.nn.attention.flex_attention import create_block_mask

    n = meta.doc.shape[0]
    device = meta.doc.device
    if device.type != "cuda":
        return create_block_mask(make_mask_mod(meta), None, None, n, n, device=device)
    if _create_block_mask is None:
        _create_block_mask = torch.compile(create_block_mask, dynamic=False)
    return _create_block_mask(make_mask_mod(meta), None, None, n, n, device=device)


def attention_mask(meta: MaskMeta, kind: str):
    """`kind` "flex": a BlockMask; "dense": a bool [N, N] tensor. Goes into `AttnContext.mask`."""
    if kind == "flex":
        return block_mask(meta)
    if kind == "dense":
        return dense_mask(meta)
    raise ValueError(f"attention: expected 'flex' or 'dense', got {kind!r}")
