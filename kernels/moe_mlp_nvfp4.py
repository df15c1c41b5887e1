"""Routed gated-MLP experts with NVFP4 weights: weight-only W4A16 on the grouped GEMM of moe_mlp.py.

Same plan, tiles and epilogues as kernels/moe_mlp.py (device-side grouping, capturable, slots
summed in slot order). The weights are read packed: uint8 [E, N, K/2] (two E2M1 codes a byte,
element 2j in the low nibble), one e4m3 block scale per 16 along K [E, N, K/16] and one fp32
global scale per expert [E], i.e. 4.5 bits a weight. Each tile's bytes are decoded in registers to
code * (block scale * global scale) in fp32 (the twin's arithmetic, so the converted weights equal
the twin's dequantized ones), rounded to x's dtype and multiplied in it. The low and high nibbles
meet the even and odd columns of the activation in two dots, so no register shuffle is needed.
The block scales may be passed already as fp32 (the CPU interpreter's e4m3 casts round wrongly;
tests/quant/test_nvfp4_kernel.py); on the GPU they are read as e4m3.
Torch twin: `dlmrt.ops.nvfp4.moe_mlp_nvfp4` (dequantize, then the bf16 op).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_mlp import BLOCK_M, _tile, plan  # relative: kernels/ imports nothing from dlmrt

NVFP4 = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (packed, block scales, global scales)


@triton.jit
def _e2m1(c):
    """fp32 value of 4-bit codes c (int32 0..15): sign | exponent (2 bits) | mantissa (1 bit)."""
    e = (c >> 1) & 3
    m = (c & 1).to(tl.float32)
    pow2 = tl.where(e == 3, 4.0, tl.where(e == 2, 2.0, 1.0))
    mag = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * pow2)
    return tl.where(c >= 8, -mag, mag)


@triton.jit
def _weights(w_base, s_base, k0, j, mask, g):
    """(low, high) nibbles of one [BK/2, BN] byte tile in fp32: code * (block scale * g)."""
    b = tl.load(w_base + (k0 // 2 + j)[:, None], mask=mask, other=0).to(tl.int32)
    s = tl.load(s_base + ((k0 + 2 * j) // 16)[:, None], mask=mask, other=0.0).to(tl.float32) * g
    return _e2m1(b & 15) * s, _e2m1(b >> 4) * s


@triton.jit
def _dot2(a_base, k0, j, a_mask, w_base, s_base, w_mask, g, acc, IEEE: tl.constexpr):
    """acc + a[:, k0:k0+BK] @ w[k0:k0+BK, :] with the even / odd columns of a met separately."""
    a_even = tl.load(a_base + (k0 + 2 * j)[None, :], mask=a_mask, other=0.0)
    a_odd = tl.load(a_base + (k0 + 2 * j + 1)[None, :], mask=a_mask, other=0.0)
    lo, hi = _weights(w_base, s_base, k0, j, w_mask, g)
    lo, hi = lo.to(a_even.dtype), hi.to(a_even.dtype)  # rounded once, as the twin's dequantize
    if IEEE:
        acc = tl.dot(a_even, lo, acc, input_precision="ieee")
        acc = tl.dot(a_odd, hi, acc, input_precision="ieee")
    else:
        acc = tl.dot(a_even, lo, acc)
        acc = tl.dot(a_odd, hi, acc)
    return acc


@triton.jit
def _gate_up_kernel(
    x_ptr, gw_ptr, gs_ptr, gg_ptr, uw_ptr, us_ptr, ug_ptr,
    h_ptr, order_ptr, tile_end_ptr, counts_ptr, starts_ptr,
    stride_x, stride_gwe, stride_gwn, stride_gse, stride_gsn,
    stride_uwe, stride_uwn, stride_use, stride_usn,
    H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, E: tl.constexpr,
    E_PAD: tl.constexpr, GELU: tl.constexpr, IEEE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    e, e64, valid, pos = _tile(tile_end_ptr, counts_ptr, starts_ptr, E, E_PAD, BM)
    if e >= E:
        return
    pair = tl.load(order_ptr + pos, mask=valid, other=0)
    row = (pair // TOP_K).to(tl.int64)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = n < INTER
    j = tl.arange(0, BK // 2)
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    gg = tl.load(gg_ptr + e64)
    ug = tl.load(ug_ptr + e64)
    a_base = x_ptr + row[:, None] * stride_x
    gw = gw_ptr + e64 * stride_gwe + n[None, :] * stride_gwn
    gs = gs_ptr + e64 * stride_gse + n[None, :] * stride_gsn
    uw = uw_ptr + e64 * stride_uwe + n[None, :] * stride_uwn
    us = us_ptr + e64 * stride_use + n[None, :] * stride_usn
    for k0 in range(0, H, BK):
        k_ok = k0 + 2 * j < H
        a_mask = valid[:, None] & k_ok[None, :]
        w_mask = k_ok[:, None] & n_ok[None, :]
        acc_g = _dot2(a_base, k0, j, a_mask, gw, gs, w_mask, gg, acc_g, IEEE)
        acc_u = _dot2(a_base, k0, j, a_mask, uw, us, w_mask, ug, acc_u, IEEE)
    dtype = h_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    if GELU:  # tanh approximation; tanh(z) = 2 sigmoid(2z) - 1 (as kernels/moe_mlp.py)
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * z)))
    else:
        act = g / (1.0 + tl.exp(-g))
    h = act.to(dtype).to(tl.float32) * acc_u.to(dtype).to(tl.float32)
    out = h_ptr + pos.to(tl.int64)[:, None] * INTER + n[None, :]
    tl.store(out, h.to(dtype), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(
    h_ptr, dw_ptr, ds_ptr, dg_ptr, w_ptr, y_ptr, order_ptr, tile_end_ptr, counts_ptr, starts_ptr,
    stride_dwe, stride_dwn, stride_dse, stride_dsn,
    H: tl.constexpr, INTER: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
    IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    e, e64, valid, pos = _tile(tile_end_ptr, counts_ptr, starts_ptr, E, E_PAD, BM)
    if e >= E:
        return
    pair = tl.load(order_ptr + pos, mask=valid, other=0).to(tl.int64)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = n < H
    j = tl.arange(0, BK // 2)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    dg = tl.load(dg_ptr + e64)
    a_base = h_ptr + pos.to(tl.int64)[:, None] * INTER
    dw = dw_ptr + e64 * stride_dwe + n[None, :] * stride_dwn
    ds = ds_ptr + e64 * stride_dse + n[None, :] * stride_dsn
    for k0 in range(0, INTER, BK):
        k_ok = k0 + 2 * j < INTER
        acc = _dot2(
            a_base, k0, j, valid[:, None] & k_ok[None, :], dw, ds,
            k_ok[:, None] & n_ok[None, :], dg, acc, IEEE,
        )  # fmt: skip
    weight = tl.load(w_ptr + pair, mask=valid, other=0.0).to(tl.float32)
    y = acc.to(h_ptr.dtype.element_ty).to(tl.float32) * weight[:, None]  # as torch: y, then y * w
    tl.store(y_ptr + pair[:, None] * H + n[None, :], y, mask=valid[:, None] & n_ok[None, :])


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
    bk: int = 64,  # a multiple of 32 (each dot takes BK/2 >= 16 columns) and of 16 (the blocks)
    warps: int = 4,
    stages: int | None = None,
) -> torch.Tensor:
    """x [rows, H], weights / index [rows, k]; gate / up ([E, I, H/2] uint8, [E, I, H/16] e4m3 or
    fp32, [E] fp32), down ([E, H, I/2], [E, H, I/16], [E]) with unit-stride rows -> [rows, H]."""
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"moe_mlp_nvfp4: unknown activation {activation!r}")
    if bk % 32:
        raise ValueError(f"moe_mlp_nvfp4: bk must be a multiple of 32, got {bk}")
    rows, top_k = index.shape
    experts, hidden, half = down[0].shape
    inter = 2 * half
    for t in (*gate[:2], *up[:2], *down[:2]):
        if t.stride(-1) != 1:
            raise ValueError("moe_mlp_nvfp4: weight rows and block scales need unit stride")
    x = x if x.stride(-1) == 1 else x.contiguous()
    order, tile_end, counts, starts, max_tiles = plan(index, experts)
    h = torch.empty((index.numel(), inter), dtype=x.dtype, device=x.device)  # sorted order
    y = torch.empty((rows, top_k, hidden), dtype=torch.float32, device=x.device)
    common = dict(E=experts, E_PAD=triton.next_power_of_2(experts), IEEE=x.dtype == torch.float32)
    launch = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    _gate_up_kernel[(max_tiles, triton.cdiv(inter, bn))](
        x, *gate, *up, h, order, tile_end, counts, starts, x.stride(0), *_strides(gate),
        *_strides(up), hidden, inter, TOP_K=top_k, GELU=activation == "gelu_tanh",
        BM=BLOCK_M, BN=bn, BK=bk, **common, **launch,
    )  # fmt: skip
    _down_kernel[(max_tiles, triton.cdiv(hidden, bn))](
        h, *down, weights.contiguous(), y, order, tile_end, counts, starts, *_strides(down),
        hidden, inter, BM=BLOCK_M, BN=bn, BK=bk, **common, **launch,
    )  # fmt: skip
    return y.sum(1).to(x.dtype)
