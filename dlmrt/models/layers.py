"""Shared transformer layers: RMSNorm, RoPE, GQA attention with QK-norm, SwiGLU MLP, decoder layer.

Single-device and serving-agnostic: per-forward metadata arrives in one `AttnContext`. Numerics
follow transformers' Qwen3 (norms in fp32, RoPE tables in fp32 cast to the activation dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt import ops
from dlmrt.attention import AttnContext, block_attention


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Non-affine RMSNorm computed in fp32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    """x / rms(x) * weight (plain gain, not 1 + w)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_norm(x, self.eps)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [rows, head_dim] for full-dimension rotate-half RoPE."""
    idx = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
    inv_freq = 1.0 / (theta ** (idx / head_dim))
    freqs = positions.float().unsqueeze(-1) * inv_freq.unsqueeze(0)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [rows, heads, head_dim]; cos/sin: [rows, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


class Attention(nn.Module):
    """GQA self-attention with per-head QK RMSNorm before RoPE; writes K/V to the arena if given."""

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.q_size, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.kv_size, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.kv_size, bias=False)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ctx: AttnContext
    ) -> torch.Tensor:
        rows = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(rows, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(rows, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(rows, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, rows, d]
        if ctx.kv is None:
            keys, values, k_pos = k, v, ctx.positions
        else:
            layer_k, layer_v = ctx.kv.k[self.layer_idx], ctx.kv.v[self.layer_idx]
            layer_k.index_copy_(1, ctx.positions, k)
            layer_v.index_copy_(1, ctx.positions, v)
            if ctx.kv_end is not None:
                out = ops.arena_attention(q, layer_k, layer_v, ctx.kv_end, self.scale)
                return self.o_proj(out.transpose(0, 1).reshape(rows, -1))
            n = layer_k.shape[1] if ctx.kv_len is None else ctx.kv_len
            keys, values = layer_k[:, :n], layer_v[:, :n]
            k_pos = torch.arange(n, device=x.device)
        out = block_attention(q, keys, values, ctx.positions, k_pos, ctx.block_size, self.scale)
        return self.o_proj(out.transpose(0, 1).reshape(rows, -1))


class SwiGLU(nn.Module):
    """down(SiLU(gate(x)) * up(x)), bias-free."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: h += attn(norm(h)); h += mlp(norm(h))."""

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ctx: AttnContext
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, ctx)
        return h + self.mlp(self.post_attention_layernorm(h))
