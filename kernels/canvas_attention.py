"""DiffusionGemma's attention over its context arena: visibility from the device-side pass start.

A pass of `rows` rows at arena positions start.. (start = positions[0], read on the device) has
already written its own K/V at those rows. Which arena rows a query row sees:

    decoder (a canvas)     full layers: [0, start + rows)           sliding: [max(0, start - W + 1), start + rows)
    encoder (context rows) full layers: [0, p + 1) (causal)         sliding: [max(0, p - W + 1), p + 1)

(W the sliding window; the same sets as the masks of `dlmrt.ops.canvas_attention`'s torch twin.)
No mask tensor and no gather: a tile of rows loops only over the union of its rows' ranges, so a
sliding layer costs O(window) whatever the context length; the key tiles every row of the tile
sees run unmasked (kernels/online_softmax.py holds the tile step). The output columns may be
split across programs (BLOCK_DV; every program then recomputes the scores, reading the whole K
row in BLOCK_D chunks to bound registers), and the keys too (SPLITS; partials merged by
kernels/arena_attention_split.py's second pass). Tiles and splits per head dim: `launch_tile`.
An FP8 arena is dequantized in registers (`.to(q.dtype)`). K and V are separate arena tensors even
on DiffusionGemma's K = V full layers (K is normed with a gain and roped, V normed without), so
both are read.
Torch twin: `dlmrt.ops.canvas.canvas_attention`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import online_softmax, pdl  # relative: kernels/ imports nothing from dlmrt
from .arena_attention_split import combine_splits

_FAR = tl.constexpr(1 << 30)  # a padded row's range start: never the tile's minimum


@triton.jit
def _row_ranges(pos, row_ok, start, rows, window, DECODER: tl.constexpr, SLIDING: tl.constexpr):
    """[lo, hi) of the arena rows each query row sees (padded rows: empty)."""
    if DECODER:
        hi = tl.zeros_like(pos) + start + rows
        lo = tl.zeros_like(pos) + start - window + 1
    else:
        hi = pos + 1
        lo = pos - window + 1
    if not SLIDING:
        lo = tl.zeros_like(pos)
    lo = tl.maximum(lo, 0)
    return tl.where(row_ok, lo, _FAR), tl.where(row_ok, hi, 0)


@triton.jit
def _scores(q_row, k_row, row_ok, key_ok, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
            IEEE: tl.constexpr):  # fmt: skip
    """q · k^T over the whole head dim, BLOCK_D columns at a time (fp32)."""
    s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for d0 in tl.static_range(0, HEAD_DIM, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        q = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        if MASKED:
            k = tl.load(k_row + offs_d[None, :], mask=key_ok[:, None], other=0.0).to(q.dtype)
        else:
            k = tl.load(k_row + offs_d[None, :]).to(q.dtype)
        s += online_softmax.scores(q, k, IEEE)
    return s


@triton.jit
def _tile(acc, m_i, l_i, first, q_row, k_base, v_base, stride_kn, stride_vn, offs_v, row_ok,
          row_lo, row_hi, tile_lo, tile_hi, qk_scale, MASKED: tl.constexpr,
          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """One key tile [first, first + BLOCK_N) folded into the online softmax. Unmasked (MASKED
    False): every row sees every key of the tile, all of them inside [tile_lo, tile_hi)."""
    offs_n = first + tl.arange(0, BLOCK_N)
    key_ok = (offs_n >= tile_lo) & (offs_n < tile_hi)  # rows outside are never loaded
    s = _scores(q_row, k_base + offs_n[:, None] * stride_kn, row_ok, key_ok,
                HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, MASKED, IEEE) * qk_scale  # fmt: skip
    visible = (offs_n[None, :] >= row_lo[:, None]) & (offs_n[None, :] < row_hi[:, None])
    v_at = v_base + offs_n[:, None] * stride_vn + offs_v[None, :]
    if MASKED:
        v = tl.load(v_at, mask=key_ok[:, None], other=0.0)
    else:
        v = tl.load(v_at)
    v = v.to(q_row.dtype.element_ty)
    return online_softmax.fold(acc, m_i, l_i, s, v, visible, MASKED, IEEE)


@triton.jit
def _keys(acc, m_i, l_i, lo, hi, q_row, for_keys, tile_hi, qk_scale, MASKED: tl.constexpr,
          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, IEEE: tl.constexpr, WHILE: tl.constexpr):  # fmt: skip
    """Key tiles [lo, hi) (lo aligned, or lo >= hi: none), each folded in by `_tile`."""
    k_base, v_base, stride_kn, stride_vn, offs_v, row_ok, row_lo, row_hi, tile_lo = for_keys
    if WHILE:  # the interpreter cannot range() over tensor bounds; a while loop is not pipelined
        first = lo
        while first < hi:
            acc, m_i, l_i = _tile(acc, m_i, l_i, first, q_row, k_base, v_base, stride_kn,
                                  stride_vn, offs_v, row_ok, row_lo, row_hi, tile_lo, tile_hi,
                                  qk_scale, MASKED, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                                  IEEE)  # fmt: skip
            first += BLOCK_N
    else:
        for n0 in range(lo, hi, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, n0, q_row, k_base, v_base, stride_kn,
                                  stride_vn, offs_v, row_ok, row_lo, row_hi, tile_lo, tile_hi,
                                  qk_scale, MASKED, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                                  IEEE)  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _split_ranges(row_ok, row_lo, row_hi, split, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's key tiles: [lo, a) and [b, hi) masked, [a, b) unmasked (whole tiles that
    every row of the tile sees: a canvas's rows share one range, so that is all but its two edge
    tiles), the `split`-th of SPLITS equal slices of whole tiles. All bounds sit on the aligned
    tile grid from the first tile, except tile_hi (only ever the end of a masked range)."""
    tile_lo, tile_hi = tl.min(row_lo, 0), tl.max(row_hi, 0)
    first = (tile_lo // BLOCK_N) * BLOCK_N
    last_lo = tl.max(tl.where(row_ok, row_lo, 0), 0)
    first_hi = tl.min(tl.where(row_ok, row_hi, _FAR), 0)
    inner_lo = tl.minimum(tl.maximum(tl.cdiv(last_lo, BLOCK_N) * BLOCK_N, first), tile_hi)
    inner_hi = tl.maximum(tl.minimum((first_hi // BLOCK_N) * BLOCK_N, tile_hi), inner_lo)
    chunk = tl.cdiv(tl.cdiv(tile_hi - first, SPLITS), BLOCK_N) * BLOCK_N
    lo = first + split * chunk
    hi = tl.minimum(lo + chunk, tile_hi)
    a = tl.minimum(tl.maximum(inner_lo, lo), hi)
    b = tl.minimum(tl.maximum(inner_hi, lo), hi)
    return tile_lo, tile_hi, lo, a, b, hi


@triton.jit
def _canvas_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, acc_ptr, ml_ptr, pos_ptr, qk_scale, window,
    stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
    rows,
    GROUPS: tl.constexpr, DECODER: tl.constexpr, SLIDING: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPLITS: tl.constexpr, IEEE: tl.constexpr, WHILE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    pid_m, head = tl.program_id(0), tl.program_id(1)
    slices = HEAD_DIM // BLOCK_DV  # V / output columns per program: program_id(2) = split, slice
    pid_v, split = tl.program_id(2) % slices, tl.program_id(2) // slices
    kv_head = head // GROUPS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_v = pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)
    row_ok = offs_m < rows
    pos = tl.load(pos_ptr + offs_m, mask=row_ok, other=0)
    # positions are consecutive: every row gives the pass start (a vector op, not a scalar load)
    start = tl.min(tl.where(row_ok, pos - offs_m, _FAR), 0)
    row_lo, row_hi = _row_ranges(pos, row_ok, start, rows, window, DECODER, SLIDING)
    tile_lo, tile_hi, lo, a, b, hi = _split_ranges(row_ok, row_lo, row_hi, split, SPLITS, BLOCK_N)
    q_row = q_ptr + head * stride_qh + offs_m[:, None] * stride_qm
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    k_base, v_base = k_ptr + kv_head * stride_kh, v_ptr + kv_head * stride_vh
    # (explicit calls, no *args: a tuple would carry the constexprs as values)
    for_keys = (k_base, v_base, stride_kn, stride_vn, offs_v, row_ok, row_lo, row_hi, tile_lo)
    acc, m_i, l_i = _keys(acc, m_i, l_i, lo, a, q_row, for_keys, tile_hi, qk_scale,
                          True, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IEEE, WHILE)  # fmt: skip
    acc, m_i, l_i = _keys(acc, m_i, l_i, a, b, q_row, for_keys, tile_hi, qk_scale,
                          False, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IEEE, WHILE)  # fmt: skip
    acc, m_i, l_i = _keys(acc, m_i, l_i, b, hi, q_row, for_keys, tile_hi, qk_scale,
                          True, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IEEE, WHILE)  # fmt: skip
    if SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            o_ptr + head * stride_oh + offs_m[:, None] * stride_om + offs_v[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )
    else:  # partials, merged by the arena split kernel's second pass
        at = (split * tl.num_programs(1) + head) * rows + offs_m  # [SPLITS, heads, rows]
        tl.store(acc_ptr + at[:, None] * HEAD_DIM + offs_v[None, :], acc, mask=row_ok[:, None])
        first_v = row_ok & (pid_v == 0)  # every V slice holds the same max and sum
        tl.store(ml_ptr + at * 2, m_i, mask=first_v)
        tl.store(ml_ptr + at * 2 + 1, l_i, mask=first_v)


def launch_tile(head_dim: int, ieee: bool) -> tuple[int, int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, num_warps, num_stages, key splits): fixed per shape
    class, no autotuner (a request must never stop to benchmark configs: issue 23)."""
    if ieee:
        return 32, 32, min(128, head_dim), min(128, head_dim), 4, 2, 1
    # H200, 256 rows, one layer (benchmarks/kernels/attention_tiles.py; numbers: docs/kernels.md):
    # DiffusionGemma's full layers (head 512) hold all 512 output columns in one program (the
    # scores computed once, not once per 128 columns) over two key splits: 94.4 -> 77.2 us at a 1k
    # context, 286.7 -> 225.4 at 4k; sliding layers (head 256) take 64-key tiles (34.2 -> 28.5 us)
    # and no split (two: 42.2, the partials' round trip costs more than the programs buy). fp32
    # (exact "ieee" dots, the parity tests) keeps one small tile.
    if head_dim == 512:
        return 64, 32, 128, 512, 8, 2, 2
    block_n = 64 if head_dim <= 256 else 32  # 64-key tiles at head 512: 311 KB of shared memory
    return 64, block_n, min(128, head_dim), min(128, head_dim), 4, 3, 1


def canvas_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, arena, head_dim] (one arena layer, this pass's rows written)
    v: torch.Tensor,  # [kv_heads, arena, head_dim]
    positions: torch.Tensor,  # [rows] int64, consecutive: start, start + 1, ...
    decoder: bool,
    window: int,  # the sliding window; 0: a full layer
    scale: float,
    tiles: tuple[int, int, int, int, int, int, int] | None = None,
    splits: int | None = None,
) -> torch.Tensor:  # [heads, rows, head_dim], a view of a row-major [rows, heads, head_dim]
    """`tiles` overrides `launch_tile` on CUDA (benchmarks/kernels/attention_tiles.py; the interpreter
    keeps its 16-row tiles); `splits` overrides the key splits, on the CPU too (the interpreter's
    tests of the split path). Key splits need a power-of-two head dim (the merge pass's columns)."""
    heads, rows, head_dim = q.shape
    if (head_dim % 128) if head_dim > 128 else (head_dim < 16 or head_dim & (head_dim - 1)):
        raise ValueError(
            f"canvas_attention: head_dim {head_dim} must be a power of two >= 16 or a multiple "
            "of 128"
        )
    out = torch.empty((rows, heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)
    ieee = q.dtype == torch.float32
    if q.is_cuda:
        block_m, block_n, block_d, block_dv, warps, stages, pick = tiles or launch_tile(
            head_dim, ieee
        )
        launch = dict(WHILE=False, num_warps=warps, num_stages=stages)
    else:  # TRITON_INTERPRET=1 on the CPU: the interpreter's loop form, small tiles
        block_m = block_n = 16
        block_d = block_dv = min(head_dim, 128)
        pick, launch = 1, dict(WHILE=True)
    splits = splits or pick
    if splits > 1 and head_dim & (head_dim - 1):
        raise ValueError(
            f"canvas_attention: {splits} key splits need a power-of-two head_dim, not {head_dim}"
        )
    # the split partials (fp32) and their maxima and sums; a 1-split launch never touches them
    f32 = dict(dtype=torch.float32, device=q.device)
    acc = torch.empty((splits, heads, rows, head_dim) if splits > 1 else (1,), **f32)
    ml = torch.empty((splits, heads, rows, 2) if splits > 1 else (1,), **f32)
    grid = (triton.cdiv(rows, block_m), heads, head_dim // block_dv * splits)
    _canvas_attention_kernel[grid](
        q, k, v, out, acc, ml, positions, scale * online_softmax.LOG2E, max(window, 1),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), rows,
        GROUPS=heads // k.shape[0], DECODER=bool(decoder), SLIDING=window > 0, BLOCK_M=block_m,
        BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_DV=block_dv, SPLITS=splits,
        IEEE=ieee, **launch, **pdl.launch(),
    )  # fmt: skip
    return combine_splits(acc, ml, out) if splits > 1 else out
