"""A gated MLP's first half in one kernel: y = act(x @ gate^T) * (x @ up^T), in two forms of
one kernel (the constexpr SCALED): FP8 in with scales, each row's amax gathered for the down
projection's FP8 input (`fp8_glu_gemm`); or the model dtype in, no scales, no amax (`glu_gemm`).

x [M, K] e4m3 x row scale [M]; w = gate|up [2I, K] e4m3 x channel scale [2I] (gate rows first);
y [M, I] in the model dtype; amax [M] fp32 (zeroed by the caller) = max |y| over the row.

What it replaces: the gate|up GEMM storing [M, 2I] (cuBLAS), then `fp8_quant.silu_mul_fp8`
reading it back to write e4m3 codes and row scales: two launches and the [M, 2I] round trip. A
per-row scale needs the whole row's amax, which no output tile sees, so the quantization moves
to the consumer: each tile folds its |y| maxima into `amax` by atomic max (order-free: a max is
exact), and kernels/fp8_gemm.py's `amax` input form turns y into the same e4m3 codes while it
loads them (scale = amax / 448). Rounding is the unfused path's: gate and up rounded to the
dtype, act(gate) rounded, the product rounded, so y is bit-for-bit what `silu_mul` would read
given the same gate|up values (twin: `dlmrt.ops.fp8.glu_fp8`'s torch path).

A program owns a BM x BN tile of y: the gate tile and the matching up tile (rows I + n of w),
two fp32 accumulators over all of K (K is the model's hidden size: a few thousand, no split).
Operands by TMA (rows and K past the end read as zeros; a gate tile past I reads up rows, whose
columns are masked at the store).

The unscaled form (bf16: QwenDLM's / LLaDA2's dense SwiGLU, DiffusionGemma's GeGLU) replaces
cuBLAS's gate|up GEMM storing [M, 2I] and kernels/silu_mul.py reading it back. Its epilogue rounds
as that path does (the fp32 accumulators to the dtype, act(gate) to the dtype, the product), so
it differs from it only where cuBLAS's fp32 summation order rounds gate or up to the neighbouring
bf16 value: one ulp of gate or up, at most ~2 ulps of y (tests/ops/test_bf16_glu.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .silu_mul import activation  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _fp8_glu_gemm_kernel(
    a_desc, sa_ptr, w_desc, sw_ptr, y_ptr, amax_ptr, M, N_I, K, stride_ym,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GELU: tl.constexpr,
    SCALED: tl.constexpr = True, IEEE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    tile = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    pid_m, pid_n = tile % tiles_m, tile // tiles_m  # m fastest: row tiles share a weight tile
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for kk in range(0, K, BK):
        a = a_desc.load([pid_m * BM, kk])
        wg = w_desc.load([pid_n * BN, kk]).T
        wu = w_desc.load([N_I + pid_n * BN, kk]).T
        if IEEE:  # fp32 operands: full-precision products, as cuBLAS's fp32 GEMM (no TF32)
            acc_g = tl.dot(a, wg, acc_g, input_precision="ieee")
            acc_u = tl.dot(a, wu, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, wg, acc_g)
            acc_u = tl.dot(a, wu, acc_u)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    dtype = y_ptr.dtype.element_ty
    if SCALED:  # dequantize: x's row scale times the weight's channel scale
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)[:, None]
        acc_g = acc_g * sa * tl.load(sw_ptr + rn, mask=rn < N_I, other=0.0)[None, :]
        acc_u = acc_u * sa * tl.load(sw_ptr + N_I + rn, mask=rn < N_I, other=0.0)[None, :]
    g = acc_g.to(dtype)  # the unfused path's gate|up tensor, rounded
    u = acc_u.to(dtype)
    act = activation(g.to(tl.float32), GELU).to(dtype).to(tl.float32)
    y = (act * u.to(tl.float32)).to(dtype)
    mask = (rm[:, None] < M) & (rn[None, :] < N_I)
    tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :], y, mask=mask)
    if SCALED:  # the down projection's FP8 input: its rows' amax
        row_max = tl.max(tl.where(mask, tl.abs(y.to(tl.float32)), 0.0), axis=1)
        tl.atomic_max(amax_ptr + rm, row_max, mask=rm < M, sem="relaxed")


def fp8_glu_gemm(
    a: torch.Tensor,  # [M, K] e4m3, unit stride in K
    a_scale: torch.Tensor,  # [M] or [M, 1] fp32
    w: torch.Tensor,  # [2I, K] e4m3 (gate rows, then up rows)
    w_scale: torch.Tensor,  # [2I] fp32
    out_dtype: torch.dtype = torch.bfloat16,
    config: tuple[int, ...] = (128, 64, 128, 4, 8),  # bm, bn, bk, stages, warps
    gelu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [M, I] = act(gate) * up in `out_dtype`, amax [M] fp32 of |y| per row); see above."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    i = w.shape[0] // 2
    bm, bn, bk, stages, warps = config
    y = torch.empty((m, i), dtype=out_dtype, device=a.device)
    amax = torch.zeros(m, dtype=torch.float32, device=a.device)
    _fp8_glu_gemm_kernel[(triton.cdiv(m, bm) * triton.cdiv(i, bn),)](
        TensorDescriptor.from_tensor(a, [bm, bk]), a_scale,
        TensorDescriptor.from_tensor(w, [bn, bk]), w_scale, y, amax, m, i, k, y.stride(0),
        BM=bm, BN=bn, BK=bk, GELU=gelu, num_stages=stages, num_warps=warps, **pdl.launch(gemm=True),
    )  # fmt: skip
    return y, amax


def glu_gemm(
    a: torch.Tensor,  # [M, K] bf16 / fp16 / fp32, unit stride in K, 16-byte aligned rows
    w: torch.Tensor,  # [2I, K] in a's dtype (gate rows, then up rows)
    config: tuple[int, ...] = (128, 64, 64, 4, 8),  # bm, bn, bk, stages, warps
    gelu: bool = False,
) -> torch.Tensor:
    """y [M, I] = act(a @ gate^T) * (a @ up^T) in a's dtype, unscaled (see above)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = a.shape
    i = w.shape[0] // 2
    bm, bn, bk, stages, warps = config
    y = torch.empty((m, i), dtype=a.dtype, device=a.device)
    _fp8_glu_gemm_kernel[(triton.cdiv(m, bm) * triton.cdiv(i, bn),)](
        TensorDescriptor.from_tensor(a, [bm, bk]), y, TensorDescriptor.from_tensor(w, [bn, bk]),
        y, y, y, m, i, k, y.stride(0), BM=bm, BN=bn, BK=bk, GELU=gelu, SCALED=False,
        IEEE=a.dtype == torch.float32, num_stages=stages, num_warps=warps, **pdl.launch(gemm=True),
    )  # fmt: skip
    return y
