"""LLaDA2 (`LLaDA2MoeModelLM`, `llada2_moe`): the LLaDA-2.0/2.1 MoE backbone as a block-diffusion model.

- attention: one fused `query_key_value` projection split into q / k / v heads, per-head RMSNorm on q
  and k before RoPE, partial rotary (rotate-half within the first `rotary_dim` dims of each head, the
  rest pass through; inverse frequencies over `rotary_dim`), scale 1/sqrt(head_dim), output `dense`.
- MLP: layers below `first_k_dense_replace` are dense SwiGLU; the others are the sigmoid-routed,
  group-limited MoE of `models/moe.py` plus the shared expert(s).
- Embeddings `model.word_embeddings` (no scaling), final `model.norm`, untied `lm_head`.
- The optional ORL adapter (`model.residual_adapter.*`, `docs/checkpoint-format.md`) as in QwenDLM.

Per-expert checkpoint tensors (`mlp.experts.E.{gate,up,down}_proj.weight`) load into the stacked
expert parameters through `checkpoint_slices`.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.attention import AttnContext
from dlmrt.models.block_lm import BlockLM
from dlmrt.models.layers import RMSNorm, SwiGLU, attend_qkv
from dlmrt.models.llada2_config import LLaDA2Config
from dlmrt.models.moe import SparseMoE, stacked_slices


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

    def forward(self, x: torch.Tensor, rope, ctx: AttnContext) -> torch.Tensor:
        qkv = self.query_key_value(x)  # x may be an activation in a format: read rows off qkv
        rows = qkv.shape[0]
        qkv = qkv.view(rows, self.heads + 2 * self.kv_heads, self.head_dim)
        norms = (self.query_layernorm, self.key_layernorm)
        out = attend_qkv(qkv, self.kv_heads, norms, rope, ctx, self.layer_idx, self.scale)
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


class LLaDA2(BlockLM):
    """LLaDA2 layers (dense, then MoE) under the shared block-diffusion forward (`BlockLM`);
    partial RoPE over the first `rotary_dim` dims of each head."""

    EMBED = "word_embeddings"

    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__(cfg, DecoderLayer)

    @property
    def rotary_dim(self) -> int:
        return self.cfg.rotary_dim

    def checkpoint_slices(self) -> dict[str, tuple[str, int]]:
        """Stored tensor name -> (stacked parameter, index): the per-expert checkpoint tensors."""
        return stacked_slices(self)
