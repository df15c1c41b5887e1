"""Routed gated-MLP experts as a grouped GEMM with device-side grouping (no host sync: capturable).

Plan (on device): the rows*k (row, slot) pairs are grouped by expert, one expert's pairs in pair
order (decode-sized passes: one launch of `moe_plan.py`; larger ones: torch sorts the key
expert * P + pair and takes counts and starts from searchsorted), and each expert's pairs are cut
into BLOCK_M tiles. The grid has a static upper bound of tiles,
cdiv(P, BLOCK_M) + min(E, P); a program finds its expert from the tiles' running ends and exits
when it is past the last one. Experts no pair picked cost nothing: their weights are never read.

Kernels: (1) gate and up projections of one tile, the activation fused (SwiGLU or GeGLU, rounded
to the dtype where torch rounds: each projection, the activation, the product), written in sorted
order; (2) the down projection times the routing weight, written to the pair's own slot in fp32.
The k slots of a row are then summed in slot order (`slot_sum.py`, no atomics), so eager runs
and graph replays give the same bits. Torch twin: `dlmrt.ops.reference.moe_mlp`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .moe_plan import (
    MAX_PAIRS,
    chunked_fits,
    plan_chunked,
    plan_small,
)
from .silu_mul import activation  # the SiLU / gelu_tanh of every epilogue
from .slot_sum import slot_sum

BLOCK_M = 16  # the rows of an expert tile: 32 rows x top-8 over 256 experts is ~1 pair per expert


@triton.jit
def _tile(
    tile_end_ptr, counts_ptr, starts_ptr, E: tl.constexpr, E_PAD: tl.constexpr, BM: tl.constexpr
):
    """(expert, first sorted position, valid rows mask, sorted positions) of this program's tile."""
    b = tl.program_id(0)
    ids = tl.arange(0, E_PAD)
    ends = tl.load(tile_end_ptr + ids, mask=ids < E, other=1 << 30)
    e = tl.sum((ends <= b).to(tl.int32))  # experts whose tiles all lie before tile b
    e_safe = tl.minimum(e, E - 1)
    count = tl.load(counts_ptr + e_safe)
    first_tile = tl.load(tile_end_ptr + e_safe) - tl.cdiv(count, BM)
    m = (b - first_tile) * BM + tl.arange(0, BM)
    valid = (m < count) & (e < E)
    pos = tl.load(starts_ptr + e_safe) + m
    return e, e_safe.to(tl.int64), valid, pos


@triton.jit
def acc_zeros(BM: tl.constexpr, BN: tl.constexpr, SWAP: tl.constexpr):
    """A tile's fp32 accumulator: [BM, BN], or [BN, BM] when SWAP (acc^T = W a^T: the weight tile
    is the dot's first operand, so Hopper runs a wgmma with the tile's rows as its N)."""
    if SWAP:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
    else:
        acc = tl.zeros([BM, BN], dtype=tl.float32)
    return acc  # one return after the branches: Triton also traces what follows a taken one


@triton.jit
def tile_major(acc, SWAP: tl.constexpr):
    """The accumulator as [BM, BN] (the tile's rows first) for the epilogues."""
    if SWAP:
        acc = tl.trans(acc)
    return acc


@triton.jit
def mma(a, w, acc, SWAP: tl.constexpr, IEEE: tl.constexpr):
    """acc + a @ w^T for a [BM, BK], w [BN, BK] (SWAP: acc^T + w @ a^T)."""
    if SWAP:
        if IEEE:
            acc = tl.dot(w, tl.trans(a), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(a), acc)
    else:
        if IEEE:
            acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def _gate_up_kernel(
    x_ptr, gate_ptr, up_ptr,
    gate_scale_ptr, up_scale_ptr,  # [E, INTER] fp32 per-channel scales of FP8 weights (SCALED)
    h_ptr, order_ptr, tile_end_ptr, counts_ptr, starts_ptr,
    stride_x, stride_ge, stride_gn, stride_ue, stride_un,
    H: tl.constexpr,  # constexpr: static per model, and the loop bounds
    INTER: tl.constexpr, TOP_K: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
    GELU: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SCALED: tl.constexpr = False, SWAP: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    e, e64, valid, pos = _tile(tile_end_ptr, counts_ptr, starts_ptr, E, E_PAD, BM)
    if e >= E:
        return
    pair = tl.load(order_ptr + pos, mask=valid, other=0)
    row = (pair // TOP_K).to(tl.int64)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = n < INTER
    acc_g = acc_zeros(BM, BN, SWAP)
    acc_u = acc_zeros(BM, BN, SWAP)
    g_base = gate_ptr + e64 * stride_ge + n[:, None] * stride_gn  # [BN, BK] tiles: rows of W
    u_base = up_ptr + e64 * stride_ue + n[:, None] * stride_un
    for k0 in range(0, H, BK):
        kk = k0 + tl.arange(0, BK)
        k_ok = kk < H
        a_mask = valid[:, None] & k_ok[None, :]
        a = tl.load(x_ptr + row[:, None] * stride_x + kk[None, :], mask=a_mask, other=0.0)
        w_mask = n_ok[:, None] & k_ok[None, :]
        wg = tl.load(g_base + kk[None, :], mask=w_mask, other=0.0).to(a.dtype)
        wu = tl.load(u_base + kk[None, :], mask=w_mask, other=0.0).to(a.dtype)
        acc_g = mma(a, wg, acc_g, SWAP, IEEE)
        acc_u = mma(a, wu, acc_u, SWAP, IEEE)
    acc_g, acc_u = tile_major(acc_g, SWAP), tile_major(acc_u, SWAP)
    if SCALED:  # FP8 weights: w = code * scale per output channel, applied to the sums
        acc_g = acc_g * tl.load(gate_scale_ptr + e64 * INTER + n, mask=n_ok, other=0.0)[None, :]
        acc_u = acc_u * tl.load(up_scale_ptr + e64 * INTER + n, mask=n_ok, other=0.0)[None, :]
    store_hidden(h_ptr, acc_g, acc_u, pos, n, valid, n_ok, INTER, GELU)


@triton.jit
def store_hidden(h_ptr, acc_g, acc_u, pos, n, valid, n_ok, INTER: tl.constexpr, GELU: tl.constexpr):
    """The gate|up epilogue (also kernels/moe_mlp_nvfp4.py's): h = act(gate) * up, each rounded
    to h's dtype where torch rounds, stored at the tile's sorted (row, expert) positions."""
    dtype = h_ptr.dtype.element_ty
    act = activation(acc_g.to(dtype).to(tl.float32), GELU)
    h = act.to(dtype).to(tl.float32) * acc_u.to(dtype).to(tl.float32)
    out = h_ptr + pos.to(tl.int64)[:, None] * INTER + n[None, :]
    tl.store(out, h.to(dtype), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(
    h_ptr,
    down_ptr,
    down_scale_ptr,  # [E, H] fp32 (SCALED)
    w_ptr,
    y_ptr,
    order_ptr,
    tile_end_ptr,
    counts_ptr,
    starts_ptr,
    stride_de,
    stride_dn,
    H: tl.constexpr,  # constexpr: static per model, and the loop bounds
    INTER: tl.constexpr,
    E: tl.constexpr,
    E_PAD: tl.constexpr,
    IEEE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SCALED: tl.constexpr = False,
    SWAP: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    e, e64, valid, pos = _tile(tile_end_ptr, counts_ptr, starts_ptr, E, E_PAD, BM)
    if e >= E:
        return
    pair = tl.load(order_ptr + pos, mask=valid, other=0).to(tl.int64)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = n < H
    acc = acc_zeros(BM, BN, SWAP)
    d_base = down_ptr + e64 * stride_de + n[:, None] * stride_dn
    h_base = h_ptr + pos.to(tl.int64)[:, None] * INTER
    for k0 in range(0, INTER, BK):
        kk = k0 + tl.arange(0, BK)
        k_ok = kk < INTER
        a = tl.load(h_base + kk[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        wd = tl.load(d_base + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = mma(a, wd.to(a.dtype), acc, SWAP, IEEE)
    acc = tile_major(acc, SWAP)
    if SCALED:
        acc = acc * tl.load(down_scale_ptr + e64 * H + n, mask=n_ok, other=0.0)[None, :]
    store_weighted(acc, h_ptr.dtype.element_ty, w_ptr, y_ptr, pair, n, valid, n_ok, H)


@triton.jit
def store_weighted(acc, dtype: tl.constexpr, w_ptr, y_ptr, pair, n, valid, n_ok, H: tl.constexpr):
    """The down epilogue (also kernels/moe_mlp_nvfp4.py's and moe_mlp_fp8.py's): y rounded to the
    model's `dtype`, then times the routing weight (as torch: y, then y * w), stored fp32 at each
    pair's (row, slot)."""
    weight = tl.load(w_ptr + pair, mask=valid, other=0.0).to(tl.float32)
    y = acc.to(dtype).to(tl.float32) * weight[:, None]
    tl.store(y_ptr + pair[:, None] * H + n[None, :], y, mask=valid[:, None] & n_ok[None, :])


def plan(index: torch.Tensor, experts: int, block_m: int = BLOCK_M):
    """(order, tile_end, counts, starts, max_tiles): pairs grouped by expert, on device.

    order [P]: sorted position -> pair id (pair = row * k + slot); counts / starts [E] int32: each
    expert's pairs in `order`; tile_end [E] int32: running end of each expert's BLOCK_M tiles.
    """
    pairs = index.numel()
    max_tiles = triton.cdiv(pairs, block_m) + min(experts, pairs)
    if pairs <= MAX_PAIRS:  # decode passes: one single-program launch instead of a sort
        return (*plan_small(index, experts, block_m), max_tiles)
    if chunked_fits(
        pairs, experts, index.device
    ):  # DiffusionGemma's canvas, short prefills: three launches
        return (*plan_chunked(index, experts, block_m), max_tiles)
    flat = index.reshape(-1).to(torch.int64)
    key = flat * pairs + torch.arange(pairs, device=index.device)  # unique: any sort is stable
    order = torch.sort(key).indices
    ids = torch.arange(experts, device=index.device)
    ends = torch.searchsorted(flat[order], ids, right=True)  # pairs with expert <= e
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    tile_end = torch.cumsum(torch.div(counts + block_m - 1, block_m, rounding_mode="floor"), 0)
    i32 = torch.int32
    return order, tile_end.to(i32), counts.to(i32), (ends - counts).to(i32), max_tiles


def moe_mlp(
    x: torch.Tensor,
    weights: torch.Tensor,
    index: torch.Tensor,
    gate_up: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    down: torch.Tensor,
    activation: str,
    sum_dtype: torch.dtype | None = None,  # noqa: ARG001 (the slots are always summed in fp32)
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    bn: int = 64,  # the tiles and launch shape (benchmarks/kernels/moe_fp8.py sweeps them)
    bk: int | None = None,  # default 128 (fp32: 64, its tiles spill); see below
    warps: int = 4,
    stages: int | None = None,
    swap: bool = False,  # acc^T = W a^T (see `acc_zeros`)
    add: torch.Tensor | None = None,  # [rows, H] added to the result (`slot_sum`)
) -> torch.Tensor:
    """x [rows, H], weights / index [rows, k], gate_up [E, 2I, H] or ([E, I, H], [E, I, H]),
    down [E, H, I] (last dims contiguous) -> [rows, H] in x's dtype. `scales`: the weights are
    e4m3 codes with per-output-channel fp32 scales (gate [E, I], up [E, I], down [E, H]): each
    tile is converted to x's dtype in registers (weight-only FP8: half the bytes read)."""
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"moe_mlp: unknown activation {activation!r}")
    rows, top_k = index.shape
    experts, hidden, inter = down.shape
    if isinstance(gate_up, tuple):
        gate, up = gate_up
    else:
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
    # the kernels read rows of x and of every weight with unit stride
    x, gate, up, down = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, gate, up, down))
    order, tile_end, counts, starts, max_tiles = plan(index, experts)
    h = torch.empty((index.numel(), inter), dtype=x.dtype, device=x.device)  # sorted order
    y = torch.empty((rows, top_k, hidden), dtype=torch.float32, device=x.device)
    common = dict(E=experts, E_PAD=triton.next_power_of_2(experts), IEEE=x.dtype == torch.float32)
    common["SCALED"], common["SWAP"] = scales is not None, swap
    # H200, one layer (benchmarks/results/moe_mlp_swap_h200_2026-12-02.json): bf16 LLaDA 0.315 ->
    # 0.280 ms with 128-wide K tiles, DiffusionGemma 0.444 -> 0.432; FP8 0.21 vs 0.26 (64). `swap`
    # (the NVFP4 kernel's default): bf16 within 1% either way (one run), FP8 slower: off.
    bk = bk or (64 if x.dtype == torch.float32 else 128)
    launch = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    gs, us, ds = (s.contiguous() for s in scales) if scales is not None else (x, x, x)
    _gate_up_kernel[(max_tiles, triton.cdiv(inter, bn))](
        x, gate, up, gs, us, h, order, tile_end, counts, starts,
        x.stride(0), gate.stride(0), gate.stride(1), up.stride(0), up.stride(1), hidden, inter,
        TOP_K=top_k, GELU=activation == "gelu_tanh", BM=BLOCK_M, BN=bn, BK=bk, **common, **launch,
        **pdl.launch(gemm=True),
    )  # fmt: skip
    _down_kernel[(max_tiles, triton.cdiv(hidden, bn))](
        h, down, ds, weights.contiguous(), y, order, tile_end, counts, starts,
        down.stride(0), down.stride(1), hidden, inter, BM=BLOCK_M, BN=bn, BK=bk, **common, **launch,
        **pdl.launch(gemm=True),
    )  # fmt: skip
    return slot_sum(y, x.dtype, add)
