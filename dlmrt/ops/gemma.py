"""DiffusionGemma's fused per-layer ops, resolved together as the op `gemma_norms`
(`implementation("gemma_norms")`: one switch for the layer, also over the Gemma modes of the
`qk_norm_rope` and `silu_mul` kernels, so that `ops.use` / DLMRT_OPS flip the whole layer).

CUDA -> kernels/gemma_norms.py, kernels/qk_norm_rope.py (Gemma's roundings) and
kernels/silu_mul.py (GeGLU); otherwise the twins below, which are the model's former torch code
op for op (`dlmrt/models/diffusion_gemma.py` ran exactly these lines before the kernels), so CPU
runs keep their bits. The kernels round where these twins round; they differ in the order of the
fp32 mean-of-squares sum, rsqrt vs pow(-0.5) and the exp-based tanh (a few fp32 ulp), which can
move a bf16 rounding by a step.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from dlmrt.ops import implementation
from dlmrt.ops.reference import gemma_rms_norm, rotate, write_rows


def _kernel(module: str, name: str):
    return getattr(importlib.import_module(f"dlmrt._kernels.{module}"), name)


def _triton() -> bool:
    return implementation("gemma_norms") == "triton"


def _fast(*xs: torch.Tensor) -> bool:
    return all(x.is_cuda and x.is_contiguous() for x in xs) and _triton()


def _heads_ok(x: torch.Tensor) -> bool:
    """x [rows, heads, head_dim] suits kernels/qk_norm_rope.py: CUDA, a power-of-two head dim
    (one tile), unit stride along it."""
    d = x.shape[-1]
    return x.is_cuda and d & (d - 1) == 0 and x.stride(-1) == 1 and _triton()


def _placed(y: torch.Tensor, out: torch.Tensor | None, positions: torch.Tensor | None):
    if out is None:
        return y
    write_rows(out, 1, positions, y)  # an FP8 arena: rounded from the dtype
    return out


def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [rows, heads, head_dim] -> RoPE(gemma_rms_norm(x)) as [heads, rows, head_dim] (the norm
    in fp32 with one cast, then rotate-half RoPE in x's dtype, as transformers); with `out`
    [heads, L, head_dim] and `positions` [rows]: written at those rows of `out` (the arena)."""
    if _heads_ok(x) and cos.stride() == sin.stride() and cos.stride(-1) == 1:
        kernel = _kernel("qk_norm_rope", "qk_norm_rope")
        return kernel(x, weight, cos, sin, eps, out, positions, gemma=True)
    y = rotate(gemma_rms_norm(x, weight, eps), cos, sin).transpose(0, 1)
    return _placed(y, out, positions)


def v_norm(
    v: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """v [rows, kv_heads, head_dim] -> its weightless Gemma RMSNorm as [kv_heads, rows, head_dim]
    (with `out` and `positions`: written at those rows of `out`, as `qk_norm_rope`)."""
    if _heads_ok(v):
        kernel = _kernel("qk_norm_rope", "qk_norm_rope")
        return kernel(v, None, None, None, eps, out, positions, gemma=True)
    return _placed(gemma_rms_norm(v, None, eps).transpose(0, 1), out, positions)


def gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up for gate_up [rows, 2n] (gate columns first), rounded as torch."""
    if gate_up.is_cuda and gate_up.stride(-1) == 1 and _triton():
        return _kernel("silu_mul", "silu_mul")(gate_up, gelu=True)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def attn_residual(
    attn: torch.Tensor,
    h: torch.Tensor,
    gains: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    router_scale: torch.Tensor,
    root: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """After attention: r = h + norm_pa(attn); -> (r, norm_ff(r), norm_ff2(r),
    norm(r) * router_scale * root), `gains` = (w_pa, w_ff, w_ff2)."""
    if _fast(attn, h):
        return _kernel("gemma_norms", "attn_residual")(attn, h, gains, router_scale, root, eps)
    w_pa, w_ff, w_ff2 = gains
    r = h + gemma_rms_norm(attn, w_pa, eps)
    router = gemma_rms_norm(r, None, eps) * router_scale * root
    return r, gemma_rms_norm(r, w_ff, eps), gemma_rms_norm(r, w_ff2, eps), router


def layer_out(
    dense: torch.Tensor,
    moe: torch.Tensor,
    r: torch.Tensor,
    gains: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    is_canvas: torch.Tensor,
    scalars: tuple[torch.Tensor, torch.Tensor],
    eps: float,
) -> torch.Tensor:
    """The layer's end: (r + norm_pf(norm_pf1(dense) + norm_pf2(moe))) * s per row, s = scalars[0]
    on canvas rows (is_canvas [rows, 1] bool), else scalars[1]; `gains` = (w_pf1, w_pf2, w_pf)."""
    if _fast(dense, moe, r, is_canvas):
        flags = is_canvas.reshape(-1).view(torch.uint8)
        return _kernel("gemma_norms", "layer_out")(dense, moe, r, gains, flags, scalars, eps)
    w_pf1, w_pf2, w_pf = gains
    dense = gemma_rms_norm(dense, w_pf1, eps)
    out = r + gemma_rms_norm(dense + gemma_rms_norm(moe, w_pf2, eps), w_pf, eps)
    return out * torch.where(is_canvas, *scalars)
