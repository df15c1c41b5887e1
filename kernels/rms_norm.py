"""RMSNorm with a gain, optionally fused with the residual add that precedes it.

out = w * (x / rms(x)), rounded as transformers does it: the normalised row is cast to the input
dtype before the gain multiply. With a residual: x = x + residual first (rounded to the dtype),
and that sum is returned as the new residual stream. Gemma's variant keeps the gain multiply in
fp32 and casts once at the end (optionally without a gain). Torch twins: `dlmrt.ops.reference`'s
`rms_norm`, `add_rms_norm`, `gemma_rms_norm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_r,
    n,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    GEMMA: tl.constexpr = False,  # gain in fp32, one cast at the end
    HAS_W: tl.constexpr = True,
    PDL: tl.constexpr = False,
):
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
    y = xf * inv
    if not GEMMA:
        y = y.to(x.dtype).to(tl.float32)
    if HAS_W:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    rows, n = x.shape
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    res = residual if residual is not None else x
    _rms_norm_kernel[(rows,)](
        x,
        res,
        weight,
        out,
        res_out,
        x.stride(0),
        res.stride(0),
        n,
        eps,
        HAS_RES=residual is not None,
        BLOCK=triton.next_power_of_2(n),
        num_warps=8 if n > 2048 else 4,
        **pdl.launch(),
    )
    return out, res_out


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [..., n] (contiguous) -> x / rms(x) * w in fp32, cast once (w None: no gain)."""
    n = x.shape[-1]
    flat = x.reshape(-1, n)
    out = torch.empty_like(flat)
    _rms_norm_kernel[(flat.shape[0],)](
        flat, flat, flat if weight is None else weight, out, out, n, n, n, eps,
        HAS_RES=False, BLOCK=triton.next_power_of_2(n), GEMMA=True, HAS_W=weight is not None,
        num_warps=8 if n > 2048 else 4, **pdl.launch(),
    )  # fmt: skip
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, n] (unit stride in n) -> w * x / rms(x)."""
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w * norm(x + residual), x + residual)."""
    return _launch(x, residual, weight, eps)
