"""The replay forward: `BlockLM.forward` over a packed row, z injected into the noisy rows.

It runs the model's own modules in `BlockLM.forward`'s order (embedding -> adapter injection ->
layers -> final norm -> head); the one difference is where z enters: the noisy copies anywhere in
the row instead of the last rows. Each noisy copy gets h = post(E[x] + alpha * m * g(z)) on its
rows exactly as the rollout's block did (`ResidualAdapter.inject`), with z a constant (the paper's
stop-gradient: no gradient reaches the embedding through z). Logits only for the noisy rows.
A `ResidualProbe` given to the replay reads the g(z) and E[x] it computed anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dlmrt.attention import AttnContext
from dlmrt.models.layers import rope_cos_sin
from dlmrt.train.orl.row import PackedRow

if TYPE_CHECKING:
    from dlmrt.train.orl.residual_probe import ResidualProbe


def replay_hidden(
    model: torch.nn.Module, row: PackedRow, mask, probe: ResidualProbe | None = None
) -> torch.Tensor:
    """The output-head input h of the noisy rows: [M, hidden]. `mask`: dense bool [N, N] or a
    flex_attention `BlockMask` (`dlmrt/train/masks.py: attention_mask`). `probe`: gets the noisy
    rows' E[x], z and g(z) (the residual-to-embedding ratio of the step)."""
    h = model.embed_table[row.ids]
    adapter = model.adapter
    if adapter is None:
        raise ValueError("replay: the model has no residual adapter")
    z = row.z.detach().to(h.dtype)
    tok_emb, g = h[row.noisy], adapter(z)  # g once: the injection and the probe share it
    if probe is not None:
        probe.add_replay(tok_emb, z, g, row.unresolved)
    injected = adapter.inject(tok_emb, z, adapter.receives(row.unresolved), g)
    h = h.index_copy(0, row.noisy, injected.to(h.dtype))  # autocast: the adapter's out is bf16
    cfg = model.cfg
    rope = rope_cos_sin(row.positions, model.rotary_dim, cfg.rope_theta, h.dtype)
    ctx = AttnContext(row.positions, cfg.block_size, mask=mask)
    residual = None
    for layer in model.model.layers:
        h, residual = layer(h, residual, rope, ctx)
    return model.model.norm(h[row.noisy], residual[row.noisy])[0]


def replay_logits(
    model: torch.nn.Module, row: PackedRow, mask, probe: ResidualProbe | None = None
) -> torch.Tensor:
    """Logits [M, V] of the row's noisy rows (state by state, rows in block order)."""
    return model.lm_head(replay_hidden(model, row, mask, probe))
