"""Plain-PyTorch twins of every custom op: the spec the Triton kernels are tested against (CPU-capable)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def arena_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, arena, head_dim]
    v: torch.Tensor,  # [kv_heads, arena, head_dim]
    positions: torch.Tensor,  # [rows] absolute positions of the query rows
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """Block-causal attention over the whole arena: row p sees keys [0, (p // B + 1) * B)."""
    keys = torch.arange(k.shape[1], device=k.device)
    mask = (keys // block_size).unsqueeze(0) <= (positions // block_size).unsqueeze(1)
    groups = q.shape[0] // k.shape[0]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def token_stats(
    logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [rows, vocab] -> argmax, its probability, entropy (nats), log_z of softmax(logits / T)."""
    x = logits.float()
    if temperature > 0:
        x = x / temperature
    log_z = torch.logsumexp(x, dim=-1)
    p = torch.exp(x - log_z.unsqueeze(-1))
    # p * x is 0 where p underflows to 0, also for -inf logits (0 * -inf would be nan).
    entropy = log_z - torch.where(p > 0, p * x, 0.0).sum(-1)
    token = torch.argmax(x, dim=-1)
    confidence = torch.exp(x.gather(-1, token.unsqueeze(-1)).squeeze(-1) - log_z)
    return token, confidence, entropy, log_z


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Non-affine RMSNorm computed in fp32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm roundings: x * (mean(x^2) + eps)^-0.5 * weight all in fp32, one cast at the
    end (Qwen's `rms_norm` casts before the gain). weight None: no gain."""
    xf = x.float()
    y = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return (y if weight is None else y * weight.float()).type_as(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / rms(x)), the normalised row cast to x's dtype first (as transformers)."""
    return weight * rms_normalize(x, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    total = x + residual
    return rms_norm(total, weight, eps), total


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [rows, heads, head_dim] in x's dtype (cos, sin [rows, head_dim])."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def qk_norm_rope(
    x: torch.Tensor,  # [rows, heads, head_dim]
    weight: torch.Tensor,
    cos: torch.Tensor,  # [rows, head_dim]
    sin: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,  # [heads, L, head_dim]
    positions: torch.Tensor | None = None,  # [rows]
) -> torch.Tensor:
    """Per-head RMSNorm, then RoPE; returns / writes head-major [heads, rows or L, head_dim]."""
    y = rotate(rms_norm(x, weight, eps), cos, sin).transpose(0, 1)
    if out is None:
        return y.contiguous()
    out.index_copy_(1, positions, y)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up [rows, 2n], gate columns first."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def softmax_probs(
    logits: torch.Tensor, log_z: torch.Tensor, temperature: float, dtype: torch.dtype
) -> torch.Tensor:
    """exp(logits / T - log_z) in `dtype` (the probabilities behind the residual z = p @ E)."""
    return torch.exp(logits.float() / temperature - log_z.unsqueeze(-1)).to(dtype)


def moe_swiglu(
    x: torch.Tensor,  # [rows, hidden]
    weights: torch.Tensor,  # [rows, k] fp32 routing weights
    index: torch.Tensor,  # [rows, k] expert ids
    gate: torch.Tensor,  # [experts, inter, hidden]
    up: torch.Tensor,  # [experts, inter, hidden]
    down: torch.Tensor,  # [experts, hidden, inter]
) -> torch.Tensor:
    """sum_j weights[r, j] * down_e(SiLU(gate_e x_r) * up_e x_r), e = index[r, j]; [rows, hidden].

    A loop over the active experts (ascending id) with gather / index_add. The weighted sum is
    accumulated in fp32 (the routing weights' dtype, as the HF reference) and cast back to x's dtype.
    """
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 for an fp64 model
    out = torch.zeros(x.shape, dtype=acc, device=x.device)
    for e in index.unique().tolist():  # host sync: eager reference only
        rows, slot = torch.where(index == e)
        xe = x[rows]
        y = F.linear(F.silu(F.linear(xe, gate[e])) * F.linear(xe, up[e]), down[e])
        out.index_add_(0, rows, y.to(acc) * weights[rows, slot, None].to(acc))
    return out.to(x.dtype)
