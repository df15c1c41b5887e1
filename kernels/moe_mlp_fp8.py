"""Routed gated-MLP experts in FP8 W8A8: e4m3 activations times e4m3 weights on the tensor cores.

Same plan, tiles and slot sum as kernels/moe_mlp.py (device-side grouping, no host sync,
capturable). What changes is what the MMA sees. The W8A16 kernel (moe_mlp.py with `scales`)
converts every [BN, BK] weight tile to bf16 in registers before a bf16 dot, and that conversion,
not the weight bytes, bounds it. Here the weight codes go to the dot as they are read, and the
activations are e4m3 too:
- x is quantized before the kernel (`quant_groups`): one fp32 scale per row and GROUP (128)
  columns, codes x / scale;
- the gate|up epilogue quantizes its own output h = act(gate) * up per (pair, BN columns), the
  group a program holds, and stores codes + scales: the down kernel's K step is that group.
Each K step is one fp8 dot with fp32 accumulation, scaled by the activation group's scale as it
is added to the accumulator (a group's codes share one scale, so the scale is exact outside the
dot); the weights' per-output-channel scales multiply the sums in the epilogue. Per-group rather
than per-row activation scales: a gate|up program sees only BN columns of a hidden row, so a
group is all one pass can scale, and it is the finer (more accurate) choice for x as well.
Torch twin: `dlmrt.ops.moe_fp8.moe_mlp_w8a8` (activations fake-quantized with the same groups,
weights dequantized, then the bf16 op).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# relative: kernels/ imports nothing from dlmrt
from . import pdl
from .moe_mlp import _tile, acc_zeros, plan, store_weighted, tile_major
from .silu_mul import activation
from .slot_sum import slot_sum

GROUP = 128  # x's scale group along the hidden dim (= the gate|up kernel's K step)


@triton.jit
def _quant(v, mask, AXIS: tl.constexpr):
    """(codes, scale) of v quantized along AXIS: scale = amax / 448 (at least 1e-12), as
    kernels/fp8_quant.py's rows and `dlmrt.formats.fp8.quantize_rows`."""
    amax = tl.max(tl.where(mask, tl.abs(v), 0.0), AXIS)
    scale = tl.maximum(amax / 448.0, 1e-12)
    s = scale[:, None] if AXIS == 1 else scale[None, :]
    q = tl.minimum(tl.maximum(v / s, -448.0), 448.0)
    return _e4m3_grid(q), scale


@triton.jit
def _e4m3_grid(q):
    """q rounded to 3 mantissa bits, half to even (the e4m3 grid for |q| >= 2^-6, where the cast
    that follows is then exact). The GPU's cast rounds the same way; the CPU interpreter's
    halves a value that rounds up to a power of two (127 -> 64), so the tests need this."""
    bits = q.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _quant_groups_kernel(x_ptr, q_ptr, s_ptr, stride_x, K: tl.constexpr, NG: tl.constexpr,
                         NG_PAD: tl.constexpr, G: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """Program r: row r of x as [NG, G] groups -> e4m3 codes [K] and scales [NG]."""
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, NG_PAD)
    k = g[:, None] * G + tl.arange(0, G)[None, :]
    mask = k < K
    v = tl.load(x_ptr + row * stride_x + k, mask=mask, other=0.0).to(tl.float32)
    q, scale = _quant(v, mask, 1)
    tl.store(q_ptr + row * K + k, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * NG + g, scale, mask=g < NG)


@triton.jit
def _scaled_mma(a, w, s, acc, SWAP: tl.constexpr):
    """acc + (a @ w^T) * s[row] for fp8 a [BM, BK], w [BN, BK] (SWAP: acc^T + (w @ a^T) * s):
    one fp8 dot with an fp32 result, the group scale applied as it is accumulated."""
    if SWAP:
        acc += tl.dot(w, tl.trans(a)) * s[None, :]
    else:
        acc += tl.dot(a, tl.trans(w)) * s[:, None]
    return acc


@triton.jit
def _gate_up_kernel(
    xq_ptr, xs_ptr, gate_ptr, up_ptr, gate_scale_ptr, up_scale_ptr, hq_ptr, hs_ptr,
    order_ptr, tile_end_ptr, counts_ptr, starts_ptr,
    stride_ge, stride_gn, stride_ue, stride_un,
    H: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, E: tl.constexpr,
    E_PAD: tl.constexpr, GELU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    BK: tl.constexpr, SWAP: tl.constexpr, DTYPE: tl.constexpr, PDL: tl.constexpr = False,
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
    NG: tl.constexpr = (H + BK - 1) // BK  # x's scale groups per row (BK == GROUP)
    g_base = gate_ptr + e64 * stride_ge + n[:, None] * stride_gn
    u_base = up_ptr + e64 * stride_ue + n[:, None] * stride_un
    for k0 in range(0, H, BK):
        kk = k0 + tl.arange(0, BK)
        k_ok = kk < H
        a = tl.load(
            xq_ptr + row[:, None] * H + kk[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0
        )
        s = tl.load(xs_ptr + row * NG + k0 // BK, mask=valid, other=0.0)
        w_mask = n_ok[:, None] & k_ok[None, :]
        wg = tl.load(g_base + kk[None, :], mask=w_mask, other=0.0)
        wu = tl.load(u_base + kk[None, :], mask=w_mask, other=0.0)
        acc_g = _scaled_mma(a, wg, s, acc_g, SWAP)
        acc_u = _scaled_mma(a, wu, s, acc_u, SWAP)
    acc_g = tile_major(acc_g, SWAP) * tl.load(gate_scale_ptr + e64 * INTER + n, mask=n_ok)[None, :]
    acc_u = tile_major(acc_u, SWAP) * tl.load(up_scale_ptr + e64 * INTER + n, mask=n_ok)[None, :]
    # h = act(gate) * up, each rounded to the model dtype where torch rounds (moe_mlp.py's
    # store_hidden), then quantized per (pair, this program's BN columns)
    act = activation(acc_g.to(DTYPE).to(tl.float32), GELU)
    h = (act.to(DTYPE).to(tl.float32) * acc_u.to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    mask = valid[:, None] & n_ok[None, :]
    q, scale = _quant(h, mask, 1)
    pos64 = pos.to(tl.int64)
    tl.store(hq_ptr + pos64[:, None] * INTER + n[None, :], q.to(hq_ptr.dtype.element_ty), mask=mask)
    NH: tl.constexpr = (INTER + BN - 1) // BN
    tl.store(hs_ptr + pos64 * NH + tl.program_id(1), scale, mask=valid)


@triton.jit
def _down_kernel(
    hq_ptr, hs_ptr, down_ptr, down_scale_ptr, w_ptr, y_ptr,
    order_ptr, tile_end_ptr, counts_ptr, starts_ptr, stride_de, stride_dn,
    H: tl.constexpr, INTER: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP: tl.constexpr,
    DTYPE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """BK: the hidden's scale group (the gate|up kernel's BN)."""
    pdl.enter(PDL)
    e, e64, valid, pos = _tile(tile_end_ptr, counts_ptr, starts_ptr, E, E_PAD, BM)
    if e >= E:
        return
    pair = tl.load(order_ptr + pos, mask=valid, other=0).to(tl.int64)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_ok = n < H
    acc = acc_zeros(BM, BN, SWAP)
    NH: tl.constexpr = (INTER + BK - 1) // BK
    pos64 = pos.to(tl.int64)
    d_base = down_ptr + e64 * stride_de + n[:, None] * stride_dn
    for k0 in range(0, INTER, BK):
        kk = k0 + tl.arange(0, BK)
        k_ok = kk < INTER
        a = tl.load(
            hq_ptr + pos64[:, None] * INTER + kk[None, :],
            mask=valid[:, None] & k_ok[None, :],
            other=0.0,
        )
        s = tl.load(hs_ptr + pos64 * NH + k0 // BK, mask=valid, other=0.0)
        wd = tl.load(d_base + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _scaled_mma(a, wd, s, acc, SWAP)
    acc = tile_major(acc, SWAP) * tl.load(down_scale_ptr + e64 * H + n, mask=n_ok)[None, :]
    store_weighted(acc, DTYPE, w_ptr, y_ptr, pair, n, valid, n_ok, H)


def quant_groups(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, K] (unit stride) -> e4m3 codes [rows, K] and fp32 scales [rows, cdiv(K, group)]."""
    rows, k = x.shape
    ng = triton.cdiv(k, group)
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((rows, ng), dtype=torch.float32, device=x.device)
    _quant_groups_kernel[(rows,)](
        x, q, s, x.stride(0), k, ng, triton.next_power_of_2(ng), group,
        num_warps=8 if k > 2048 else 4, **pdl.launch(),
    )  # fmt: skip
    return q, s


def default_tiles(pairs: int, experts: int) -> tuple[int, int]:
    """(BM, BN): experts with many pairs each (DiffusionGemma's canvas: 2,048 pairs over 128
    experts, ~16 each) take 32-row tiles, so one tile, one read of the expert's weights, covers
    nearly every expert; a decode-sized block (LLaDA's ~1 pair per expert) 16-row ones."""
    return (32 if pairs >= 8 * experts else 16), 128


def moe_mlp_fp8(
    x: torch.Tensor,
    weights: torch.Tensor,
    index: torch.Tensor,
    gate_up: tuple[torch.Tensor, torch.Tensor],
    down: torch.Tensor,
    activation: str,
    scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    bm: int | None = None,
    bn: int | None = None,  # also the hidden's scale group and the down kernel's K step
    bn_down: int = 64,
    warps: int = 4,
    stages: int | None = None,
    swap: bool = True,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, H] (bf16 / fp16; fp32: the interpreter's tests), weights / index [rows, k], gate_up (gate [E, I, H], up [E, I, H])
    and down [E, H, I] e4m3 codes with unit-stride rows, `scales` (gate [E, I], up [E, I],
    down [E, H] fp32) -> [rows, H] in x's dtype; `add` as kernels/moe_mlp.py's."""
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"moe_mlp_fp8: unknown activation {activation!r}")
    rows, top_k = index.shape
    experts, hidden, inter = down.shape
    d_bm, d_bn = default_tiles(index.numel(), experts)
    bm, bn = bm or d_bm, bn or d_bn
    gate, up = gate_up
    for t in (gate, up, down):
        if t.dtype != torch.float8_e4m3fn or t.stride(-1) != 1:
            raise ValueError("moe_mlp_fp8: weights must be e4m3 codes with unit-stride rows")
    x = x if x.stride(-1) == 1 else x.contiguous()
    xq, xs = quant_groups(x)
    order, tile_end, counts, starts, max_tiles = plan(index, experts, bm)
    pairs = index.numel()
    hq = torch.empty((pairs, inter), dtype=torch.float8_e4m3fn, device=x.device)  # sorted order
    hs = torch.empty((pairs, triton.cdiv(inter, bn)), dtype=torch.float32, device=x.device)
    y = torch.empty((rows, top_k, hidden), dtype=torch.float32, device=x.device)
    dtype = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(x.dtype, tl.float32)
    common = dict(E=experts, E_PAD=triton.next_power_of_2(experts), SWAP=swap, DTYPE=dtype)
    launch = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    gs, us, ds = (s.float().contiguous() for s in scales)
    _gate_up_kernel[(max_tiles, triton.cdiv(inter, bn))](
        xq, xs, gate, up, gs, us, hq, hs, order, tile_end, counts, starts,
        gate.stride(0), gate.stride(1), up.stride(0), up.stride(1), hidden, inter,
        TOP_K=top_k, GELU=activation == "gelu_tanh", BM=bm, BN=bn, BK=GROUP, **common, **launch,
        **pdl.launch(gemm=True),
    )  # fmt: skip
    _down_kernel[(max_tiles, triton.cdiv(hidden, bn_down))](
        hq, hs, down, ds, weights.contiguous(), y, order, tile_end, counts, starts,
        down.stride(0), down.stride(1), hidden, inter, BM=bm, BN=bn_down, BK=bn, **common, **launch,
        **pdl.launch(gemm=True),
    )  # fmt: skip
    return slot_sum(y, x.dtype, add)
