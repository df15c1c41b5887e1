"""DiffusionGemma's per-layer norms and residual adds, two launches instead of fourteen.

A Gemma-4 layer normalises its residual stream seven times (`dlmrt/models/diffusion_gemma.py:
Layer`); as torch ops each norm, add, scale and the layer scalar is a launch of its own over the
whole [rows, hidden] stream. Two row-wise kernels do the same arithmetic with the same roundings
(Gemma's RMSNorm: x * rsqrt(mean(x^2) + eps) * w in fp32, one cast; every add and product rounded
to the dtype where torch rounds it):

- `attn_residual`: after attention, r = h + norm_pa(attn), and the three inputs read from r:
  norm_ff(r) (dense MLP), norm_ff2(r) (experts) and the router's weightless norm(r) * scale * root.
- `layer_out`: at the layer's end, out = (r + norm_pf(norm_pf1(dense) + norm_pf2(moe))) * s, with s
  the layer scalar of the row's kind (canvas rows: the decoder's, context rows: the encoder's).

One program per row; the mean of squares is a tree sum and the inverse root an rsqrt (torch sums in
another order and takes pow(-0.5): a few fp32 ulp apart, so a bf16 output can move by a rounding
step; tests/ops/test_gemma_norms.py). Torch twins: `dlmrt/ops/gemma.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _inv_rms(x, n, eps):
    return tl.rsqrt(tl.sum(x * x, 0) / n + eps)


@triton.jit
def _gain(w_ptr, offs, mask):
    return tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _round(x, dtype: tl.constexpr):
    return x.to(dtype).to(tl.float32)


@triton.jit
def _attn_residual_kernel(
    attn_ptr, h_ptr, w_pa_ptr, w_ff_ptr, w_ff2_ptr, scale_ptr, r_ptr, ff_ptr, ff2_ptr, router_ptr,
    n, eps, root, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64) * n
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    dtype = r_ptr.dtype.element_ty
    a = tl.load(attn_ptr + row + offs, mask=mask, other=0.0).to(tl.float32)
    h = tl.load(h_ptr + row + offs, mask=mask, other=0.0).to(tl.float32)
    r = _round(h + _round(a * _inv_rms(a, n, eps) * _gain(w_pa_ptr, offs, mask), dtype), dtype)
    tl.store(r_ptr + row + offs, r.to(dtype), mask=mask)
    y = r * _inv_rms(r, n, eps)
    tl.store(ff_ptr + row + offs, (y * _gain(w_ff_ptr, offs, mask)).to(dtype), mask=mask)
    tl.store(ff2_ptr + row + offs, (y * _gain(w_ff2_ptr, offs, mask)).to(dtype), mask=mask)
    x = _round(_round(y, dtype) * _gain(scale_ptr, offs, mask), dtype) * root
    tl.store(router_ptr + row + offs, x.to(dtype), mask=mask)


@triton.jit
def _layer_out_kernel(
    dense_ptr, moe_ptr, r_ptr, w_pf1_ptr, w_pf2_ptr, w_pf_ptr, canvas_ptr, dec_ptr, enc_ptr,
    out_ptr, n, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    i = tl.program_id(0)
    row = i.to(tl.int64) * n
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    dtype = out_ptr.dtype.element_ty
    d = tl.load(dense_ptr + row + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(moe_ptr + row + offs, mask=mask, other=0.0).to(tl.float32)
    t1 = _round(d * _inv_rms(d, n, eps) * _gain(w_pf1_ptr, offs, mask), dtype)
    t2 = _round(m * _inv_rms(m, n, eps) * _gain(w_pf2_ptr, offs, mask), dtype)
    t = _round(t1 + t2, dtype)
    t = _round(t * _inv_rms(t, n, eps) * _gain(w_pf_ptr, offs, mask), dtype)
    r = tl.load(r_ptr + row + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.where(tl.load(canvas_ptr + i) != 0, tl.load(dec_ptr), tl.load(enc_ptr)).to(tl.float32)
    tl.store(out_ptr + row + offs, (_round(r + t, dtype) * s).to(dtype), mask=mask)


def _launch_shape(n: int) -> dict:
    return {"BLOCK": triton.next_power_of_2(n), "num_warps": 8 if n > 2048 else 4}


def attn_residual(
    attn: torch.Tensor,
    h: torch.Tensor,
    gains: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    router_scale: torch.Tensor,
    root: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """attn, h [rows, n] contiguous; gains (post-attention, pre-feedforward, pre-feedforward-2)
    -> (r, ff input, experts input, router input), each [rows, n]."""
    rows, n = h.shape
    r, ff, ff2, router = (torch.empty_like(h) for _ in range(4))
    _attn_residual_kernel[(rows,)](
        attn, h, *gains, router_scale, r, ff, ff2, router, n, eps, root,
        **_launch_shape(n), **pdl.launch(),
    )  # fmt: skip
    return r, ff, ff2, router


def layer_out(
    dense: torch.Tensor,
    moe: torch.Tensor,
    r: torch.Tensor,
    gains: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    is_canvas: torch.Tensor,
    scalars: tuple[torch.Tensor, torch.Tensor],
    eps: float,
) -> torch.Tensor:
    """dense, moe, r [rows, n] contiguous; gains (post-feedforward-1, -2, post-feedforward);
    is_canvas [rows] uint8 (nonzero: a canvas row); scalars (decoder's, encoder's) one-element
    tensors -> [rows, n]."""
    rows, n = r.shape
    out = torch.empty_like(r)
    _layer_out_kernel[(rows,)](
        dense, moe, r, *gains, is_canvas, *scalars, out, n, eps,
        **_launch_shape(n), **pdl.launch(),
    )  # fmt: skip
    return out
