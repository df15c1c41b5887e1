"""Block-scaled FP8 weights, read into dlmrt's per-output-channel format at load.

Some FP8 checkpoints keep one scale per [bn, bk] tile of a weight (DeepSeek-V3, Qwen3-FP8:
transformers' `quant_method: "fp8"` with `weight_block_size`, the scale in `W_scale_inv`;
compressed-tensors `strategy: "block"` with `block_structure`, the scale in `W_scale`). The scale
has shape [.., ceil(N / bn), ceil(K / bk)] and w = code * scale[n // bn, k // bk].

dlmrt's kernels take one scale per output channel (`dlmrt/formats/fp8.py`), so a block-scaled
weight is dequantized tile by tile and rounded again per output channel (`quantize_per_channel`):
one more e4m3 rounding: an element moves by at most half an e4m3 step of its row's new scale
(none where a row's blocks share one scale and the row holds a code of 448; on random weights the
relative error grows from ~2.6% to ~3.8%: `tests/quant/test_block_fp8.py`). The loader logs that
it did this. Native block scales in the kernels are not built.
"""

from __future__ import annotations

import math

import torch

from dlmrt.formats.fp8 import FP8, FP8_MAX, MIN_SCALE, Fp8Weight, quantize_per_channel


def block_grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale's shape for a weight of `shape` [.., N, K] in `block` [bn, bk] tiles."""
    *lead, n, k = shape
    return (*lead, math.ceil(n / block[0]), math.ceil(k / block[1]))


def _expand(scale: torch.Tensor, shape: tuple[int, ...], block: tuple[int, int]) -> torch.Tensor:
    """scale [.., N/bn, K/bk] repeated to one value per element of `shape` [.., N, K]."""
    full = scale.float().repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return full[..., : shape[-2], : shape[-1]]


def dequantize_blocks(
    codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]
) -> torch.Tensor:
    """codes e4m3 [.., N, K] times their tile's scale, as float32."""
    return codes.float() * _expand(scale, tuple(codes.shape), block)


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes [.., N, K], fp32 scales [.., N/bn, K/bk]): amax / 448 per tile (the writer's
    block layout, and the tests' way to make a block-scaled checkpoint)."""
    *lead, n, k = w.shape
    pad_n, pad_k = -n % block[0], -k % block[1]
    tiles = torch.nn.functional.pad(w.detach().float().abs(), (0, pad_k, 0, pad_n))
    tiles = tiles.unflatten(-1, (-1, block[1])).unflatten(-3, (-1, block[0]))
    scale = (tiles.amax(dim=(-3, -1)) / FP8_MAX).clamp_min(MIN_SCALE)
    codes = (w.float() / _expand(scale, tuple(w.shape), block)).clamp(-FP8_MAX, FP8_MAX)
    return codes.to(FP8), scale


def to_per_channel(codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> Fp8Weight:
    """A block-scaled weight as dlmrt's per-output-channel `Fp8Weight` (dequantize, re-round)."""
    return quantize_per_channel(dequantize_blocks(codes, scale, block))
