"""NVFP4 block scales chosen by the layer-output error under a local Hessian (`dlmrt quantize`).

For a linear y = W x with calibration inputs X, the output error of a quantized W is
‖(W − Q(W)) X‖² = Σ_rows δᵀ H δ with H = XᵀX and δ a row of W − Q(W). With the diagonal of H
(`--hessian diag`, the paper's DiffusionGemma choice) the error splits into independent blocks of
16: Σ_k h_k δ_k², so each block's scale can be searched alone; `--hessian block` keeps the 16 × 16
diagonal blocks H_b of H (each block's own error δ_bᵀ H_b δ_b, the correlations inside a block;
the cross-block terms are dropped, which keeps the search per block). `search_nvfp4` tries candidate
scales c · amax16 / 6 (c in `CANDIDATES`, each rounded to e4m3 as stored) per block and keeps the
one of least weighted error; c = 1 is the plain amax scale, so the search never does worse than it
on its own objective. Global scale: amax / (6 · 448) as ModelOpt. Stacked experts [E, N, K] take a
Hessian per expert [E, K] (the tokens routed to each expert).
"""

from __future__ import annotations

import torch

from dlmrt.formats.nvfp4 import BLOCK, E2M1_MAX, Nvfp4Weight, check_k, encode, global_scale_of

# Fractions of the amax scale tried per block: 1.0 first (ties keep amax), then smaller scales
# (clip the block's outlier to shrink everyone else's step) and a few larger ones.
CANDIDATES = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 1.05, 1.1)


def _quad(d: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """dᵀ H d per block of 16: fp32 [..., N, K/16] for d [..., N, K] and h a diagonal [..., K]
    or 16 × 16 blocks [..., K/16, 16, 16]."""
    if h.dim() == d.dim() - 1:  # diagonal
        return (d**2 * h.unsqueeze(-2)).unflatten(-1, (-1, BLOCK)).sum(-1)
    db = d.unflatten(-1, (-1, BLOCK))  # [..., N, B, 16]
    return torch.einsum("...nbi,...bij,...nbj->...nb", db, h, db)


def _block_error(w: torch.Tensor, q: Nvfp4Weight, h: torch.Tensor) -> torch.Tensor:
    """(w − q)ᵀ H (w − q) per block: fp32 [..., N, K/16]."""
    return _quad(w.float() - q.dequantize(torch.float32), h)


def _check_h(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    lead, k = tuple(w.shape[:-2]), w.shape[-1]
    diag, block = (*lead, k), (*lead, k // BLOCK, BLOCK, BLOCK)
    if tuple(h.shape) not in (diag, block):
        raise ValueError(
            f"search_nvfp4: Hessian of shape {list(h.shape)}, expected a diagonal {list(diag)} "
            f"or 16 x 16 blocks {list(block)} for a weight {list(w.shape)}"
        )
    return h.float().to(w.device)


def search_nvfp4(
    w: torch.Tensor, h: torch.Tensor, candidates: tuple[float, ...] = CANDIDATES
) -> Nvfp4Weight:
    """w [N, K] / [E, N, K] with h = diag(XᵀX) [K] / [E, K] or its 16 × 16 diagonal blocks
    [K/16, 16, 16] / [E, K/16, 16, 16]: per block the candidate scale of least δᵀ H δ."""
    check_k(w, "search_nvfp4")
    h = _check_h(w, h)
    amax16 = w.detach().float().abs().unflatten(-1, (-1, BLOCK)).amax(dim=-1)
    g = global_scale_of(w)
    best = encode(w, amax16 / E2M1_MAX, g)
    best_err = _block_error(w, best, h)
    packed, scale = best.packed.clone(), best.block_scale.clone()
    for c in candidates[1:]:
        q = encode(w, amax16 * (c / E2M1_MAX), g)
        err = _block_error(w, q, h)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        scale = torch.where(better, q.block_scale.view(torch.uint8), scale.view(torch.uint8))
        scale = scale.view(q.block_scale.dtype)
        byte_better = better.repeat_interleave(BLOCK // 2, dim=-1)  # 8 bytes per block
        packed = torch.where(byte_better, q.packed, packed)
    return Nvfp4Weight(packed, scale, g)


def output_error(w: torch.Tensor, q: Nvfp4Weight, h: torch.Tensor) -> float:
    """Relative layer-output error Σ δᵀ H δ / Σ wᵀ H w under h (as `search_nvfp4`; 0: exact)."""
    h = _check_h(w, h)
    num = _block_error(w, q, h).sum()
    den = _quad(w.float(), h).sum()
    return float(num / den.clamp_min(1e-30))
