"""Attention of query rows over the KV arena under the block-causal rule, lengths read on the device.

A query at absolute position p sees arena rows [0, (p // B + 1) * B): the committed prefix plus
its whole block (bidirectional). Positions live in device memory, so one captured CUDA graph serves
every block, and the same kernel runs prefill (many blocks), denoising rounds and commit passes.
Flash-style online softmax with fp32 accumulation (the tile step: kernels/online_softmax.py); the
key loop of a tile of rows stops at the furthest end any of its rows can see, and the keys every
row of the tile sees (a round's whole range) run without the visibility mask. Few rows over a
long arena (LLaDA's 32-row rounds) go to the split-KV kernel instead
(kernels/arena_attention_split.py), picked by shape on the host.
Torch twin: `dlmrt.ops.reference.arena_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .arena_attention_split import arena_attention_split, pick_splits
from .device import HOPPER_SMEM, shared_memory, sm_count
from .online_softmax import LOG2E, key_range

# No autotuner: a first request of a new prompt length must not stop to benchmark configs (issue
# 23 measured 0.69 s inside one request). The tile is fixed per shape class, from the query rows
# and the head dim: a round or a joint pass (<= 32 rows) takes a 32-row tile so few rows are
# padding; prefill and wider rounds take 64-row tiles; 128-key tiles for head dims <= 128 (H200,
# benchmarks/kernels/attention_tiles.py: 32 rows 23.1 -> 20.9 us per layer at 1k keys, 80.7 -> 67.2 at
# 4k; 256 rows 21.7 -> 20.2 and 65.1 -> 57.9; 128-row tiles were 2x slower), 32-key tiles for
# head dims >= 256 so K/V tiles fit in shared memory. fp32 (exact "ieee" dots, used by parity
# tests) keeps one small tile: large fp32 tiles spill and take ptxas minutes to compile.
SMALL_ROWS = 32
# Shared memory per block a 128-key tile needs (3 stages of bf16 K and V at head dim 128 and a
# 64-row Q: ~208 KB; H100 / H200 give 227 KB); GPUs with less (A100 164 KB, Ada 99 KB) keep 64.
BIG_TILE_SMEM = 210_000


def tile_config(
    rows: int, head_dim: int, ieee: bool, smem: int = HOPPER_SMEM
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a launch: a pure function of the shape class
    and the device's shared memory per block (`smem`, bytes)."""
    if ieee:
        return 32, 32, 4, 2
    wide = head_dim <= 128 and smem >= BIG_TILE_SMEM
    block_n = 32 if head_dim >= 256 else (128 if wide else 64)
    if rows <= SMALL_ROWS:
        return 32, block_n, 4, 3
    return 64, block_n, 4, 2 if head_dim >= 256 else 3


@triton.jit
def _arena_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, pos_ptr, block_size, qk_scale,
    stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
    rows,
    GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    IEEE: tl.constexpr, WHILE: tl.constexpr = False, PDL: tl.constexpr = False,
    WS: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    pid_m, head = tl.program_id(0), tl.program_id(1)
    kv_head = head // GROUPS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < rows
    q = tl.load(
        q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    pos = tl.load(pos_ptr + offs_m, mask=row_ok, other=0)
    row_end = ((pos // block_size + 1) * block_size).to(tl.int32)
    row_end = tl.where(row_ok, row_end, 0)
    tile_end = tl.max(row_end, 0)
    # Keys [0, full_end) are seen by every row of the tile (whole key tiles only): no mask there.
    # A round's rows share one block: all its key tiles but a partial last one (a block end off
    # the BLOCK_N grid); prefill tiles mask from their first row's end, rounded down to a tile.
    full_end = (tl.min(tl.where(row_ok, row_end, tile_end), 0) // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    k_rows = k_ptr + kv_head * stride_kh + offs_d[None, :]
    v_rows = v_ptr + kv_head * stride_vh + offs_d[None, :]
    acc, m_i, l_i = key_range(acc, m_i, l_i, 0, full_end, q, k_rows, v_rows,
                              stride_kn, stride_vn, row_end, tile_end, qk_scale, False, BLOCK_N,
                              IEEE, WHILE, WS)  # fmt: skip
    acc, m_i, l_i = key_range(acc, m_i, l_i, full_end, tile_end, q, k_rows, v_rows, stride_kn,
                              stride_vn, row_end, tile_end, qk_scale, True, BLOCK_N, IEEE,
                              WHILE)  # fmt: skip
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def arena_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, arena, head_dim] (one layer of the arena)
    v: torch.Tensor,  # [kv_heads, arena, head_dim]
    positions: torch.Tensor,  # [rows] int64 absolute positions of the query rows (ascending)
    block_size: int,
    scale: float,
    splits: int | None = None,
    tiles: tuple[int, int, int, int] | None = None,
    ws: bool = False,
) -> torch.Tensor:  # [heads, rows, head_dim]
    """`splits` None: picked by shape (`pick_splits`: few rows over a long arena split the keys
    across programs, kernels/arena_attention_split.py); 1: this one-pass kernel. `tiles`
    (BLOCK_M, BLOCK_N, num_warps, num_stages) overrides `tile_config` (benchmarks/kernels/attention_tiles.py);
    `ws`: Triton's warp-specialized key loop (benchmarks/kernels/attention_peers.py)."""
    heads, rows, head_dim = q.shape
    if splits is None:
        splits = pick_splits(rows, heads, k.shape[1], sm_count(q.device) if q.is_cuda else 132)
    if splits > 1:
        return arena_attention_split(q, k, v, positions, block_size, scale, splits)
    # Written row-major [rows, heads, head_dim], returned as a [heads, rows, head_dim] view: the
    # caller's transpose(0, 1).reshape(rows, -1) for o_proj is then free.
    out = torch.empty((rows, heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)

    ieee = q.dtype == torch.float32
    block_m, block_n, warps, stages = tiles or tile_config(
        rows, head_dim, ieee, shared_memory(q.device)
    )
    grid = (triton.cdiv(rows, block_m), heads)
    _arena_attention_kernel[grid](
        q, k, v, out, positions, block_size, scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), rows,
        GROUPS=heads // k.shape[0], BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim,
        IEEE=ieee, WHILE=not q.is_cuda, WS=ws, num_warps=warps, num_stages=stages,
        **pdl.launch(),
    )  # fmt: skip
    return out
