"""Per-head RMSNorm + rotate-half RoPE for q or k, written head-major, optionally at arena rows;
and the whole q|k|v of an arena pass in one launch.

`qk_norm_rope`: x [rows, heads, head_dim] (a view of the fused qkv output) -> out[head, dest(row),
:], where dest is the row itself, or positions[row] when writing keys straight into the KV arena.
`qkv_norm_rope`: one launch over the fused q|k|v heads: q normed and rotated into a new
head-major tensor, k normed, rotated and written at its arena rows, v copied to its arena rows
(three launches, and V's index_put, before).
Rounded like the torch twins (`dlmrt.ops.reference.qk_norm_rope`, `qkv_norm_rope`): normalised
row, gain product, x*cos, rot*sin and their sum each round to the dtype. RoPE rotates the first
ROT dims of a head (cos / sin [rows, ROT]; ROT < head_dim: LLaDA2's partial rotary), the rest pass
through unchanged. GEMMA: Gemma's norm (the gain product in fp32, one cast; twin
`dlmrt.ops.gemma.qk_norm_rope`), the RoPE roundings the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _normed(x, w, inv, GEMMA: tl.constexpr):
    """A head row's normalised, gained values (fp32 holding the twin's roundings)."""
    xf = x.to(tl.float32)
    if GEMMA:
        return (xf * inv * w).to(x.dtype).to(tl.float32)
    return (w * (xf * inv).to(x.dtype).to(tl.float32)).to(x.dtype).to(tl.float32)


@triton.jit
def _norm_rope(
    base, w_ptr, c_row, s_row, eps,
    D: tl.constexpr, ROT: tl.constexpr, GEMMA: tl.constexpr, ROPE: tl.constexpr,
    HAS_W: tl.constexpr,
):  # fmt: skip
    """Head rows at `base` ([HB, 1] pointers: HB heads of one row): RMSNorm (+ gain), then RoPE
    over their first ROT dims. Returns (y [HB, D] in fp32, the loaded rows: their dtype is the
    result's)."""
    offs = tl.arange(0, D)[None, :]
    x = tl.load(base + offs)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 1, keep_dims=True) / D + eps)
    w = tl.load(w_ptr + offs).to(tl.float32) if HAS_W else 1.0
    y = _normed(x, w, inv, GEMMA)
    if ROPE:
        HALF = ROT // 2
        if ROT == D:
            partner = (offs + HALF) % D
            c = tl.load(c_row + offs).to(tl.float32)
            s = tl.load(s_row + offs).to(tl.float32)
        else:  # dims >= ROT: cos 1, sin 0 -> y * 1 + rot * 0 = y exactly (they pass through)
            rotated = offs < ROT
            partner = tl.where(rotated, (offs + HALF) % ROT, offs)
            c = tl.load(c_row + offs, mask=rotated, other=1.0).to(tl.float32)
            s = tl.load(s_row + offs, mask=rotated, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner).to(tl.float32) if HAS_W else 1.0
        yp = _normed(tl.load(base + partner), wp, inv, GEMMA)
        rot = tl.where(offs < HALF, -yp, yp)
        a = (y * c).to(x.dtype).to(tl.float32)
        b = (rot * s).to(x.dtype).to(tl.float32)
        y = a + b
    return y, x


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr,
    stride_xr, stride_xh, stride_cr, stride_oh, stride_or, eps,
    D: tl.constexpr, ROT: tl.constexpr, AT_POS: tl.constexpr, HB: tl.constexpr,
    GEMMA: tl.constexpr = False,
    ROPE: tl.constexpr = True,  # False: the norm alone (Gemma's weightless V norm)
    HAS_W: tl.constexpr = True, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * HB + tl.arange(0, HB))[:, None]  # HB heads of one row
    base = x_ptr + row * stride_xr + heads * stride_xh
    c_row, s_row = cos_ptr + row * stride_cr, sin_ptr + row * stride_cr
    y, x = _norm_rope(base, w_ptr, c_row, s_row, eps, D, ROT, GEMMA, ROPE, HAS_W)
    dest = tl.load(pos_ptr + row) if AT_POS else row
    tl.store(
        out_ptr + heads * stride_oh + dest * stride_or + tl.arange(0, D)[None, :],
        y.to(x.dtype).to(out_ptr.dtype.element_ty),  # an FP8 arena: rounded as the twin
    )


@triton.jit
def _qkv_norm_rope_kernel(
    x_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_ptr, v_ptr,
    stride_xr, stride_xh, stride_cr, stride_qh, stride_qr, stride_kh, stride_kr,
    stride_vh, stride_vr, eps,
    H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr, HB: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    # HB heads of one row per program; HB divides H and KV, so a program's heads are all q, all
    # k or all v (the branch below is uniform)
    row, first = tl.program_id(0).to(tl.int64), tl.program_id(1) * HB
    heads = (first + tl.arange(0, HB))[:, None]
    offs = tl.arange(0, D)[None, :]
    base = x_ptr + row * stride_xr + heads * stride_xh
    c_row, s_row = cos_ptr + row * stride_cr, sin_ptr + row * stride_cr
    if first < H:  # query heads: into the new head-major q at their row
        y, x = _norm_rope(base, qw_ptr, c_row, s_row, eps, D, ROT, False, True, True)
        tl.store(q_ptr + heads * stride_qh + row * stride_qr + offs, y.to(x.dtype))
    else:
        dest = tl.load(pos_ptr + row)
        if first < H + KV:  # key heads: into the K arena at the row's position
            y, x = _norm_rope(base, kw_ptr, c_row, s_row, eps, D, ROT, False, True, True)
            out = k_ptr + (heads - H) * stride_kh + dest * stride_kr + offs
            tl.store(out, y.to(x.dtype).to(k_ptr.dtype.element_ty))
        else:  # value heads: copied into the V arena (an FP8 arena: rounded as write_rows)
            x = tl.load(base + offs)
            out = v_ptr + (heads - H - KV) * stride_vh + dest * stride_vr + offs
            tl.store(out, x.to(v_ptr.dtype.element_ty))


def heads_per_program(rows: int, heads: int, *counts: int) -> int:
    """Heads per program for `rows` x `heads` head rows: the most (a power of two, <= 8) that
    divides every count (the head groups a program must not straddle) while the launch keeps
    >= 1,024 programs. H200: QwenDLM's 256 rows x 48 heads as 12,288 one-warp programs
    (three waves of launch-bound programs) took 9.1 us, as 1,536 programs of 8 heads 4.0; LLaDA's
    32 x 24 (768 programs) stay one head each (1.8 us; 2.1 at four heads)."""
    hb = 8
    while hb > 1 and (any(c % hb for c in counts) or rows * heads // hb < 1024):
        hb //= 2
    return hb


def _warps(d: int, hb: int) -> int:
    """A warp per 128-wide head row, at most 4."""
    return min(4, max(1, hb * d // 128))


def qk_norm_rope(
    x: torch.Tensor,  # [rows, heads, head_dim], unit stride in head_dim
    weight: torch.Tensor | None,  # [head_dim]; None: no gain
    cos: torch.Tensor | None,  # [rows, rot <= head_dim]; None (with sin): no RoPE, the norm alone
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
    hb = heads_per_program(rows, heads, heads)
    _qk_norm_rope_kernel[(rows, heads // hb)](
        x, x if weight is None else weight, cos if rope else x, sin if rope else x,
        positions if at_pos else x, out,
        x.stride(0), x.stride(1), cos.stride(0) if rope else 0, out.stride(0), out.stride(1), eps,
        D=d, ROT=cos.shape[-1] if rope else d, AT_POS=at_pos, HB=hb, GEMMA=gemma, ROPE=rope,
        HAS_W=weight is not None, num_warps=_warps(d, hb), **pdl.launch(),
    )  # fmt: skip
    return out


def qkv_norm_rope(
    qkv: torch.Tensor,  # [rows, heads + 2 kv_heads, head_dim], unit stride in head_dim
    q_weight: torch.Tensor,  # [head_dim]
    k_weight: torch.Tensor,
    cos: torch.Tensor,  # [rows, rot <= head_dim]
    sin: torch.Tensor,
    eps: float,
    k_arena: torch.Tensor,  # [kv_heads, L, head_dim]
    v_arena: torch.Tensor,
    positions: torch.Tensor,  # [rows]
) -> torch.Tensor:
    """q (normed, rotated) as a new [heads, rows, head_dim]; k and v written at their arena rows."""
    rows, all_heads, d = qkv.shape
    kv = k_arena.shape[0]
    heads = all_heads - 2 * kv
    q = torch.empty((heads, rows, d), dtype=qkv.dtype, device=qkv.device)
    hb = heads_per_program(rows, all_heads, heads, kv)
    _qkv_norm_rope_kernel[(rows, all_heads // hb)](
        qkv, q_weight, k_weight, cos, sin, positions, q, k_arena, v_arena,
        qkv.stride(0), qkv.stride(1), cos.stride(0), q.stride(0), q.stride(1),
        k_arena.stride(0), k_arena.stride(1), v_arena.stride(0), v_arena.stride(1), eps,
        H=heads, KV=kv, D=d, ROT=cos.shape[-1], HB=hb, num_warps=_warps(d, hb), **pdl.launch(),
    )  # fmt: skip
    return q
