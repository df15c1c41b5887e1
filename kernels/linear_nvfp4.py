"""A dense linear with NVFP4 weights, weight-only W4A16: y = x @ W^T, W [N, K] read packed.

The older decode of the routed experts (`_dot`: [BN, BK/2] byte tiles of weight rows, one e4m3
block scale per 16 weights, bit-placement E2M1 -> fp16 (kernels/e2m1_decode.py's `fp16_codes`
placement), the nibbles interleaved back into K order, the global scale times 2^14, one dot per K
step; the experts now decode into nibble halves instead, kernels/moe_mlp_nvfp4.py) over a plain (rows, N) grid: the kernel that serves a dense NVFP4
projection (the models' dense MLPs on CUDA: `dlmrt/impls/nvfp4_linear.py`). The global scale is
one per output row (a scalar is expanded), so gate|up run as one GEMM while each half keeps its
own scale; each row's block scales are multiplied by that row's scale, as the twin's dequantize.
Rounded where torch rounds F.linear: fp32 sums, one cast to x's dtype. Capturable (no host sync,
static grid). Torch twin: `dlmrt.ops.nvfp4.linear_nvfp4` (dequantize, then F.linear).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# relative: kernels/ imports nothing from dlmrt
from . import pdl
from .moe_mlp import mma
from .moe_mlp_nvfp4 import _load_w


@triton.jit
def _decode(b, s):
    """[BN, BK] weights in fp32 from the bytes b [BN, BK/2] (int32) and fp32 multipliers s
    [BN, BK/16] (block scale * global scale * 2^14). A code's sign and 3 magnitude bits placed at
    fp16 bits 15 and 11..9 make the fp16 number code value * 2^-14 exactly (exponent field = the
    code's exponent bits, mantissa = its mantissa bit, the subnormal case included), so the
    2^14 folded into s gives the twin's fp32 product bit for bit, with no per-code selects."""
    lo = ((b & 7) << 9) | ((b & 8) << 12)
    hi = ((b & 0x70) << 5) | ((b & 0x80) << 8)
    w = tl.interleave(lo.to(tl.int16), hi.to(tl.int16))  # element 2j is the low nibble
    w = w.to(tl.float16, bitcast=True).to(tl.float32)
    BN: tl.constexpr = w.shape[0]
    BK: tl.constexpr = w.shape[1]
    w = tl.reshape(w, (BN, BK // 16, 16)) * s[:, :, None]
    return tl.reshape(w, (BN, BK))


@triton.jit
def _dot(a_base, k0, K: tl.constexpr, a_rows, w_base, s_base, n_ok, g, acc, BK: tl.constexpr,
         IEEE: tl.constexpr):  # fmt: skip
    """acc + a[:, k0:k0+BK] @ w[k0:k0+BK, :]^T: one contiguous activation tile, one dot (the dense
    linear's step, kernels/linear_nvfp4.py)."""
    b, s = _load_w(w_base, s_base, k0, K, n_ok, BK)
    return _decoded_mma(_load_a(a_base, k0, K, a_rows, BK), b, s, g, acc, False, IEEE)


@triton.jit
def _load_a(a_base, k0, K: tl.constexpr, a_rows, BK: tl.constexpr):
    kk = k0 + tl.arange(0, BK)
    return tl.load(a_base + kk[None, :], mask=a_rows[:, None] & (kk < K)[None, :], other=0.0)


@triton.jit
def _decoded_mma(a, b, s, g, acc, SWAP: tl.constexpr, IEEE: tl.constexpr):
    """acc + a @ decode(b, s)^T ([BM, BN]; SWAP: its transpose, see moe_mlp.py's `acc_zeros`)."""
    w = _decode(b.to(tl.int32), s.to(tl.float32) * g).to(a.dtype)  # rounded once, as the twin
    return mma(a, w, acc, SWAP, IEEE)


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, s_ptr, g_ptr, y_ptr, M, stride_x, stride_wn, stride_sn, stride_y,
    N: tl.constexpr, K: tl.constexpr, IEEE: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_ok, n_ok = m < M, n < N
    # this tile's rows' global scales, times 2^14 to undo the decode's 2^-14 (exact), as [BN, 1]
    # beside the [BN, BK/16] block scales they multiply
    g = (tl.load(g_ptr + n, mask=n_ok, other=0.0) * 16384.0)[:, None]
    a_base = x_ptr + m.to(tl.int64)[:, None] * stride_x
    w_base = w_ptr + n[:, None] * stride_wn
    s_base = s_ptr + n[:, None] * stride_sn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        acc = _dot(a_base, k0, K, m_ok, w_base, s_base, n_ok, g, acc, BK, IEEE)
    out = y_ptr + m.to(tl.int64)[:, None] * stride_y + n[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def linear_nvfp4(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bm: int | None = None,
    bn: int = 64,
    bk: int = 128,
    warps: int = 4,
) -> torch.Tensor:
    """x [..., K]; packed uint8 [N, K/2], block_scale e4m3 (or fp32) [N, K/16], global_scale fp32
    [N] (one per output row) or [] / [1] (expanded) -> [..., N] in x's dtype. BM: 16 for up to 16
    rows, else 64. A contiguous fp32 [N] global scale is used as it is (no copy per call)."""
    if bk % 32:
        raise ValueError(f"linear_nvfp4: bk must be a multiple of 32, got {bk}")
    n, half = packed.shape
    if x.shape[-1] != 2 * half or block_scale.shape != (n, half // 8):
        raise ValueError(
            f"linear_nvfp4: x [..., {x.shape[-1]}] does not fit packed {list(packed.shape)} / "
            f"block_scale {list(block_scale.shape)} (K = 2 x packed columns = 16 x scale columns)"
        )
    if packed.stride(-1) != 1 or block_scale.stride(-1) != 1:
        raise ValueError("linear_nvfp4: weight rows and block scales need unit stride")
    if global_scale.numel() not in (1, n):
        raise ValueError(
            f"linear_nvfp4: global_scale {list(global_scale.shape)}: expected one value or one "
            f"per output row ({n})"
        )
    x2 = x.reshape(-1, x.shape[-1])
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    rows = x2.shape[0]
    bm = bm or (16 if rows <= 16 else 64)
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    g = global_scale.float().reshape(-1).expand(n).contiguous()
    _linear_kernel[(triton.cdiv(rows, bm), triton.cdiv(n, bn))](
        x2, packed, block_scale, g, y, rows, x2.stride(0), packed.stride(0), block_scale.stride(0),
        y.stride(0), N=n, K=2 * half, IEEE=x.dtype == torch.float32, BM=bm, BN=bn, BK=bk,
        num_warps=warps, **pdl.launch(gemm=True),
    )  # fmt: skip
    return y.reshape(*x.shape[:-1], n)
