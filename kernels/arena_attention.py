"""Attention of one block's rows over the KV arena, with the visible length read on the device.

Every query row of a denoising round (or commit pass) sees the same keys: arena rows [0, kv_end),
i.e. the committed prefix plus the block itself (bidirectional). kv_end lives in device memory, so
one captured CUDA graph serves every block. Flash-style online softmax, fp32 accumulation; grouped
query heads share their KV head. Torch twin: `dlmrt.ops.reference.arena_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st)
        for m, n, w, st in (
            (64, 64, 4, 2),
            (32, 64, 4, 3),
            (64, 32, 4, 3),
            (128, 64, 8, 2),
            (32, 32, 4, 2),
        )
    ],
    key=["rows", "HEAD_DIM", "IEEE", "GROUPS"],
)
@triton.jit
def _arena_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    kv_end_ptr,
    scale,
    stride_qh,
    stride_qm,
    stride_kh,
    stride_kn,
    stride_vh,
    stride_vn,
    stride_oh,
    stride_om,
    rows,
    GROUPS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid_m, head = tl.program_id(0), tl.program_id(1)
    kv_head = head // GROUPS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=offs_m[:, None] < rows,
        other=0.0,
    )
    kv_end = tl.load(kv_end_ptr).to(tl.int32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_base, v_base = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
    for start in range(0, kv_end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        valid = offs_n < kv_end
        k = tl.load(
            k_base + offs_n[:, None] * stride_kn + offs_d[None, :], mask=valid[:, None], other=0.0
        )
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + offs_n[:, None] * stride_vn + offs_d[None, :], mask=valid[:, None], other=0.0
        )
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=offs_m[:, None] < rows,
    )


def arena_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, arena, head_dim] (one layer of the arena)
    v: torch.Tensor,  # [kv_heads, arena, head_dim]
    kv_end: torch.Tensor,  # [] int64 on the device: keys [0, kv_end) are visible
    scale: float,
) -> torch.Tensor:  # [heads, rows, head_dim]
    heads, rows, head_dim = q.shape
    # Written row-major [rows, heads, head_dim], returned as a [heads, rows, head_dim] view: the
    # caller's transpose(0, 1).reshape(rows, -1) for o_proj is then free.
    out = torch.empty((rows, heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)

    def grid(meta):
        return (triton.cdiv(rows, meta["BLOCK_M"]), heads)

    _arena_attention_kernel[grid](
        q,
        k,
        v,
        out,
        kv_end,
        scale,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        rows,
        GROUPS=heads // k.shape[0],
        HEAD_DIM=head_dim,
        IEEE=q.dtype == torch.float32,
    )
    return out
