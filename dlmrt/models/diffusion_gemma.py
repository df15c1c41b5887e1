"""DiffusionGemma (`DiffusionGemmaForBlockDiffusion`): one Gemma-4 MoE text tower in two modes.

A forward takes [context rows | canvas rows] (the last `canvas` rows are the canvas), or, with a
`ContextCache`, new context rows alone (encoder pass: their K/V are appended) or the canvas alone
(decoder pass against the cached K/V); explicit masks give the visibility transformers uses:

- context rows (encoder mode): key k visible to query q iff k is a context row and pos_k <= pos_q;
  sliding layers also need pos_q - pos_k < sliding_window.
- canvas rows (decoder mode): every canvas row, plus context rows: full layers all of them; sliding
  layers those with c0 - pos_k < sliding_window, c0 = position of the first canvas row (the last
  sliding_window - 1 context positions: what transformers' sliding cache holds). Canvas rows get the
  self-conditioning input and the decoder copy of `layer_scalar`; context rows never see the canvas.

Weights: `model.decoder.*` and `model.encoder.language_model.*` map to one set (`checkpoint_name`);
only `layer_scalar` has separate encoder/decoder copies. The vision tower is skipped (text only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt import ops
from dlmrt.attention import AttnContext, block_attention
from dlmrt.models.diffusion_gemma_config import SLIDING, DiffusionGemmaConfig
from dlmrt.models.layers import GeGLU, GemmaRMSNorm, proportional_rope_cos_sin
from dlmrt.models.residual import SelfConditioning
from dlmrt.ops.reference import rotate


class Attention(nn.Module):
    """Attention scale 1.0; q/k RMSNorm (weight) before RoPE, v RMSNorm without weight.
    Full layers have no v_proj: V is the raw k_proj output (K = V)."""

    def __init__(self, cfg: DiffusionGemmaConfig, i: int) -> None:
        super().__init__()
        hidden, self.heads = cfg.hidden_size, cfg.num_attention_heads
        self.head_dim, self.kv_heads, self.eps = cfg.head_dims[i], cfg.kv_heads[i], cfg.rms_norm_eps
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        sliding = cfg.layer_types[i] == SLIDING
        self.v_proj = (
            nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False) if sliding else None
        )
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = GemmaRMSNorm(self.head_dim, self.eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, self.eps)

    def forward(self, x: torch.Tensor, rope, mask: torch.Tensor, pos: torch.Tensor, past=None):
        """-> (output [rows, hidden], this pass's (K, V) [kv_heads, rows, head_dim]); `past` is
        the cached context's (K, V), prepended to the keys (mask columns: past keys first), or a
        callable (k, v) -> (keys, values): the static arena (engine/canvas_arena.py) writes this
        pass's rows into its fixed-shape K/V and returns the rows to read."""
        rows = x.shape[0]
        q = self.q_proj(x).view(rows, self.heads, self.head_dim)
        k = self.k_proj(x).view(rows, self.kv_heads, self.head_dim)
        v = k if self.v_proj is None else self.v_proj(x).view(rows, self.kv_heads, self.head_dim)
        # transformers' roundings: norm (fp32, one cast), then RoPE in the model dtype
        q = rotate(self.q_norm(q), *rope).transpose(0, 1)
        k = rotate(self.k_norm(k), *rope).transpose(0, 1)
        v = ops.gemma_rms_norm(v, None, self.eps).transpose(0, 1)
        keys, values = k, v
        if callable(past):
            keys, values = past(k, v)
        elif past is not None:
            keys, values = torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1)
        out = block_attention(q, keys, values, pos, pos, 1, 1.0, mask)  # mask given: pos unused
        return self.o_proj(out.transpose(0, 1).reshape(rows, -1)), (k, v)


class Router(nn.Module):
    """softmax(proj(RMSNorm_noweight(r) * scale / sqrt(hidden))) in fp32, top-k, renormalised,
    times per_expert_scale."""

    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))
        self.k, self.eps, self.root = cfg.top_k_experts, cfg.rms_norm_eps, cfg.hidden_size**-0.5

    def forward(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = ops.gemma_rms_norm(r, None, self.eps) * self.scale * self.root
        return ops.moe_route_softmax(self.proj(x), self.per_expert_scale, self.k)


class Experts(nn.Module):
    """Per-expert GeGLU; gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]."""

    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        # sum_dtype=x.dtype: transformers accumulates the experts in the model dtype (twin only)
        return ops.moe_mlp(
            x, weights, index, self.gate_up_proj, self.down_proj, "gelu_tanh", sum_dtype=x.dtype
        )


class Layer(nn.Module):
    _NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm")
    _NORMS += ("post_feedforward_layernorm", "post_feedforward_layernorm_1")
    _NORMS += ("post_feedforward_layernorm_2", "pre_feedforward_layernorm_2")

    def __init__(self, cfg: DiffusionGemmaConfig, i: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, i)
        self.mlp = GeGLU(cfg.hidden_size, cfg.intermediate_size)
        self.router, self.experts = Router(cfg), Experts(cfg)
        for name in self._NORMS:
            setattr(self, name, GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps))
        self.register_buffer("layer_scalar", torch.ones(1))  # decoder copy
        self.register_buffer("encoder_layer_scalar", torch.ones(1))

    def forward(self, h, rope, mask, pos, is_canvas: torch.Tensor, past=None):
        attn, kv = self.self_attn(self.input_layernorm(h), rope, mask, pos, past)
        r = h + self.post_attention_layernorm(attn)
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(r)))
        moe = self.experts(self.pre_feedforward_layernorm_2(r), *self.router(r))
        out = r + self.post_feedforward_layernorm(dense + self.post_feedforward_layernorm_2(moe))
        return out * torch.where(is_canvas, self.layer_scalar, self.encoder_layer_scalar), kv


def visibility(
    q_pos: torch.Tensor, k_pos: torch.Tensor, canvas: int, cached: int, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(full mask, sliding mask) bool [rows, keys] and is_canvas [rows, 1].

    Keys are `cached` context rows from the cache, then this pass's rows; the last `canvas` rows
    of this pass are the canvas. See the module docstring for the rule."""
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


class ContextCache:
    """K/V of every encoded context row (the prompt, then each committed canvas), per layer.

    Encoder passes (`canvas=0`) append to it; decoder passes read it. Eager: grows by concatenation."""

    def __init__(self, layers: int, device: torch.device) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers
        self.positions = torch.empty(0, dtype=torch.long, device=device)

    def __len__(self) -> int:
        return self.positions.numel()

    def append(self, layer: int, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        old = self.kv[layer]
        self.kv[layer] = kv if old is None else tuple(torch.cat(p, dim=1) for p in zip(old, kv))


class Backbone(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        sc = cfg.self_conditioning_size
        self.self_conditioning = SelfConditioning(cfg.hidden_size, sc, cfg.rms_norm_eps)


class DiffusionGemma(nn.Module):
    """forward(ids, ctx, canvas, sc_logits) -> softcapped fp32 logits [rows, vocab].

    The last `canvas` rows run in decoder mode (0: a pure encoder pass); `sc_logits` [canvas, vocab]
    are the previous step's logits (already tempered: the soft embedding is softmax(sc_logits /
    sc_temperature) @ E * sqrt(hidden)); None = zero self-conditioning input (first step).
    """

    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @staticmethod
    def checkpoint_name(name: str) -> str | None:
        """HF tensor name -> ours (None: skipped). Encoder and decoder share every weight but
        `layer_scalar`; the decoder copy sorts first, so it is the one loaded."""
        for prefix in ("model.decoder.", "model.encoder.language_model."):
            if name.startswith(prefix):
                rest = name[len(prefix) :]
                if prefix != "model.decoder." and rest.endswith(".layer_scalar"):
                    rest = rest.replace(".layer_scalar", ".encoder_layer_scalar")
                return "model." + rest
        return None if name.startswith("model.encoder.") else name

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        for module in self.modules():
            if hasattr(module, "fuse") and module is not self:
                module.fuse()

    @property
    def embed_table(self) -> torch.Tensor:
        return self.model.embed_tokens.weight

    def embed_scale(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(self.cfg.hidden_size**0.5, dtype=torch.float32).to(dtype)

    def soft_embedding(self, sc_logits: torch.Tensor, sc_temperature: float) -> torch.Tensor:
        """softmax(sc_logits / T) @ E * sqrt(hidden), as transformers: softmax in fp32, cast,
        then @ E (not the fused exp(x - logZ) twin)."""
        probs = F.softmax(sc_logits.float() / sc_temperature, dim=-1, dtype=torch.float32)
        scale = self.embed_scale(self.embed_table.dtype)
        return (probs.to(self.embed_table.dtype) @ self.embed_table) * scale

    def _embed(self, ids: torch.Tensor, canvas: int, sc_logits, sc_temperature: float):
        scale = self.embed_scale(self.embed_table.dtype)
        h = self.model.embed_tokens(ids) * scale
        if canvas == 0:
            return h
        soft = None if sc_logits is None else self.soft_embedding(sc_logits, sc_temperature)
        tail = self.model.self_conditioning.inject(h[-canvas:], soft)
        return tail if canvas == h.shape[0] else torch.cat((h[:-canvas], tail))

    def new_cache(self, device: torch.device) -> ContextCache:
        return ContextCache(self.cfg.num_hidden_layers, device)

    def forward(
        self,
        input_ids: torch.Tensor,  # [rows]: context rows, then `canvas` canvas rows
        ctx: AttnContext,
        canvas: int = 0,
        sc_logits: torch.Tensor | None = None,  # [canvas, vocab]
        sc_temperature: float = 1.0,
        compute_logits: bool = True,
        cache: ContextCache | None = None,
    ) -> torch.Tensor | None:
        """With `cache`, the rows are either new context rows (`canvas=0`: encoded, their K/V
        appended) or the canvas alone (`canvas=rows`: decoded against the cached context)."""
        if ctx.kv is not None:
            raise NotImplementedError("DiffusionGemma has no KV-arena path yet (kv must be None)")
        pos = ctx.positions
        cached = 0 if cache is None else len(cache)
        if cache is not None and canvas not in (0, pos.shape[0]):
            raise ValueError("with a cache, a pass is all context rows or all canvas rows")
        k_pos = pos if cache is None else torch.cat((cache.positions, pos))
        h = self._embed(input_ids, canvas, sc_logits, sc_temperature)
        window = self.cfg.sliding_window
        full, sliding, is_canvas = visibility(pos, k_pos, canvas, cached, window)
        # Sliding layers read only the last window - 1 cached rows (the rest are masked anyway):
        # the keys transformers' sliding cache holds, so the attention sums round the same.
        kept = min(cached, window - 1)
        sliding = sliding[:, cached - kept :]  # each mask column depends on its own key only
        ropes = {}
        for kind, spec in self.cfg.rope.items():
            dim = self.cfg.head_dims[self.cfg.layer_types.index(kind)]
            ropes[kind] = proportional_rope_cos_sin(
                pos, dim, spec.theta, spec.rotary_factor, h.dtype, spec.factor
            )
        for i, (layer, kind) in enumerate(
            zip(self.model.layers, self.cfg.layer_types, strict=True)
        ):
            mask = sliding if kind == SLIDING else full
            past = None if cache is None else cache.kv[i]
            if past is not None and kind == SLIDING:
                past = (past[0][:, cached - kept :], past[1][:, cached - kept :])
            h, kv = layer(h, ropes[kind], mask, pos, is_canvas, past)
            if cache is not None and canvas == 0:
                cache.append(i, kv)
        if cache is not None and canvas == 0:
            cache.positions = k_pos
        if not compute_logits:
            return None
        logits = self.lm_head(self.model.norm(h)).float()
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else cap * torch.tanh(logits / cap)
