"""LLaDA2 (`LLaDA2MoeModelLM`, `llada2_moe`): the LLaDA-2.0/2.1 MoE backbone as a block-diffusion model.

- attention: one fused `query_key_value` projection split into q / k / v heads, per-head RMSNorm on q
  and k before RoPE, partial rotary (rotate-half within the first `rotary_dim` dims of each head, the
  rest pass through; inverse frequencies over `rotary_dim`), scale 1/sqrt(head_dim), output `dense`.
- MLP: layers below `first_k_dense_replace` are dense SwiGLU; the others are the sigmoid-routed,
  group-limited MoE of `models/moe.py` plus the shared expert(s).
- Embeddings `model.word_embeddings` (no scaling), final `model.norm`, untied `lm_head`.
- The optional ORL adapter (`model.residual_adapter.*`, DESIGN §3.1) as in QwenDLM.

Per-expert checkpoint tensors (`mlp.experts.E.{gate,up,down}_proj.weight`) load into the stacked
expert parameters through `checkpoint_slices`.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.attention import AttnContext, block_attention
from dlmrt.models.layers import RMSNorm, SwiGLU, attend_arena, rope_cos_sin
from dlmrt.models.llada2_config import LLaDA2Config
from dlmrt.models.moe import SparseMoE, stacked_slices
from dlmrt.models.residual import ResidualAdapter
from dlmrt.ops.reference import rotate


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] dims of x [rows, heads, head_dim]; rest unchanged."""
    dim = cos.shape[-1]
    return torch.cat((rotate(x[..., :dim], cos, sin), x[..., dim:]), dim=-1)


class Attention(nn.Module):
    """Fused-QKV GQA with QK RMSNorm and partial RoPE; writes K/V to the arena when given one."""

    def __init__(self, cfg: LLaDA2Config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        out = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(cfg.hidden_size, out, bias=False)
        self.query_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.key_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.dense = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5

    def _norm_rope(self, x: torch.Tensor, norm: RMSNorm, rope) -> torch.Tensor:
        rows, heads, dim = x.shape
        x = norm(x.reshape(rows * heads, dim)).view(rows, heads, dim)
        return partial_rope(x, *rope).transpose(0, 1)  # [heads, rows, dim]

    def forward(self, x: torch.Tensor, rope, ctx: AttnContext) -> torch.Tensor:
        rows = x.shape[0]
        qkv = self.query_key_value(x).view(rows, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split((self.heads, self.kv_heads, self.kv_heads), dim=1)
        q = self._norm_rope(q, self.query_layernorm, rope)
        k = self._norm_rope(k, self.key_layernorm, rope)
        v = v.transpose(0, 1)
        pos = ctx.positions
        if ctx.kv is None:
            out = block_attention(q, k, v, pos, pos, ctx.block_size, self.scale, ctx.mask)
        else:
            layer_k, layer_v = ctx.kv.k[self.layer_idx], ctx.kv.v[self.layer_idx]
            layer_k.index_copy_(1, pos, k.to(layer_k.dtype))
            layer_v.index_copy_(1, pos, v.to(layer_v.dtype))
            out = attend_arena(q, layer_k, layer_v, ctx, self.scale)
        return self.dense(out.transpose(0, 1).reshape(rows, -1))


class DecoderLayer(nn.Module):
    """Pre-norm: r += attention(norm(r)); r += mlp(norm(r)); residual adds fused into the norms."""

    def __init__(self, cfg: LLaDA2Config, layer_idx: int) -> None:
        super().__init__()
        self.attention = Attention(cfg, layer_idx)
        dense = layer_idx < cfg.first_k_dense_replace
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size) if dense else SparseMoE(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, residual, rope, ctx: AttnContext):
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        x, residual = self.post_attention_layernorm(self.attention(x, rope, ctx), residual)
        return self.mlp(x), residual


class Backbone(nn.Module):
    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_adapter = (
            ResidualAdapter(cfg.hidden_size, cfg.residual) if cfg.residual is not None else None
        )


class LLaDA2(nn.Module):
    """forward(ids, ctx, z, receives) -> logits [rows, vocab] (None for a KV-only pass).

    Same contract as `QwenDLM`: without `z` every row is clean context; with `z`, the last
    z.shape[0] rows are the block being denoised and get h = post(E[x] + alpha * m * g(z)).
    """

    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def checkpoint_slices(self) -> dict[str, tuple[str, int]]:
        """Stored tensor name -> (stacked parameter, index): the per-expert checkpoint tensors."""
        return stacked_slices(self)

    def fuse_projections(self) -> None:
        """gate/up as one GEMM in the dense layers, shared experts and the adapter. After loading."""
        for module in self.modules():
            if isinstance(module, SwiGLU):
                module.fuse()

    def tie_lm_head(self) -> None:
        self.lm_head.weight = self.model.word_embeddings.weight

    @property
    def embed_table(self) -> torch.Tensor:
        return self.model.word_embeddings.weight

    @property
    def adapter(self) -> ResidualAdapter | None:
        return self.model.residual_adapter

    def forward(
        self,
        input_ids: torch.Tensor,  # [rows]
        ctx: AttnContext,
        z: torch.Tensor | None = None,  # [n, hidden] pre-adapter residual of the last n rows
        receives: torch.Tensor | None = None,  # [n] bool: rows that get alpha * g(z)
        compute_logits: bool = True,
        last_logits: int | None = None,  # n: logits of the last n rows only
    ) -> torch.Tensor | None:
        h = self.model.word_embeddings(input_ids)
        if z is not None and self.adapter is not None:
            h = self.adapter.inject_tail(h, z, receives)
        rope = rope_cos_sin(ctx.positions, self.cfg.rotary_dim, self.cfg.rope_theta, h.dtype)
        residual = None
        for layer in self.model.layers:
            h, residual = layer(h, residual, rope, ctx)
        if not compute_logits:
            return None
        if last_logits is not None:
            h, residual = h[-last_logits:], residual[-last_logits:]
        return self.lm_head(self.model.norm(h, residual)[0])
