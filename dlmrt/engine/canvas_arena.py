"""ContextArena: DiffusionGemma's context K/V in fixed-shape per-layer buffers, and the static forward.

The eager `ContextCache` grows by concatenation, so every pass has new shapes. Here each layer
owns K and V of [kv_heads, max_len, head_dim]; arena row j holds position j (canvases follow the
prompt with no gap). A pass over `rows` rows at a device-side offset `start` first writes its own
K/V into rows [start, start + rows) (index_copy_ with device indices), then reads:

- full layers: the whole arena, masked on the device (decoder: rows < start + rows, i.e. the
  context and the canvas itself; encoder: rows <= the query's position, causal);
- sliding layers: a fixed slice of window - 1 + rows rows, starting window - 1 rows before
  `start`, gathered with device-side indices (clamped at 0; rows before position 0 are masked):
  exactly the keys transformers' sliding cache holds, then this pass's rows.

Decoder passes write the canvas's K/V into the rows the next encoder pass (its commit) overwrites,
so keys are read in the reference's order (context, then canvas); the masked rows past them add
exact zeros to the softmax. Every shape depends on `rows` and `max_len` only: a graph captured
once serves every canvas and request until the arena grows (the engine then recaptures).
"""

from __future__ import annotations

import torch

from dlmrt.models.diffusion_gemma_config import SLIDING
from dlmrt.models.layers import proportional_rope_cos_sin


class ContextArena:
    """Per-layer K/V [kv_heads, max_len, head_dim] (zeroed: masked rows never carry NaN)."""

    def __init__(self, cfg, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k, self.v = [], []
        for heads, dim in zip(cfg.kv_heads, cfg.head_dims, strict=True):
            self.k.append(torch.zeros(heads, max_len, dim, dtype=dtype, device=device))
            self.v.append(torch.zeros(heads, max_len, dim, dtype=dtype, device=device))
        self.max_len = max_len

    def view(self, layer: int, rows: torch.Tensor, gather: torch.Tensor | None):
        """The layer's `past` callable: write rows (device indices), return the keys to read
        (gather: the sliding slice's indices; None: the whole arena)."""

        def past(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.k[layer].index_copy_(1, rows, k)
            self.v[layer].index_copy_(1, rows, v)
            if gather is None:
                return self.k[layer], self.v[layer]
            return self.k[layer].index_select(1, gather), self.v[layer].index_select(1, gather)

        return past


def arena_masks(pos: torch.Tensor, max_len: int, window: int, decoder: bool):
    """(full mask [rows, max_len], sliding mask [rows, window - 1 + rows], sliding gather indices).

    `pos` [rows] = start + arange(rows), on the device; see the module docstring for the rule."""
    rows, dev = pos.shape[0], pos.device
    start = pos[:1]
    keys = torch.arange(max_len, device=dev).unsqueeze(0)
    slide = start - (window - 1) + torch.arange(window - 1 + rows, device=dev)
    q = pos.unsqueeze(1)
    if decoder:  # every canvas row sees the context and the whole canvas
        full = (keys < start + rows).expand(rows, max_len)
        sliding = (slide >= 0).unsqueeze(0).expand(rows, slide.shape[0])
    else:  # causal context rows, sliding layers within the window
        full = keys <= q
        sliding = (slide >= 0) & (slide <= q) & (q - slide < window)
    return full.contiguous(), sliding.contiguous(), slide.clamp(min=0)


def _embed(model, ids: torch.Tensor, sc: torch.Tensor | None, first: torch.Tensor | None):
    """DiffusionGemma._embed over static buffers: decoder rows (sc given) take self-conditioning
    unless `first` (a device bool) is set, which keeps exactly the `sc_logits=None` input."""
    h = model.model.embed_tokens(ids) * model.embed_scale(model.embed_table.dtype)
    if sc is None:
        return h
    soft = model.soft_embedding(sc, 1.0)  # sc_temperature 1.0, as the reference's decoder passes
    return model.model.self_conditioning.inject(h, soft, first)


def static_forward(
    model,
    arena: ContextArena,
    ids: torch.Tensor,  # [rows]
    start: torch.Tensor,  # [] int64 device: position of the first row
    sc: torch.Tensor | None = None,  # [rows, vocab] decoder pass: last step's tempered logits
    first: torch.Tensor | None = None,  # [] bool: no self-conditioning yet (decoder pass)
) -> torch.Tensor | None:
    """A decoder pass (sc given: -> softcapped fp32 logits) or an encoder pass (writes K/V only)."""
    cfg, rows = model.cfg, ids.shape[0]
    decoder = sc is not None
    pos = start + torch.arange(rows, device=ids.device)
    h = _embed(model, ids, sc, first)
    full, sliding, gather = arena_masks(pos, arena.max_len, cfg.sliding_window, decoder)
    is_canvas = torch.full((rows, 1), decoder, dtype=torch.bool, device=ids.device)
    ropes = {}
    for kind, spec in cfg.rope.items():
        dim = cfg.head_dims[cfg.layer_types.index(kind)]
        ropes[kind] = proportional_rope_cos_sin(
            pos, dim, spec.theta, spec.rotary_factor, h.dtype, spec.factor
        )
    for i, (layer, kind) in enumerate(zip(model.model.layers, cfg.layer_types, strict=True)):
        sliding_layer = kind == SLIDING
        past = arena.view(i, pos, gather if sliding_layer else None)
        h, _ = layer(h, ropes[kind], sliding if sliding_layer else full, pos, is_canvas, past)
    if not decoder:
        return None
    logits = model.lm_head(model.model.norm(h)).float()
    cap = cfg.final_logit_softcapping
    return logits if cap is None else cap * torch.tanh(logits / cap)
