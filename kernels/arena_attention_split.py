"""Split-KV ("flash-decoding") arena attention: the keys of a tile of rows split across programs.

The same rule and interface as kernels/arena_attention.py (row p sees arena rows
[0, (p // B + 1) * B), positions on the device), for few query rows over a long arena, where one
program per (row tile, head) leaves most of the GPU idle: program (tile, head, s) reads only the
s-th of `splits` equal slices of the tile's visible keys (the slice bounds derived on the device
from the positions, so the grid is static and the launch capturable), and writes its unnormalised
partial output with its running max and sum (fp32; the max in log2 units, as in
kernels/online_softmax.py, which holds the tile step both arena kernels run). A second pass merges
the splits per row: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
Torch twin: `reference.arena_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .online_softmax import LOG2E, key_range


# Fixed tiles, no autotuner (a request must never stop to benchmark configs: issue 23); fp32
# (exact "ieee" dots, the parity tests) keeps one small tile: large fp32 tiles spill.
def _launch_tile(head_dim: int, ieee: bool) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of the split kernel."""
    if ieee:
        return 32, 4, 2
    return (32 if head_dim >= 256 else 64), 4, 3


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, ml_ptr, block_size, qk_scale,
    stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn,
    rows, heads,
    GROUPS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, IEEE: tl.constexpr, WHILE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    pid_m, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < rows
    q = tl.load(
        q_ptr + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    pos = tl.load(pos_ptr + offs_m, mask=row_ok, other=0)
    row_end = tl.where(row_ok, (pos // block_size + 1) * block_size, 0)
    tile_end = tl.max(row_end, 0)
    chunk = tl.cdiv(tl.cdiv(tile_end, SPLITS), BLOCK_N) * BLOCK_N  # whole key tiles per split
    lo = split * chunk
    hi = tl.minimum(lo + chunk, tile_end)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    kv_head = head // GROUPS
    k_rows = k_ptr + kv_head * stride_kh + offs_d[None, :]
    v_rows = v_ptr + kv_head * stride_vh + offs_d[None, :]
    # One masked loop: a split holds one to a few key tiles, and a second (unmasked) loop's
    # prologue cost more than the masks (H200, LLaDA's 32 rows: 10.6 -> 11.0 us per layer at 1k).
    acc, m_i, l_i = key_range(acc, m_i, l_i, lo, hi, q, k_rows, v_rows, stride_kn, stride_vn,
                              row_end, hi, qk_scale, True, BLOCK_N, IEEE, WHILE)  # fmt: skip
    at = (split * heads + head) * rows + offs_m  # [SPLITS, heads, rows] row index
    tl.store(acc_ptr + at[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
    tl.store(ml_ptr + at * 2, m_i, mask=row_ok)
    tl.store(ml_ptr + at * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _combine_kernel(acc_ptr, ml_ptr, o_ptr, stride_oh, stride_om, rows, heads,
                    SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                    PDL: tl.constexpr = False):  # fmt: skip
    """One program per (row, head): merge the splits' partial softmaxes."""
    pdl.enter(PDL)
    row, head = tl.program_id(0), tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_P2)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < SPLITS
    at = (offs_s * heads + head) * rows + row
    m = tl.load(ml_ptr + at * 2, mask=s_ok, other=float("-inf"))
    l_s = tl.load(ml_ptr + at * 2 + 1, mask=s_ok, other=0.0)
    m_all = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_all))  # empty splits weigh nothing
    acc = tl.load(acc_ptr + at[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    total = tl.sum(w * l_s, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(o_ptr + head * stride_oh + row * stride_om + offs_d, out.to(o_ptr.dtype.element_ty))


def arena_attention_split(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, arena, head_dim]
    v: torch.Tensor,
    positions: torch.Tensor,  # [rows] int64
    block_size: int,
    scale: float,
    splits: int,
) -> torch.Tensor:  # [heads, rows, head_dim], a view of a row-major [rows, heads, head_dim]
    heads, rows, head_dim = q.shape
    out = torch.empty((rows, heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)
    acc = torch.empty((splits, heads, rows, head_dim), dtype=torch.float32, device=q.device)
    ml = torch.empty((splits, heads, rows, 2), dtype=torch.float32, device=q.device)
    ieee = q.dtype == torch.float32
    block_m = 16 if rows <= 16 else (32 if rows <= 32 or ieee else 64)
    grid = (triton.cdiv(rows, block_m), heads, splits)
    args = (q, k, v, positions, acc, ml, block_size, scale * LOG2E,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            rows, heads)  # fmt: skip
    consts = dict(GROUPS=heads // k.shape[0], SPLITS=splits, HEAD_DIM=head_dim, IEEE=ieee)
    if q.is_cuda:
        block_n, warps, stages = _launch_tile(head_dim, ieee)
        _split_kernel[grid](*args, **consts, BLOCK_M=block_m, BLOCK_N=block_n, WHILE=False,
                            num_warps=warps, num_stages=stages, **pdl.launch())  # fmt: skip
    else:  # TRITON_INTERPRET=1: the interpreter's loop form
        _split_kernel[grid](*args, **consts, BLOCK_M=block_m, BLOCK_N=16, WHILE=True,
                            **pdl.launch())  # fmt: skip
    return combine_splits(acc, ml, out)


def combine_splits(acc: torch.Tensor, ml: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge split partials (acc [splits, heads, rows, D] fp32 unnormalised, ml [splits, heads,
    rows, 2]: running max in log2 units and sum) into out [heads, rows, D] (any row / head strides,
    unit stride in D). Also the canvas kernel's second pass (kernels/canvas_attention.py)."""
    splits, heads, rows, head_dim = acc.shape
    _combine_kernel[(rows, heads)](
        acc, ml, out, out.stride(0), out.stride(1), rows, heads,
        SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), HEAD_DIM=head_dim, **pdl.launch(),
    )  # fmt: skip
    return out


# Rounds of 17-32 rows only (below). H200 (benchmarks/kernels/attention_tiles.py, one layer of LLaDA-2.1-mini's
# 32 rows): 20.9 -> 10.4 us at 1k keys and 67.2 -> 16.4 at 4k against the one-pass kernel's best
# tile, the round 5.41 -> 5.20 ms; QwenDLM's 256 rows got slower split (20.2 -> 28.5 us at 1k: the
# fp32 partials cost more than the extra programs buy). Not below 17 rows: captures of rounds of
# 1 and 8-16 rows (the split kernel's 16-row tile) have failed with an invalidated capture inside
# it (tests/engine/test_drafts_gpu.py::test_a_cap_of_one_round_or_step, and once a fold test),
# not yet understood; 32-row captures (LLaDA's rounds, the GPU tests) pass.
SPLIT_MIN_ROWS, SPLIT_MAX_ROWS = 17, 32
SPLIT_MIN_ARENA = 2048  # LLaDA at a 1k-token context: 1,056 rows -> a 2,048-row arena, 4 splits


def pick_splits(rows: int, heads: int, arena: int, sms: int) -> int:
    """How many key splits fill the GPU (about 4 programs per SM), 1 = the one-pass kernel.

    Only for few rows (SPLIT_MIN_ROWS .. SPLIT_MAX_ROWS) over arenas of >= SPLIT_MIN_ARENA rows
    (the arena is sized to the longest request: a one-arena-quantum model such as the demo keeps
    the one-pass kernel it was measured with), at most one split per 512 arena rows, at most 16."""
    if not SPLIT_MIN_ROWS <= rows <= SPLIT_MAX_ROWS or arena < SPLIT_MIN_ARENA:
        return 1
    tiles = triton.cdiv(rows, 64 if rows > 32 else 32) * heads
    return max(1, min(16, arena // 512, (4 * sms) // tiles))
