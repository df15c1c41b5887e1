"""Routed gated-MLP experts with NVFP4 weights: weight-only W4A16 on the grouped GEMM of moe_mlp.py.

Same plan, tiles and epilogues (`store_hidden`, `store_weighted`) as kernels/moe_mlp.py (device-side
grouping, capturable, slots summed in slot order). The weights are read packed: uint8 [E, N, K/2]
(two E2M1 codes a byte, element 2j in the low nibble), one e4m3 block scale per 16 along K [E, N,
K/16] and one fp32 global scale per expert [E], i.e. 4.5 bits a weight. Each [BN, BK/2] byte tile
(rows of the weight, unit stride: coalesced) is decoded in registers into its two nibble halves
(kernels/e2m1_decode.py: packed PTX bit placement and one bf16x2 multiply by the block scale), each
met by its own activation run in its own dot: the activations are read evens-first (x copied so
once a call, h stored so by the gate|up kernel), so both runs are contiguous and nothing is
interleaved back into K order. The weights come out as code * block scale * 2^-7, exact; the
global scale times 2^7 multiplies the fp32 sums. `swap` computes acc^T = W a^T (the decoded tile
as the dot's first operand: a wgmma with the tile's rows as its N), on for 32-row tiles (`_tiles`).
Compared with the twin, only the weights' rounding differs: the twin rounds code * block scale *
global scale to bf16, the kernel multiplies by the global scale after the sums.
The block scales may be passed already as fp32 (the CPU interpreter's e4m3 casts round wrongly;
tests/quant/test_nvfp4_kernel.py); on the GPU they are read as e4m3.
Torch twin: `dlmrt.ops.nvfp4.moe_mlp_nvfp4` (dequantize, then the bf16 op).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# relative: kernels/ imports nothing from dlmrt
from . import pdl
from .e2m1_decode import expert_halves
from .moe_mlp import BLOCK_M, _tile, acc_zeros, mma, plan, store_hidden, store_weighted, tile_major
from .slot_sum import slot_sum

NVFP4 = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (packed, block scales, global scales)


@triton.jit
def _load_w(w_base, s_base, k0, K: tl.constexpr, n_ok, BK: tl.constexpr):
    """The [BN, BK/2] code bytes and [BN, BK/16] block scales of K step k0 (none past K)."""
    jj = k0 // 2 + tl.arange(0, BK // 2)
    b = tl.load(w_base + jj[None, :], mask=n_ok[:, None] & (jj < K // 2)[None, :], other=0)
    ss = k0 // 16 + tl.arange(0, BK // 16)
    s = tl.load(s_base + ss[None, :], mask=n_ok[:, None] & (ss < K // 16)[None, :], other=0.0)
    return b, s


@triton.jit
def _load_a_halves(a_base, k0, K: tl.constexpr, a_rows, BK: tl.constexpr):
    """The activations of K step k0 at even and at odd k ([BM, BK/2] each) from a row stored
    evens first (`_evens_first`): two contiguous runs, so the loads pipeline as cp.async."""
    j = k0 // 2 + tl.arange(0, BK // 2)
    mask = a_rows[:, None] & (j < K // 2)[None, :]
    a_even = tl.load(a_base + j[None, :], mask=mask, other=0.0)
    return a_even, tl.load(a_base + K // 2 + j[None, :], mask=mask, other=0.0)


@triton.jit
def _halves_mma(
    a_even, a_odd, b, s, acc, SWAP: tl.constexpr, IEEE: tl.constexpr, ASM: tl.constexpr
):
    """acc + a @ (w * 2^-7 / global scale)^T over one K step, as two dots: the bytes' low nibbles
    (even k) with a_even, the high ones with a_odd (`e2m1_decode.expert_halves`)."""
    low, high = expert_halves(b, s, a_even.dtype, ASM)
    return mma(a_odd, high, mma(a_even, low, acc, SWAP, IEEE), SWAP, IEEE)


@triton.jit
def _gate_up_kernel(
    x_ptr, gw_ptr, gs_ptr, gg_ptr, uw_ptr, us_ptr, ug_ptr,
    h_ptr, order_ptr, tile_end_ptr, counts_ptr, starts_ptr,
    stride_x, stride_gwe, stride_gwn, stride_gse, stride_gsn,
    stride_uwe, stride_uwn, stride_use, stride_usn,
    H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, E: tl.constexpr,
    E_PAD: tl.constexpr, GELU: tl.constexpr, IEEE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SWAP: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False,
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
    a_base = x_ptr + row[:, None] * stride_x
    gw = gw_ptr + e64 * stride_gwe + n[:, None] * stride_gwn
    gs = gs_ptr + e64 * stride_gse + n[:, None] * stride_gsn
    uw = uw_ptr + e64 * stride_uwe + n[:, None] * stride_uwn
    us = us_ptr + e64 * stride_use + n[:, None] * stride_usn
    for k0 in range(0, H, BK):
        a_even, a_odd = _load_a_halves(a_base, k0, H, valid, BK)
        bg, sg = _load_w(gw, gs, k0, H, n_ok, BK)
        bu, su = _load_w(uw, us, k0, H, n_ok, BK)
        acc_g = _halves_mma(a_even, a_odd, bg, sg, acc_g, SWAP, IEEE, ASM)
        acc_u = _halves_mma(a_even, a_odd, bu, su, acc_u, SWAP, IEEE, ASM)
    # the global scales, times the decode's 2^7 (exact)
    acc_g = acc_g * (tl.load(gg_ptr + e64) * 128.0)
    acc_u = acc_u * (tl.load(ug_ptr + e64) * 128.0)
    acc_g, acc_u = tile_major(acc_g, SWAP), tile_major(acc_u, SWAP)
    evens_first = (n % 2) * (INTER // 2) + n // 2  # h's columns as the down kernel reads them
    store_hidden(h_ptr, acc_g, acc_u, pos, evens_first, valid, n_ok, INTER, GELU)


@triton.jit
def _down_kernel(
    h_ptr, dw_ptr, ds_ptr, dg_ptr, w_ptr, y_ptr, order_ptr, tile_end_ptr, counts_ptr, starts_ptr,
    stride_dwe, stride_dwn, stride_dse, stride_dsn,
    H: tl.constexpr, INTER: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
    IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SWAP: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    e, e64, valid, pos = _tile(tile_end_ptr, counts_ptr, starts_ptr, E, E_PAD, BM)
    if e >= E:
        return
    pair = tl.load(order_ptr + pos, mask=valid, other=0).to(tl.int64)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = n < H
    acc = acc_zeros(BM, BN, SWAP)
    a_base = h_ptr + pos.to(tl.int64)[:, None] * INTER
    dw = dw_ptr + e64 * stride_dwe + n[:, None] * stride_dwn
    ds = ds_ptr + e64 * stride_dse + n[:, None] * stride_dsn
    for k0 in range(0, INTER, BK):
        a_even, a_odd = _load_a_halves(a_base, k0, INTER, valid, BK)
        b, s = _load_w(dw, ds, k0, INTER, n_ok, BK)
        acc = _halves_mma(a_even, a_odd, b, s, acc, SWAP, IEEE, ASM)
    acc = acc * (tl.load(dg_ptr + e64) * 128.0)  # the global scale, times the decode's 2^7
    acc = tile_major(acc, SWAP)
    store_weighted(acc, h_ptr.dtype.element_ty, w_ptr, y_ptr, pair, n, valid, n_ok, H)


def _tiles(pairs: int, experts: int, bm: int | None, bk: int | None) -> tuple[int, int]:
    """Default (BM, BK), static per shape (capture-safe). Each tile decodes its expert's weights
    once, so when experts get >= 8 pairs on average (DiffusionGemma's 256-row canvas: 16) 32-row
    tiles decode them about half as often; 128-wide K steps either way. Measured on the H200
    (benchmarks/kernels/moe_nvfp4.py, benchmarks/results/moe_nvfp4_h200_2026-12-03.json): DiffusionGemma
    0.337 ms a layer at (32, 128) against 0.379 at (32, 64) and 0.414 at (16, 128); LLaDA's ~1
    pair per expert 0.200 ms at (16, 128) against 0.225 at (32, 128). `swap` (the decoded tile as
    the dot's first operand) pays with the 32-row tiles (0.343 against 0.359 ms), not with the
    16-row ones (0.205 against 0.177 ms): it is on where BM is 32."""
    many = pairs >= 8 * experts
    return bm or (32 if many else BLOCK_M), bk or 128


def _evens_first(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] with each row's even-k columns first, then its odd ones (one copy): the layout
    the kernels read activations in, so the low and high nibbles of a byte tile each meet one
    contiguous activation run."""
    rows, k = x.shape
    return x.reshape(rows, k // 2, 2).transpose(1, 2).reshape(rows, k)


def _in_k_order(h: torch.Tensor) -> torch.Tensor:
    """The inverse of `_evens_first`."""
    rows, k = h.shape
    return h.reshape(rows, 2, k // 2).transpose(1, 2).reshape(rows, k)


def _asm_decode(x: torch.Tensor) -> bool:
    """The packed inline-PTX decode serves bf16 activations on a GPU (not the interpreter)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return x.dtype == torch.bfloat16 and x.is_cuda and not interpreted


def _strides(w: NVFP4) -> tuple[int, int, int, int]:
    return w[0].stride(0), w[0].stride(1), w[1].stride(0), w[1].stride(1)


def moe_mlp_nvfp4(
    x: torch.Tensor,
    weights: torch.Tensor,
    index: torch.Tensor,
    gate: NVFP4,
    up: NVFP4,
    down: NVFP4,
    activation: str,
    bn: int = 64,
    bk: int | None = None,  # a multiple of 32 (16-weight blocks, and BK/2 >= 16 bytes a row)
    warps: int = 4,
    stages: int | None = None,
    bm: int | None = None,  # rows of an expert tile (see `_tiles`)
    hidden_hook=None,  # maps the hidden act(gate) * up [pairs, I] between the two GEMMs (W4A4)
    swap: bool | None = None,  # the decoded weights as the dot's first operand (see `_tiles`)
    add: torch.Tensor | None = None,  # [rows, H] added to the result (`slot_sum`)
    asm: bool | None = None,  # the inline-PTX decode (default: bf16 on CUDA; e2m1_decode.py)
) -> torch.Tensor:
    """x [rows, H], weights / index [rows, k]; gate / up ([E, I, H/2] uint8, [E, I, H/16] e4m3 or
    fp32, [E] fp32), down ([E, H, I/2], [E, H, I/16], [E]) with unit-stride rows -> [rows, H]."""
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"moe_mlp_nvfp4: unknown activation {activation!r}")
    bm, bk = _tiles(index.numel(), down[0].shape[0], bm, bk)
    if bk % 32:
        raise ValueError(f"moe_mlp_nvfp4: bk must be a multiple of 32, got {bk}")
    rows, top_k = index.shape
    experts, hidden, half = down[0].shape
    inter = 2 * half
    for t in (*gate[:2], *up[:2], *down[:2]):
        if t.stride(-1) != 1:
            raise ValueError("moe_mlp_nvfp4: weight rows and block scales need unit stride")
    x = _evens_first(x)
    order, tile_end, counts, starts, max_tiles = plan(index, experts, bm)
    h = torch.empty((index.numel(), inter), dtype=x.dtype, device=x.device)  # sorted order
    y = torch.empty((rows, top_k, hidden), dtype=torch.float32, device=x.device)
    common = dict(E=experts, E_PAD=triton.next_power_of_2(experts), IEEE=x.dtype == torch.float32)
    common["SWAP"] = bm > BLOCK_M if swap is None else swap  # see `_tiles`
    common["ASM"] = _asm_decode(x) if asm is None else asm
    launch = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    _gate_up_kernel[(max_tiles, triton.cdiv(inter, bn))](
        x, *gate, *up, h, order, tile_end, counts, starts, x.stride(0), *_strides(gate),
        *_strides(up), hidden, inter, TOP_K=top_k, GELU=activation == "gelu_tanh",
        BM=bm, BN=bn, BK=bk, **common, **launch, **pdl.launch(gemm=True),
    )  # fmt: skip
    if hidden_hook is not None:  # rows of h are (row, expert) pairs; the hook is per row
        h = _evens_first(hidden_hook(_in_k_order(h)))
    _down_kernel[(max_tiles, triton.cdiv(hidden, bn))](
        h, *down, weights.contiguous(), y, order, tile_end, counts, starts, *_strides(down),
        hidden, inter, BM=bm, BN=bn, BK=bk, **common, **launch, **pdl.launch(gemm=True),
    )  # fmt: skip
    return slot_sum(y, x.dtype, add)
