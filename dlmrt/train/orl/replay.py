"""The replay forward: `BlockLM.forward` over a packed row, z injected into the noisy rows.

It runs the model's own modules in `BlockLM.forward`'s order (embedding -> adapter injection ->
layers -> final norm -> head); the one difference is where z enters: the noisy copies anywhere in
the row instead of the last rows. Each noisy copy gets h = post(E[x] + alpha * m * g(z)) on its
rows exactly as the rollout's block did (`ResidualAdapter.inject`), with z a constant (the paper's
stop-gradient: no gradient reaches the embedding through z). Logits only for the noisy rows.
"""

from __future__ import annotations

import torch

from dlmrt.attention import AttnContext
from dlmrt.models.layers import rope_cos_sin
from dlmrt.train.orl.row import PackedRow


def replay_hidden(model: torch.nn.Module, row: PackedRow, mask) -> torch.Tensor:
    """The output-head input h of the noisy rows: [M, hidden]. `mask`: dense bool [N, N] or a
    flex_attention `BlockMask` (`dlmrt/train/masks.py: attention_mask`)."""
    h = model.embed_table[row.ids]
    adapter = model.adapter
    if adapter is None:
        raise ValueError("replay: the model has no residual adapter")
    z = row.z.detach().to(h.dtype)
    injected = adapter.inject(h[row.noisy], z, adapter.receives(row.unresolved))
    h = h.index_copy(0, row.noisy, injected.to(h.dtype))  # autocast: the adapter's out is bf16
    cfg = model.cfg
    rope = rope_cos_sin(row.positions, model.rotary_dim, cfg.rope_theta, h.dtype)
    ctx = AttnContext(row.positions, cfg.block_size, mask=mask)
    residual = None
    for layer in model.model.layers:
        h, residual = layer(h, residual, rope, ctx)
    return model.model.norm(h[row.noisy], residual[row.noisy])[0]


def replay_logits(model: torch.nn.Module, row: PackedRow, mask) -> torch.Tensor:
    """Logits [M, V] of the row's noisy rows (state by state, rows in block order)."""
    return model.lm_head(replay_hidden(model, row, mask))
