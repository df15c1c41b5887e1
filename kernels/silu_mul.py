"""SwiGLU activation on the fused gate_up output: out = SiLU(gate) * up, rounded like torch
(SiLU rounds to the dtype, then the product). Torch twin: `dlmrt.ops.reference.silu_mul`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # programmatic dependent launch: wait for the producer before the first load
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n + offs, mask=mask, other=0.0).to(tl.float32)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2n] (gate columns first) -> [rows, n]."""
    rows, n2 = gate_up.shape
    n = n2 // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](
        gate_up, out, gate_up.stride(0), n, BLOCK=block, num_warps=4, **pdl.launch()
    )
    return out
