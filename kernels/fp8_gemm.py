"""W8A8 GEMM for the dense FP8 linears at block rows, split over K where the output has too few
tiles to fill the GPU; deterministic.

out [M, N] = (a [M, K] e4m3 x row scale [M]) @ (w [N, K] e4m3 x channel scale [N])^T, fp32 sums,
one rounding to the output dtype (the twin: `dlmrt.ops.fp8.fp8_linear` on dequantized operands).
With `amax` the input is instead a plain activation [M, K] (bf16) and its rows' amax [M]: each
tile is quantized as it is loaded, exactly as `fp8_quant.quant_rows` would (scale = amax / 448,
codes = clamp(x / scale)), so a producer that cannot see whole rows (kernels/fp8_glu_gemm.py)
needs no quantize pass of its own.

Why beside cuBLAS (`torch._scaled_mm`, row-wise scales): at 256 rows its kernels give each
128 x 128 output tile to one SM and never split K. QwenDLM-4B's down projection (2560 x 9728)
is then 40 tiles on 132 SMs, each a 9,728-deep dot product: 25.4 µs on an H200 for 8 µs of FP8
FLOPs. Here a tile's K range is cut into `split` slices, one program each.

Split-K without output atomics, bit-identical run to run: each (tile, slice) program stores its
scaled fp32 partial in a workspace [split, M, N]; a per-tile counter tells the last program of a
tile to arrive, which sums the partials in slice order (never arrival order) and stores the
output. The counter is left at 0 by that last program, so one zeroed counter buffer serves every
call and a captured CUDA graph replays. The tiles' row blocks run side by side (program ids
m-fastest): the row tiles of one weight tile read it from HBM once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .fp8_quant import codes, row_scale  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, sa_ptr, w_ptr, sw_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, k_slice, split, stride_am, stride_wn, stride_om,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    AMAX: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    tile = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    pid_m, pid_n, s = tile % tiles_m, tile // tiles_m, tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k0 = s * k_slice
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + (k0 + rk)[None, :]
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + (k0 + rk)[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    sa = _row_scale(sa_ptr, rm, M, AMAX)
    for kk in range(0, k_slice, BK):
        if EVEN_K:  # K is whole slices of whole BK steps: rows masked only
            a = tl.load(a_ptrs, mask=rm[:, None] < M, other=0.0)
            w = tl.load(w_ptrs, mask=rn[:, None] < N, other=0.0)
        else:  # the last slice is short (or K is not whole BK steps): zeros past K
            kmask = (k0 + kk + rk)[None, :] < K
            a = tl.load(a_ptrs, mask=(rm[:, None] < M) & kmask, other=0.0)
            w = tl.load(w_ptrs, mask=(rn[:, None] < N) & kmask, other=0.0)
        if AMAX:
            a = _codes(a, sa, w.dtype)
        acc = tl.dot(a, tl.trans(w), acc)
        a_ptrs += BK
        w_ptrs += BK
    _finish(acc, tile, pid_m, pid_n, s, sa, sw_ptr, out_ptr, part_ptr, count_ptr, M, N, split,
            stride_om, BM, BN)  # fmt: skip


@triton.jit
def _row_scale(sa_ptr, rm, M, AMAX: tl.constexpr):
    """The rows' fp32 scales: given, or from their amax (the row quantizer's rule)."""
    sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
    if AMAX:
        sa = row_scale(sa)
    return sa


@triton.jit
def _codes(a, sa, code_dtype):
    """A plain activation tile as the e4m3 codes `quant_rows` gives it (rows' scales `sa`)."""
    return codes(a.to(tl.float32), sa[:, None], code_dtype)


@triton.jit
def _fp8_gemm_tma_kernel(
    a_desc, sa_ptr, w_desc, sw_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, k_slice, split, stride_om,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, AMAX: tl.constexpr = False,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """The same GEMM with operands loaded by TMA (tensor descriptors: the copy engine fetches the
    tiles, rows and K past the tensor's end read as zeros, no masks in the loop)."""
    pdl.enter(PDL)
    tile = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    pid_m, pid_n, s = tile % tiles_m, tile // tiles_m, tl.program_id(1)
    k0 = s * k_slice
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    sa = _row_scale(sa_ptr, pid_m * BM + tl.arange(0, BM), M, AMAX)
    for kk in range(0, k_slice, BK):  # a slice never reads into the next (k_slice: whole BKs)
        a = a_desc.load([pid_m * BM, k0 + kk])
        w = w_desc.load([pid_n * BN, k0 + kk])
        if AMAX:
            a = _codes(a, sa, w.dtype)
        acc = tl.dot(a, w.T, acc)
    _finish(acc, tile, pid_m, pid_n, s, sa, sw_ptr, out_ptr, part_ptr, count_ptr, M, N, split,
            stride_om, BM, BN)  # fmt: skip


@triton.jit
def _finish(
    acc, tile, pid_m, pid_n, s, sa, sw_ptr, out_ptr, part_ptr, count_ptr, M, N, split,
    stride_om, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    """Scale a tile's fp32 sums by its row scales `sa` and channel scales and store it (split 1),
    or store the slice's partial and, in the tile's last slice to arrive, sum all in slice order."""
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    sw = tl.load(sw_ptr + rn, mask=rn < N, other=0.0)
    acc = acc * sa[:, None] * sw[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    out_ptrs = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    if split == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        offs = rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(part_ptr + s * M * N + offs, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial stored before the release below
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == split - 1:  # the tile's last slice: sum all partials in slice order
            tl.debug_barrier()
            total = tl.zeros((BM, BN), dtype=tl.float32)
            for j in range(0, split):
                total += tl.load(
                    part_ptr + j * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg"
                )
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next call (and graph replay)


def tiles(m: int, n: int, bm: int, bn: int) -> int:
    """Output tiles of an [m, n] result: the size of the counter buffer a config needs."""
    return triton.cdiv(m, bm) * triton.cdiv(n, bn)


def fp8_gemm(
    a: torch.Tensor,  # [M, K] e4m3, unit stride in K
    a_scale: torch.Tensor,  # [M] or [M, 1] fp32
    w: torch.Tensor,  # [N, K] e4m3, unit stride in K
    w_scale: torch.Tensor,  # [N] fp32
    counts: torch.Tensor,  # int32 zeros, >= tiles(M, N, bm, bn) (left zeroed)
    out_dtype: torch.dtype = torch.bfloat16,
    config: tuple[int, ...] = (128, 128, 128, 1, 4, 8, 0),  # bm, bn, bk, split, stages, warps,
    # tma (1: the TMA kernel)
    amax: bool = False,  # a: a plain activation, a_scale: its rows' amax [M] (quantized here)
) -> torch.Tensor:
    """(a x a_scale) @ (w x w_scale)^T in `out_dtype`; see the module docstring."""
    m, k = a.shape
    n = w.shape[0]
    bm, bn, bk, split, stages, warps, tma = config
    k_slice = triton.cdiv(triton.cdiv(k, bk), split) * bk
    split = triton.cdiv(k, k_slice)  # no empty slice
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    part = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if split > 1 else out
    assert counts.numel() >= tiles(m, n, bm, bn), "counter buffer too small for this config"
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        _fp8_gemm_tma_kernel[(tiles(m, n, bm, bn), split)](
            TensorDescriptor.from_tensor(a, [bm, bk]), a_scale,
            TensorDescriptor.from_tensor(w, [bn, bk]), w_scale, out, part, counts,
            m, n, k, k_slice, split, out.stride(0), BM=bm, BN=bn, BK=bk, AMAX=amax,
            num_stages=stages, num_warps=warps, **pdl.launch(gemm=True),
        )  # fmt: skip
        return out
    _fp8_gemm_kernel[(tiles(m, n, bm, bn), split)](
        a, a_scale, w, w_scale, out, part, counts, m, n, k, k_slice, split,
        a.stride(0), w.stride(0), out.stride(0),
        BM=bm, BN=bn, BK=bk, EVEN_K=k % k_slice == 0, AMAX=amax,
        num_stages=stages, num_warps=warps, **pdl.launch(gemm=True),
    )  # fmt: skip
    return out
