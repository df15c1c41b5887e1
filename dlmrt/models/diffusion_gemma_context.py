"""DiffusionGemma's attention contexts: which keys a pass reads, and where its own K/V go.

A pass hands its layers one context view, chosen by the data it was given (never by a call back
into the engine):

GrowingContext  no cache: the rows are [context | canvas], all recomputed (the oracle's layout);
                or a `ContextCache` (transformers' layout): a pass is all context rows (an
                encoder pass: their K/V are appended) or all canvas rows (a decoder pass against
                the cached context). Keys are the cached rows, then this pass's rows.
ArenaContext    a static arena (`ctx.kv`: per-layer `k`, `v` lists of [kv_heads, max_len,
                head_dim] and `max_len`; allocated by the engine, `dlmrt/engine/kv_cache.py`).
                Arena row j holds position j. A pass over `rows` rows at device positions
                start.. first writes its own K/V into rows [start, start + rows), then reads
                `ops.canvas_attention` over the arena layer:
                - full layers: decoder: rows < start + rows, i.e. the context and the canvas
                  itself; encoder: rows <= the query's position, causal;
                - sliding layers: also rows >= start - window + 1 (decoder) or > the query's
                  position - window (encoder): the keys transformers' sliding cache holds.
                CUDA: a kernel reading those ranges from the device-side start (no mask, no
                gather; kernels/canvas_attention.py); twin: masked SDPA (dlmrt/ops/canvas.py).
                Every shape depends on `rows` and `max_len` only, so one captured graph serves
                every canvas; decoder passes write the canvas's K/V into the rows the next
                encoder pass (its commit) overwrites.

Visibility (both): context rows see context keys at pos_k <= pos_q (sliding layers also
pos_q - pos_k < window); canvas rows see every canvas row and the context (sliding layers: the
last window - 1 context positions before the canvas's first row c0).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dlmrt import ops
from dlmrt.account import label
from dlmrt.attention import block_attention
from dlmrt.ops import gemma


class KeyNorm(NamedTuple):
    """How a layer normalises its raw K / V (transformers' roundings, `dlmrt/ops/gemma.py`): K by
    Gemma's RMSNorm with `k_gain` then RoPE (`rope` = cos, sin), V by the weightless norm."""

    k_gain: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor]
    eps: float


class ContextCache:
    """K/V of every encoded context row (the prompt, then each committed canvas), per layer.

    Encoder passes (`canvas=0`) append to it; decoder passes read it. Grows by concatenation."""

    def __init__(self, layers: int, device: torch.device) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers
        self.positions = torch.empty(0, dtype=torch.long, device=device)

    def __len__(self) -> int:
        return self.positions.numel()

    def append(self, layer: int, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        old = self.kv[layer]
        self.kv[layer] = kv if old is None else tuple(torch.cat(p, dim=1) for p in zip(old, kv))


def visibility(
    q_pos: torch.Tensor, k_pos: torch.Tensor, canvas: int, cached: int, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(full mask, sliding mask) bool [rows, keys] and is_canvas [rows, 1].

    Keys are `cached` context rows from the cache, then this pass's rows; the last `canvas` rows
    of this pass are the canvas."""
    rows = q_pos.shape[0]
    new = torch.arange(rows, device=q_pos.device)
    is_canvas = (new >= rows - canvas).unsqueeze(1)
    key_ctx = torch.cat(
        (torch.ones(cached, dtype=torch.bool, device=q_pos.device), new < rows - canvas)
    )
    q, k, key_ctx = q_pos.unsqueeze(1), k_pos.unsqueeze(0), key_ctx.unsqueeze(0)
    causal = key_ctx & (k <= q)
    full = causal | is_canvas
    dec_sliding = ~key_ctx | (q_pos[rows - canvas] - k < window) if canvas else full
    sliding = torch.where(is_canvas, dec_sliding, causal & (q - k < window))
    return full, sliding, is_canvas


class GrowingContext:
    """No cache, or transformers' growing `ContextCache` (see the module docstring)."""

    def __init__(self, cache: ContextCache | None, pos: torch.Tensor, canvas: int, window: int):
        rows = pos.shape[0]
        if cache is not None and canvas not in (0, rows):
            raise ValueError("with a cache, a pass is all context rows or all canvas rows")
        self.cache, self.pos = cache, pos
        self.cached = 0 if cache is None else len(cache)
        self.k_pos = pos if cache is None else torch.cat((cache.positions, pos))
        self.encodes = cache is not None and canvas == 0
        self.full, sliding, self.is_canvas = visibility(
            pos, self.k_pos, canvas, self.cached, window
        )
        # Sliding layers read only the last window - 1 cached rows (the rest are masked anyway):
        # the keys transformers' sliding cache holds, so the attention sums round the same.
        self.kept = min(self.cached, window - 1)
        self.sliding = sliding[:, self.cached - self.kept :]  # a column depends on its key only

    def attend(self, layer: int, sliding: bool, q, k: torch.Tensor, v: torch.Tensor, norm: KeyNorm):
        """This pass's q [heads, rows, head_dim], raw (k, v) [rows, kv_heads, head_dim] ->
        attention (K / V normed by `norm`, then cached and attended)."""
        k = gemma.qk_norm_rope(k, norm.k_gain, *norm.rope, norm.eps)
        v = gemma.v_norm(v, norm.eps)
        keys, values = self.keys(layer, sliding, k, v)
        mask = self.sliding if sliding else self.full
        return block_attention(q, keys, values, self.pos, self.pos, 1, 1.0, mask)

    def keys(self, layer: int, sliding: bool, k: torch.Tensor, v: torch.Tensor):
        """This pass's (k, v) [kv_heads, rows, head_dim] -> the keys and values to attend."""
        past = None if self.cache is None else self.cache.kv[layer]
        if self.encodes:
            self.cache.append(layer, (k, v))
        if past is None:
            return k, v
        if sliding:
            cut = self.cached - self.kept
            past = (past[0][:, cut:], past[1][:, cut:])
        return torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1)

    def finish(self) -> None:
        if self.encodes:
            self.cache.positions = self.k_pos


class ArenaContext:
    """The static arena (see the module docstring); `decoder`: the pass is a canvas."""

    def __init__(self, arena, pos: torch.Tensor, decoder: bool, window: int) -> None:
        self.arena, self.pos, self.decoder, self.window = arena, pos, decoder, window
        rows, dev = pos.shape[0], pos.device
        self.is_canvas = torch.full((rows, 1), decoder, dtype=torch.bool, device=dev)

    def attend(self, layer: int, sliding: bool, q, k: torch.Tensor, v: torch.Tensor, norm: KeyNorm):
        """Norm this pass's raw (k, v) straight into their arena rows (device indices; no write
        pass after), then attend over the arena: `ops.canvas_attention` (the visibility of the
        module docstring; an FP8 arena is read dequantized)."""
        ak, av = self.arena.k[layer], self.arena.v[layer]
        with label("kv_norm_rope", k, v):
            gemma.qk_norm_rope(k, norm.k_gain, *norm.rope, norm.eps, ak, self.pos)
            gemma.v_norm(v, norm.eps, av, self.pos)
        window = self.window if sliding else 0
        with label("attention", q, ak, av, self.pos, window):
            return ops.canvas_attention(q, ak, av, self.pos, self.decoder, window, 1.0)

    def finish(self) -> None:
        pass
