"""Shared transformer layers: RMSNorm, RoPE, GQA attention with QK-norm, SwiGLU/GeGLU MLP, decoder layer.

Single-device and serving-agnostic: per-forward metadata arrives in one `AttnContext`. Numerics
follow transformers' Qwen3 (norms in fp32, RoPE tables in fp32 cast to the activation dtype).
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt import ops
from dlmrt.account import label
from dlmrt.attention import AttnContext, block_attention
from dlmrt.impls.dense import ProjectionConcat, SeparateGateUp, StackedGateUp, StackedProjection
from dlmrt.impls.norms import plain_norm
from dlmrt.impls.slot import set_slot


class RMSNorm(nn.Module):
    """x / rms(x) * weight (plain gain, not 1 + w); `forward(x, residual)` fuses the residual add.
    `impl` (dlmrt/impls/norms.py) runs it: plain, or with its output quantized for the GEMMs that
    consume it, as the loader chose."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.impl = plain_norm

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return self.impl(x, residual, self.weight, self.eps)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm (gain multiplied in fp32, see `ops.reference.gemma_rms_norm`); with_scale
    False: no weight (v_norm, the router's and self-conditioning's weightless norms)."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gemma_rms_norm(x, self.weight, self.eps)


def fuse_weights(*linears: nn.Linear) -> torch.Tensor | None:
    """Concatenate the linears' weights into one tensor; each linear keeps a view of its slice.

    One GEMM then computes all of them, while the state dict (and in-place edits such as the
    adapter rescale) still see the per-projection parameters. Call after loading. None, fusing
    nothing, when the weights lie on different devices: the projections then run unfused.
    """
    # under a deferred NVFP4 load (dlmrt/loading/deferred.py) only some projections may be
    # NVFP4, kept on meta beside allocated ones, and torch.cat cannot join the two
    if len({lin.weight.device for lin in linears}) > 1:
        return None
    fused = torch.cat([lin.weight.detach() for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[start : start + rows], requires_grad=False)
        start += rows
    return fused


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [rows, head_dim] for full-dimension rotate-half RoPE."""
    return proportional_rope_cos_sin(positions, head_dim, theta, 1.0, dtype)


def rope_tables(specs: dict, head_dims: dict[str, int], pos: torch.Tensor, dtype) -> dict:
    """(cos, sin) per attention kind, each with its own theta, rotary fraction and scaling
    (`specs`: kind -> RopeSpec; `head_dims`: kind -> its head width), e.g. DiffusionGemma's sliding
    and full layers; a kind no layer has, as in a model cut to fewer layers, is left out)."""
    return {
        kind: proportional_rope_cos_sin(
            pos, head_dims[kind], s.theta, s.rotary_factor, dtype, s.factor
        )
        for kind, s in specs.items()
        if kind in head_dims
    }


def proportional_rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    rotary_factor: float,
    dtype: torch.dtype,
    factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [rows, head_dim] for "proportional" rotate-half RoPE (Gemma 4 full layers).

    The first int(rotary_factor * head_dim // 2) frequencies are 1 / theta^(2i / head_dim), the
    exponent over the FULL head dim; the rest are 0 (cos 1, sin 0: those dims are not rotated).
    All frequencies are divided by `factor`. rotary_factor 1.0 is ordinary RoPE.
    """
    angles = int(rotary_factor * head_dim // 2)
    idx = torch.arange(0, 2 * angles, 2, dtype=torch.int64, device=positions.device).float()
    inv_freq = 1.0 / (theta ** (idx / head_dim))
    if angles < head_dim // 2:
        zeros = torch.zeros(head_dim // 2 - angles, device=positions.device)
        inv_freq = torch.cat((inv_freq, zeros))
    if factor != 1.0:
        inv_freq = inv_freq / factor
    freqs = positions.float().unsqueeze(-1) * inv_freq.unsqueeze(0)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def attend_arena(
    q: torch.Tensor, layer_k: torch.Tensor, layer_v: torch.Tensor, ctx: AttnContext, scale: float
) -> torch.Tensor:  # [heads, rows, head_dim]
    """q over one layer's KV arena after this pass's K/V were written into it.

    CUDA (kv_len None): visibility from the device-side positions, no host-side length. CPU: the
    first kv_len arena rows under the block-causal rule."""
    with label("attention", q, layer_k, layer_v, ctx.positions):
        if ctx.kv_len is None:
            return ops.arena_attention(
                q, layer_k, layer_v, ctx.positions, ctx.block_size, scale, ctx.one_block
            )
        n = ctx.kv_len
        keys = torch.arange(n, device=q.device)
        k, v = layer_k[:, :n].to(q.dtype), layer_v[:, :n].to(q.dtype)  # an FP8 arena: dequantized
        return block_attention(q, k, v, ctx.positions, keys, ctx.block_size, scale)


def attend_qkv(
    qkv: torch.Tensor,
    kv_heads: int,
    norms: tuple[RMSNorm, RMSNorm],
    rope: tuple[torch.Tensor, torch.Tensor],
    ctx: AttnContext,
    layer_idx: int,
    scale: float,
) -> torch.Tensor:  # [heads, rows, head_dim]
    """QK-normed, RoPE'd GQA attention of a fused q|k|v [rows, heads + 2 kv_heads, head_dim]
    (RoPE over the first rope[0].shape[-1] dims of a head; q and k norms share one eps).

    With an arena: q's norm + RoPE, k's norm + RoPE + arena write and v's arena write are one op
    (one launch on CUDA), then attention over the arena. Without (training, reference passes):
    block-causal attention over the pass's own rows."""
    q_norm, k_norm = norms
    if ctx.kv is not None:
        layer_k, layer_v = ctx.kv.k[layer_idx], ctx.kv.v[layer_idx]
        with label("qk_norm_rope", qkv):
            q = ops.qkv_norm_rope(
                qkv,
                q_norm.weight,
                k_norm.weight,
                *rope,
                q_norm.eps,
                layer_k,
                layer_v,
                ctx.positions,
            )
        return attend_arena(q, layer_k, layer_v, ctx, scale)
    q, k, v = qkv.split((qkv.shape[1] - 2 * kv_heads, kv_heads, kv_heads), dim=1)
    with label("qk_norm_rope", qkv):
        q = ops.qk_norm_rope(q, q_norm.weight, *rope, q_norm.eps)  # [heads, rows, d]
        k = ops.qk_norm_rope(k, k_norm.weight, *rope, k_norm.eps)
    pos = ctx.positions
    with label("attention", q, k, v, pos):
        return block_attention(q, k, v.transpose(0, 1), pos, pos, ctx.block_size, scale, ctx.mask)


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
        self.unfuse()

    def unfuse(self) -> None:
        """q|k|v as three GEMMs into one tensor (training; sharding re-slices the projections)."""
        set_slot(self, "qkv", ProjectionConcat((self.q_proj, self.k_proj, self.v_proj)))

    def fuse(self) -> None:
        if (fused := fuse_weights(self.q_proj, self.k_proj, self.v_proj)) is not None:
            set_slot(self, "qkv", StackedProjection(fused))

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ctx: AttnContext
    ) -> torch.Tensor:
        qkv = self.qkv(x)  # the `qkv` slot (dlmrt/impls): [rows, (heads + 2 kv_heads) head_dim]
        qkv = qkv.view(qkv.shape[0], self.heads + 2 * self.kv_heads, self.head_dim)
        norms = (self.q_norm, self.k_norm)
        out = attend_qkv(qkv, self.kv_heads, norms, rope, ctx, self.layer_idx, self.scale)
        return self.o_proj(out.transpose(0, 1).reshape(qkv.shape[0], -1))


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)), bias-free, act = SiLU; GeGLU: gelu_tanh. The first half is the
    `gate_up` slot (dlmrt/impls): two GEMMs, one once fused, or what the loader installed."""

    activation = "silu"

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.unfuse()

    def unfuse(self) -> None:
        set_slot(self, "gate_up", SeparateGateUp(self.gate_proj, self.up_proj, self.activation))

    def fuse(self) -> None:
        if (fused := fuse_weights(self.gate_proj, self.up_proj)) is not None:
            set_slot(self, "gate_up", StackedGateUp(fused, self.activation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up(x))


class GeGLU(SwiGLU):
    """down(gelu_tanh(gate(x)) * up(x)), bias-free (Gemma's gated MLP, `gelu_pytorch_tanh`)."""

    activation = "gelu_tanh"


class DecoderLayer(nn.Module):
    """Pre-norm block on a residual stream: r += attn(norm(r)); r += mlp(norm(r)).

    forward(h, residual) takes the previous layer's output h and the stream before it, and fuses
    each residual add into the following norm (residual None: h is the stream, first layer).
    """

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        rope: tuple[torch.Tensor, torch.Tensor],
        ctx: AttnContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = h, self.input_layernorm(h)
        else:
            x, residual = self.input_layernorm(h, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(x, rope, ctx), residual)
        return self.mlp(x), residual
