"""Per-head RMSNorm + rotate-half RoPE for q or k, written head-major, optionally at arena rows.

x [rows, heads, head_dim] (a view of the fused qkv output) -> out[head, dest(row), :], where dest is
the row itself, or positions[row] when writing keys straight into the KV arena (the KV write is
fused). Rounded like the torch twin (`dlmrt.ops.reference.qk_norm_rope`): normalised row, gain
product, x*cos, rot*sin and their sum each round to the dtype. GEMMA: Gemma's norm (the gain
product in fp32, one cast; twin `dlmrt.ops.gemma.qk_norm_rope`), the RoPE roundings the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr,
    w_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    out_ptr,
    stride_xr,
    stride_xh,
    stride_cr,
    stride_oh,
    stride_or,
    eps,
    D: tl.constexpr,
    HALF: tl.constexpr,
    AT_POS: tl.constexpr,
    GEMMA: tl.constexpr = False,
    ROPE: tl.constexpr = True,  # False: the norm alone (Gemma's weightless V norm)
    HAS_W: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch: wait for the producer before the first load
        tl.extra.cuda.gdc_wait()
    row, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = tl.arange(0, D)
    partner = (offs + HALF) % D
    base = x_ptr + row * stride_xr + head * stride_xh
    x = tl.load(base + offs)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)
    w = tl.load(w_ptr + offs).to(tl.float32) if HAS_W else 1.0
    if GEMMA:
        y = (xf * inv * w).to(x.dtype).to(tl.float32)
    else:
        y = (w * (xf * inv).to(x.dtype).to(tl.float32)).to(x.dtype).to(tl.float32)
    if ROPE:
        wp = tl.load(w_ptr + partner).to(tl.float32) if HAS_W else 1.0
        xp = tl.load(base + partner).to(tl.float32)
        if GEMMA:
            yp = (xp * inv * wp).to(x.dtype).to(tl.float32)
        else:
            yp = (wp * (xp * inv).to(x.dtype).to(tl.float32)).to(x.dtype).to(tl.float32)
        rot = tl.where(offs < HALF, -yp, yp)
        c = tl.load(cos_ptr + row * stride_cr + offs).to(tl.float32)
        s = tl.load(sin_ptr + row * stride_cr + offs).to(tl.float32)
        a = (y * c).to(x.dtype).to(tl.float32)
        b = (rot * s).to(x.dtype).to(tl.float32)
        y = a + b
    dest = tl.load(pos_ptr + row) if AT_POS else row
    tl.store(
        out_ptr + head * stride_oh + dest * stride_or + offs,
        y.to(x.dtype).to(out_ptr.dtype.element_ty),  # an FP8 arena: rounded as the twin
    )


def qk_norm_rope(
    x: torch.Tensor,  # [rows, heads, head_dim], unit stride in head_dim
    weight: torch.Tensor | None,  # [head_dim]; None: no gain
    cos: torch.Tensor | None,  # [rows, head_dim]; None (with sin): no RoPE, the norm alone
    sin: torch.Tensor | None,
    eps: float,
    out: torch.Tensor | None = None,  # [heads, L, head_dim]; None: a new [heads, rows, head_dim]
    positions: torch.Tensor | None = None,  # [rows]: write out[:, positions[row]] (the KV arena)
    gemma: bool = False,  # Gemma's norm roundings (see the module docstring)
) -> torch.Tensor:
    rows, heads, d = x.shape
    if out is None:
        out = torch.empty((heads, rows, d), dtype=x.dtype, device=x.device)
    at_pos, rope = positions is not None, cos is not None
    _qk_norm_rope_kernel[(rows, heads)](
        x,
        x if weight is None else weight,
        cos if rope else x,
        sin if rope else x,
        positions if at_pos else x,
        out,
        x.stride(0),
        x.stride(1),
        cos.stride(0) if rope else 0,
        out.stride(0),
        out.stride(1),
        eps,
        D=d,
        HALF=d // 2,
        AT_POS=at_pos,
        GEMMA=gemma,
        ROPE=rope,
        HAS_W=weight is not None,
        num_warps=1 if d <= 128 else 2,
        **pdl.launch(),
    )
    return out
