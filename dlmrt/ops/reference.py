"""Plain-PyTorch twins of every custom op: the spec the Triton kernels are tested against (CPU-capable)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def write_rows(dest: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> None:
    """dest.index_copy_(dim, index, src) rounded to dest's dtype; an FP8 arena through a byte
    view (torch has no FP8 index_copy_)."""
    src = src.to(dest.dtype)
    if dest.element_size() == 1 and dest.is_floating_point():
        dest.view(torch.uint8).index_copy_(dim, index, src.view(torch.uint8))
    else:
        dest.index_copy_(dim, index, src)


def select_rows(src: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """src.index_select(dim, index), also for FP8 (through a byte view)."""
    if src.element_size() == 1 and src.is_floating_point():
        return src.view(torch.uint8).index_select(dim, index).view(src.dtype)
    return src.index_select(dim, index)


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
    k, v = k.to(q.dtype), v.to(q.dtype)  # an FP8 arena is read dequantized
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


def partial_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`rotate` on the first cos.shape[-1] dims of each head of x; the rest pass through
    (LLaDA2's partial rotary; cos as wide as the head: plain `rotate`)."""
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return rotate(x, cos, sin)
    return torch.cat((rotate(x[..., :dim], cos, sin), x[..., dim:]), dim=-1)


def qk_norm_rope(
    x: torch.Tensor,  # [rows, heads, head_dim]
    weight: torch.Tensor,
    cos: torch.Tensor,  # [rows, rot <= head_dim]
    sin: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,  # [heads, L, head_dim]
    positions: torch.Tensor | None = None,  # [rows]
) -> torch.Tensor:
    """Per-head RMSNorm, then RoPE; returns / writes head-major [heads, rows or L, head_dim]."""
    y = partial_rotate(rms_norm(x, weight, eps), cos, sin).transpose(0, 1)
    if out is None:
        return y.contiguous()
    write_rows(out, 1, positions, y)  # an FP8 arena: rounded from the dtype
    return out


def qkv_norm_rope(
    qkv: torch.Tensor,  # [rows, heads + 2 kv_heads, head_dim]
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_arena: torch.Tensor,  # [kv_heads, L, head_dim]
    v_arena: torch.Tensor,
    positions: torch.Tensor,  # [rows]
) -> torch.Tensor:
    """An arena pass's q|k|v: returns q normed and rotated, head-major [heads, rows, head_dim];
    writes k (normed, rotated) and v at their arena rows."""
    kv = k_arena.shape[0]
    q, k, v = qkv.split((qkv.shape[1] - 2 * kv, kv, kv), dim=1)
    qk_norm_rope(k, k_weight, cos, sin, eps, k_arena, positions)
    write_rows(v_arena, 1, positions, v.transpose(0, 1))
    return qk_norm_rope(q, q_weight, cos, sin, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up [rows, 2n], gate columns first."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def softmax_probs(
    logits: torch.Tensor, log_z: torch.Tensor, temperature: float, dtype: torch.dtype
) -> torch.Tensor:
    """exp(logits / T - log_z) in `dtype` (the probabilities behind the residual z = p @ E)."""
    return torch.exp(logits.float() / temperature - log_z.unsqueeze(-1)).to(dtype)


def topk_first(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest along the last dim, descending; equal values: the LOWEST index first.

    torch.topk does not define its tie order (on the CPU it is neither lowest nor highest id, and
    CUDA differs); a stable descending sort does, and the routing kernels follow this rule.
    """
    values, index = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], index[..., :k]


def _topk(x: torch.Tensor, k: int, stable: bool) -> torch.Tensor:
    return topk_first(x, k)[1] if stable else x.topk(k, dim=-1).indices


def moe_route_grouped(
    logits: torch.Tensor,  # [rows, experts] router logits (fp32)
    expert_bias: torch.Tensor | None,  # [experts], selection only
    n_group: int,
    topk_group: int,
    top_k: int,
    norm_topk_prob: bool,
    scaling: float,
    stable: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA2's sigmoid, group-limited routing -> (weights [rows, k] fp32, index [rows, k] int64).

    scores = sigmoid(logits) in fp32; biased = scores + expert_bias; a group's score is the sum of
    its top-2 biased scores; the `topk_group` best groups are kept; index = top-k of biased over the
    kept groups' experts; weights = unbiased scores at index, renormalised (+1e-20) only when
    top_k > 1 and norm_topk_prob, times `scaling`. Ties: torch.topk's order, as the HF reference
    (what the CPU runs: bit-identical to it); `stable=True`: lowest group / expert id first, the
    rule the Triton kernel follows (its parity tests compare against this).
    """
    scores = torch.sigmoid(logits.float())
    biased = scores if expert_bias is None else scores + expert_bias.float()
    rows, experts = biased.shape
    grouped = biased.view(rows, n_group, experts // n_group)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # [rows, n_group]; values: no tie issue
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, _topk(group_scores, topk_group, stable), True)
    allowed = keep.unsqueeze(-1).expand_as(grouped).reshape(rows, experts)
    index = _topk(biased.masked_fill(~allowed, float("-inf")), top_k, stable)
    weights = scores.gather(1, index)
    if norm_topk_prob and top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, index


def moe_route_softmax(
    logits: torch.Tensor,  # [rows, experts] router logits (model dtype)
    per_expert_scale: torch.Tensor,  # [experts]
    top_k: int,
    stable: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DiffusionGemma's routing -> (weights [rows, k] fp32, index [rows, k] int64).

    probs = softmax(logits) in fp32; index = top-k of probs with torch.topk's ties, as transformers
    (the CPU's bf16 parity with it depends on that order); weights = probs at index / their sum,
    times per_expert_scale[index]. `stable=True`, the Triton kernel's rule: top-k of the logits
    (softmax is monotonic: the same set, decided on exact values), lowest expert id first on ties.
    """
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    if stable:
        index = topk_first(logits.float(), top_k)[1]
    else:
        index = probs.topk(top_k, dim=-1).indices
    weights = probs.gather(-1, index)
    weights = weights / weights.sum(-1, keepdim=True)
    return weights * per_expert_scale[index], index


ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}


def moe_mlp(
    x: torch.Tensor,  # [rows, hidden]
    weights: torch.Tensor,  # [rows, k] fp32 routing weights
    index: torch.Tensor,  # [rows, k] expert ids
    gate_up: torch.Tensor | tuple[torch.Tensor, torch.Tensor],  # [E, 2I, H] | 2 x [E, I, H]
    down: torch.Tensor,  # [experts, hidden, inter]
    activation: str,  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    sum_dtype: torch.dtype | None = None,
    hidden_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """sum_j weights[r, j] * down_e(act(gate_e x_r) * up_e x_r), e = index[r, j]; [rows, hidden].
    `hidden_hook` (NVFP4 W4A4 emulation) maps each act(gate) * up before its down projection.

    A loop over the active experts (ascending id) with gather / index_add, as the HF references.
    A fused gate_up (gate rows first) is one linear per expert, a (gate, up) pair two. Each weighted
    expert output is cast to `sum_dtype` and accumulated in it (default: fp32, or fp64 for fp64 x;
    DiffusionGemma passes x.dtype, as transformers), then cast to x's dtype.
    """
    act = ACTIVATIONS[activation]
    acc = sum_dtype or torch.promote_types(x.dtype, torch.float32)
    out = torch.zeros(x.shape, dtype=acc, device=x.device)
    for e in index.unique().tolist():  # host sync: eager reference only
        rows, slot = torch.where(index == e)
        xe = x[rows]
        if isinstance(gate_up, tuple):
            gate, up = F.linear(xe, gate_up[0][e]), F.linear(xe, gate_up[1][e])
        else:
            gate, up = F.linear(xe, gate_up[e]).chunk(2, dim=-1)
        h = act(gate) * up
        y = F.linear(h if hidden_hook is None else hidden_hook(h), down[e])
        out.index_add_(0, rows, (y * weights[rows, slot, None]).to(acc))
    return out.to(x.dtype)
