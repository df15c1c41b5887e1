"""MoE routing, one program per row, the whole expert row in registers (E <= a few hundred).

`moe_route_grouped`: LLaDA2's sigmoid + expert bias + group-limited top-k; `moe_route_softmax`:
DiffusionGemma's softmax top-k with per-expert scale. Torch twins: `dlmrt.ops.reference`.
Top-k is k rounds of (max, then the lowest index holding it): the twins' `stable=True` tie rule
(`topk_first`), so selections agree exactly whenever both see the same scores. Weights agree to fp32 rounding
(the k-sum's order and exp/sigmoid may differ from torch by an ulp). No host sync: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt

_BIG = tl.constexpr(1 << 30)  # globals read inside @triton.jit must be constexpr


@triton.jit
def _pick(vals, ids, taken, BIG: tl.constexpr):
    """(id, new taken): the largest value not yet taken, lowest id among equals (-inf included)."""
    best = tl.max(tl.where(taken, float("-inf"), vals))
    pick = tl.min(tl.where((vals == best) & ~taken, ids, BIG))
    return pick, taken | (ids == pick)


@triton.jit
def _route_grouped_kernel(
    logits_ptr,
    bias_ptr,
    w_ptr,
    idx_ptr,
    stride_row,
    scaling,
    PER: tl.constexpr,  # experts per group
    G: tl.constexpr,
    G_PAD: tl.constexpr,
    PER_PAD: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, PER_PAD)
    valid = (g[:, None] < G) & (j[None, :] < PER)
    e = g[:, None] * PER + j[None, :]  # [G_PAD, PER_PAD] expert ids
    x = tl.load(logits_ptr + row * stride_row + e, mask=valid, other=0.0).to(tl.float32)
    scores = 1.0 / (1.0 + tl.exp(-x))
    biased = scores
    if HAS_BIAS:
        biased = scores + tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
    biased = tl.where(valid, biased, float("-inf"))
    # group score = top-2 sum: the max, plus the max without the max's first occurrence
    m1 = tl.max(biased, axis=1)
    first = tl.min(tl.where(biased == m1[:, None], j[None, :], PER_PAD), axis=1)
    m2 = tl.max(tl.where(j[None, :] == first[:, None], float("-inf"), biased), axis=1)
    group_scores = m1 + m2
    keep = g >= G  # padding groups count as taken, then are dropped below
    for _ in tl.static_range(TOPK_GROUP):
        _, keep = _pick(group_scores, g, keep, _BIG)
    keep = keep & (g < G)
    masked = tl.where(keep[:, None], biased, float("-inf"))
    taken = ~valid
    kk = tl.arange(0, K_PAD)
    index = tl.zeros([K_PAD], dtype=tl.int64)
    weights = tl.zeros([K_PAD], dtype=tl.float32)
    for t in tl.static_range(TOP_K):
        pick, taken = _pick(masked, e, taken, _BIG)
        # `valid`: a padding column's id aliases the next group's first expert
        w = tl.sum(tl.sum(tl.where((e == pick) & valid, scores, 0.0), axis=1), axis=0)
        index = tl.where(kk == t, pick, index)
        weights = tl.where(kk == t, w, weights)
    if NORM:
        weights = weights / (tl.sum(weights) + 1e-20)
    out = row * TOP_K + kk
    tl.store(idx_ptr + out, index, mask=kk < TOP_K)
    tl.store(w_ptr + out, weights * scaling, mask=kk < TOP_K)


def moe_route_grouped(
    logits: torch.Tensor,
    expert_bias: torch.Tensor | None,
    n_group: int,
    topk_group: int,
    top_k: int,
    norm_topk_prob: bool,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, E] -> (weights [rows, top_k] fp32, index [rows, top_k] int64)."""
    rows, experts = logits.shape
    per = experts // n_group
    weights = torch.empty((rows, top_k), dtype=torch.float32, device=logits.device)
    index = torch.empty((rows, top_k), dtype=torch.int64, device=logits.device)
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    _route_grouped_kernel[(rows,)](
        logits,
        logits if expert_bias is None else expert_bias,
        weights,
        index,
        logits.stride(0),
        float(scaling),
        PER=per,
        G=n_group,
        G_PAD=triton.next_power_of_2(n_group),
        PER_PAD=triton.next_power_of_2(per),
        TOPK_GROUP=topk_group,
        TOP_K=top_k,
        K_PAD=max(2, triton.next_power_of_2(top_k)),  # no 1-wide vectors
        HAS_BIAS=expert_bias is not None,
        NORM=norm_topk_prob and top_k > 1,
        num_warps=4,
        **pdl.launch(),
    )
    return weights, index


@triton.jit
def _route_softmax_kernel(
    logits_ptr,
    scale_ptr,
    w_ptr,
    idx_ptr,
    stride_row,
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    TOP_K: tl.constexpr,
    K_PAD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_PAD)
    valid = e < E
    x = tl.load(logits_ptr + row * stride_row + e, mask=valid, other=float("-inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x))
    p = p / tl.sum(p)
    taken = ~valid
    kk = tl.arange(0, K_PAD)
    index = tl.zeros([K_PAD], dtype=tl.int64)
    weights = tl.zeros([K_PAD], dtype=tl.float32)
    for t in tl.static_range(TOP_K):
        pick, taken = _pick(x, e, taken, _BIG)  # on the logits: exact, as the twin
        index = tl.where(kk == t, pick, index)
        weights = tl.where(kk == t, tl.sum(tl.where(e == pick, p, 0.0)), weights)
    weights = weights / tl.sum(weights)
    keep = kk < TOP_K
    scale = tl.load(scale_ptr + index, mask=keep, other=0.0).to(tl.float32)
    tl.store(idx_ptr + row * TOP_K + kk, index, mask=keep)
    tl.store(w_ptr + row * TOP_K + kk, weights * scale, mask=keep)


def moe_route_softmax(
    logits: torch.Tensor, per_expert_scale: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, E] -> (weights [rows, top_k] fp32, index [rows, top_k] int64)."""
    rows, experts = logits.shape
    weights = torch.empty((rows, top_k), dtype=torch.float32, device=logits.device)
    index = torch.empty((rows, top_k), dtype=torch.int64, device=logits.device)
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    _route_softmax_kernel[(rows,)](
        logits,
        per_expert_scale,
        weights,
        index,
        logits.stride(0),
        E=experts,
        E_PAD=triton.next_power_of_2(experts),
        TOP_K=top_k,
        K_PAD=max(2, triton.next_power_of_2(top_k)),  # no 1-wide vectors
        num_warps=4,
        **pdl.launch(),
    )
    return weights, index
