"""Producers that hand their output to an FP8 GEMM: the row's e4m3 codes and scale in one pass.

Each computes its bf16 result exactly as its plain kernel does (`rms_norm.py`, `silu_mul.py`:
rounded to the input dtype), then, still in registers, the row's amax, scale = amax / 448 and the
e4m3 codes of value / scale. No second pass over the activation, no separate quantize launch:
what `torch._scaled_mm` needs (codes [M, K], scales [M, 1] fp32) comes out of the producer. One
program per row (rows are at most a few thousand wide). Torch twins: quantize_rows(plain op),
`dlmrt/ops/fp8.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .silu_mul import activation  # relative: kernels/ imports nothing from dlmrt

FP8_MAX = 448.0
MIN_SCALE = 1e-12


@triton.jit
def row_scale(amax):
    """A row's fp32 scale from its amax: amax / 448, at least 1e-12 (an all-zero row)."""
    return tl.maximum(amax / 448.0, 1e-12)


@triton.jit
def codes(y, scale, code_dtype):
    """e4m3 codes of fp32 values y at `scale` (clamped to the finite range)."""
    return tl.minimum(tl.maximum(y / scale, -448.0), 448.0).to(code_dtype)


@triton.jit
def _store_fp8_row(y, q_ptr, s_ptr, row, offs, mask, n):
    scale = row_scale(tl.max(tl.where(mask, tl.abs(y), 0.0), 0))
    tl.store(q_ptr + row * n + offs, codes(y, scale, q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row, scale)


@triton.jit
def _rms_norm_fp8_kernel(
    x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, stride_x, stride_r, n, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * n + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / n + eps)
    y = (xf * inv).to(x.dtype).to(tl.float32)
    y = (y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
    _store_fp8_row(y.to(tl.float32), q_ptr, s_ptr, row, offs, mask, n)


@triton.jit
def _silu_mul_fp8_kernel(gu_ptr, q_ptr, s_ptr, stride_gu, n, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n + offs, mask=mask, other=0.0).to(tl.float32)
    act = activation(g.to(tl.float32), False).to(g.dtype).to(tl.float32)
    y = (act * u).to(g.dtype).to(tl.float32)
    _store_fp8_row(y, q_ptr, s_ptr, row, offs, mask, n)


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, stride_x, n, BLOCK: tl.constexpr,
                       PDL: tl.constexpr = False):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    _store_fp8_row(y, q_ptr, s_ptr, row, offs, mask, n)


def _outputs(rows: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=device)
    return q, torch.empty((rows, 1), dtype=torch.float32, device=device)


def _warps(n: int) -> int:
    return 16 if n > 8192 else 8 if n > 2048 else 4


def rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x [rows, n] (unit stride) -> (codes, scales, x + residual or None) of w * norm(x [+ r])."""
    rows, n = x.shape
    q, s = _outputs(rows, n, x.device)
    res_out = (
        torch.empty_like(x, memory_format=torch.contiguous_format) if residual is not None else x
    )
    res = residual if residual is not None else x
    _rms_norm_fp8_kernel[(rows,)](
        x, res, weight, q, s, res_out, x.stride(0), res.stride(0), n, eps,
        HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(n), num_warps=_warps(n),
        **pdl.launch(),
    )  # fmt: skip
    return q, s, res_out if residual is not None else None


def silu_mul_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gate_up [rows, 2n] (gate columns first) -> codes, scales of SiLU(gate) * up."""
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    q, s = _outputs(rows, n, gate_up.device)
    _silu_mul_fp8_kernel[(rows,)](
        gate_up, q, s, gate_up.stride(0), n, BLOCK=triton.next_power_of_2(n), num_warps=_warps(n),
        **pdl.launch(),
    )  # fmt: skip
    return q, s


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, n] (unit stride) -> per-row e4m3 codes and fp32 scales."""
    rows, n = x.shape
    q, s = _outputs(rows, n, x.device)
    _quant_rows_kernel[(rows,)](
        x, q, s, x.stride(0), n, BLOCK=triton.next_power_of_2(n), num_warps=_warps(n),
        **pdl.launch(),
    )  # fmt: skip
    return q, s
