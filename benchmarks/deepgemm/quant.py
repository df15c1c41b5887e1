"""DeepGEMM's FP8 block scales in torch: the casts, their dequantization, the reference product
and the error measures the benchmark checks each DeepGEMM result with. Pure torch (CPU or GPU).

The casts are twins of DeepGEMM's own helpers in deep_gemm/utils/math.py with use_ue8m0=False
(the SM90 recipe: fp32 scales, tests/generators.py `get_ue8m0_usage` is False on arch 9):
`per_token_cast_to_fp8` (activations: one scale per row and 128 columns, "1x128") and
`per_block_cast_to_fp8` (weights: one scale per 128 x 128 block). Same arithmetic, op for op
(amax clamped to 1e-4, scale = amax / 448, codes = x * (1 / scale) cast to e4m3), so the codes and
scales are bit-identical to DeepGEMM's (the benchmark checks that on every shape it runs).
Leading dims (a group of experts) are allowed: the last two dims are the matrix.
"""

from __future__ import annotations

import torch

GRAN = 128  # the K granularity of both scales, and the N granularity of the weight's
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
AMAX_FLOOR = 1e-4  # deep_gemm/utils/math.py clamps every amax to this


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(*x.shape[:-2], rows, cols, dtype=x.dtype, device=x.device)
    out[..., : x.shape[-2], : x.shape[-1]] = x
    return out


def per_token_cast(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., m, k] -> (e4m3 codes [..., m, k], fp32 scales [..., m, ceil(k / 128)]):
    `per_token_cast_to_fp8(x, use_ue8m0=False)`."""
    *lead, m, k = x.shape
    padded = _pad_to(x, m, -(-k // GRAN) * GRAN)
    view = padded.view(*lead, m, -1, GRAN)
    amax = view.abs().float().amax(dim=-1).clamp(AMAX_FLOOR)
    sf = amax / FP8_MAX
    q = (view * (1.0 / sf.unsqueeze(-1))).to(FP8).view(*lead, m, -1)[..., :k].contiguous()
    return q, sf


def per_block_cast(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., n, k] -> (e4m3 codes [..., n, k], fp32 scales [..., ceil(n / 128), ceil(k / 128)]):
    `per_block_cast_to_fp8(w, use_ue8m0=False)`."""
    *lead, n, k = w.shape
    nb, kb = -(-n // GRAN), -(-k // GRAN)
    padded = _pad_to(w, nb * GRAN, kb * GRAN)
    view = padded.view(*lead, nb, GRAN, kb, GRAN)
    amax = view.abs().float().amax(dim=(-3, -1), keepdim=True).clamp(AMAX_FLOOR)
    sf = amax / FP8_MAX
    q = (view * (1.0 / sf)).to(FP8).view_as(padded)[..., :n, :k].contiguous()
    return q, sf.view(*lead, nb, kb)


def dequant_tokens(q: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """fp32 values of `per_token_cast`'s codes: each 128-column group times its row's scale."""
    k = q.shape[-1]
    return q.float() * sf.repeat_interleave(GRAN, dim=-1)[..., :k]


def dequant_blocks(q: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """fp32 values of `per_block_cast`'s codes: each 128 x 128 block times its scale."""
    n, k = q.shape[-2:]
    full = sf.repeat_interleave(GRAN, dim=-2)[..., :n, :].repeat_interleave(GRAN, dim=-1)
    return q.float() * full[..., :k]


def reference_fp8(a: tuple, b: tuple) -> torch.Tensor:
    """fp32 A @ B^T of the dequantized operands: a = (codes [.., m, k], 1x128 scales), b = (codes
    [.., n, k], 128x128 scales); what DeepGEMM's fp8_gemm_nt computes before its bf16 rounding."""
    return dequant_tokens(*a) @ dequant_blocks(*b).transpose(-1, -2)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """|got - want| / |want| (Frobenius, fp64)."""
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def calc_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    """DeepGEMM's own test measure (deep_gemm/testing/numeric.py `calc_diff`): 1 - 2<x, y> /
    (|x|^2 + |y|^2); its FP8 tests require < 1e-3."""
    x, y = got.double(), want.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)


def rounded(row: dict) -> dict:
    """A result row with its µs rounded to 0.001 (errors keep their digits)."""
    return {
        k: round(v, 3) if k.endswith("_us") and isinstance(v, float) else v for k, v in row.items()
    }
