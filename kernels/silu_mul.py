"""SwiGLU activation on the fused gate_up output: out = SiLU(gate) * up, rounded like torch
(SiLU rounds to the dtype, then the product). Torch twin: `dlmrt.ops.reference.silu_mul`.
GELU: GeGLU's gelu_tanh(gate) * up instead (Gemma; twin `dlmrt.ops.gemma.gelu_mul`).
`activation` is the one SiLU / gelu_tanh of the kernels (also the expert and FP8 epilogues')."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def activation(g, GELU: tl.constexpr):
    """SiLU(g), or gelu_tanh(g) with GELU (tanh(z) = 2 sigmoid(2z) - 1), in fp32."""
    if GELU:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * z)))
    else:
        act = g / (1.0 + tl.exp(-g))
    return act


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, stride_gu, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                     GELU: tl.constexpr = False):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + n + offs, mask=mask, other=0.0).to(tl.float32)
    act = activation(g.to(tl.float32), GELU).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * n + offs, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """gate_up [rows, 2n] (gate columns first) -> [rows, n]; gelu: GeGLU's activation."""
    rows, n2 = gate_up.shape
    n = n2 // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](
        gate_up, out, gate_up.stride(0), n, BLOCK=block, num_warps=4, GELU=gelu, **pdl.launch()
    )
    return out
