"""DiffusionGemma's canvas attention with the key range split so that every SM works.

At DiffusionGemma's canvas (256 rows, 16 heads) the whole kernel (kernels/canvas_attention.py,
its shipped tiles) launches 4 row tiles x 16 heads x 2 column slices = 128 programs on a sliding
layer and 4 x 16 x 2 key splits = 128 on a full one: under one wave of an H100's 132 SMs, each
program looping over ~1.3k keys. Here the same kernel runs with its key range cut into as many
splits as fill about WAVES waves of the device's SMs (`pick_splits`, from the SM count and the
key span: at most one split per MIN_TILES key tiles, at most MAX_SPLITS): program (tile, head,
slice, s) folds only the s-th equal slice of whole key tiles of its visible range and writes its
unnormalised partial (acc, running max, sum: fp32), and kernels/arena_attention_split.py's
`combine_splits` merges them per row (out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s;
a split whose slice holds no key, m = -inf, weighs nothing).

The masking is the whole kernel's, unchanged (the same jit function: full / sliding window,
decoder / encoder pass, the pass start read on the device, so the launch is capturable): only
the order of the fp32 additions differs, so outputs equal the whole kernel's within fp32
rounding (the tests: 2e-4 absolute and relative in fp32 against the twin, as the whole kernel).
The slices are cut on the device from the pass's actual range (`_split_ranges`), so the split
count taken from the arena's length only bounds how thin a slice can get. Key splits need a
power-of-two head dim (the combine's columns): `pick_splits` gives 1 otherwise.
Torch twin: `dlmrt.ops.canvas.canvas_attention`.
"""

from __future__ import annotations

import torch
import triton

from . import canvas_attention as whole  # relative: kernels/ imports nothing from dlmrt
from .device import sm_count

WAVES = 2  # programs per SM the split count aims at (one resident program per SM at these tiles)
MIN_TILES = 2  # key tiles per split at the longest range: thinner slices cost more in partials
MAX_SPLITS = 16  # the combine's loads: [splits, head_dim] per program
NOMINAL_SMS = 132  # an H100's, for launches on the CPU (the interpreter)


def key_span(arena: int, rows: int, window: int) -> int:
    """The most keys a pass of `rows` rows sees in an arena of `arena` rows: the whole arena on a
    full layer (window 0), window - 1 + rows on a sliding one."""
    return arena if window <= 0 else min(arena, window - 1 + rows)


def pick_splits(
    rows: int,
    heads: int,
    head_dim: int,
    keys: int,
    sms: int,
    tiles: tuple[int, ...],
) -> int:
    """Key splits so that the grid holds about WAVES programs per SM: the programs of one split
    are cdiv(rows, BLOCK_M) x heads x head_dim / BLOCK_DV (`tiles` as `whole.launch_tile`'s);
    at most keys / (MIN_TILES x BLOCK_N) and MAX_SPLITS, at least 1 (also for a head dim that is
    not a power of two, which the combine cannot take)."""
    if min(rows, heads, head_dim, keys, sms) < 1:
        raise ValueError(
            f"pick_splits: rows {rows}, heads {heads}, head_dim {head_dim}, keys {keys}, "
            f"sms {sms}: each must be >= 1"
        )
    if head_dim & (head_dim - 1):
        return 1
    block_m, block_n, _, block_dv = tiles[:4]
    programs = triton.cdiv(rows, block_m) * heads * max(1, head_dim // block_dv)
    want = triton.cdiv(WAVES * sms, programs)
    most = max(1, keys // (MIN_TILES * block_n))
    return max(1, min(want, most, MAX_SPLITS))


def default_splits(q: torch.Tensor, k: torch.Tensor, window: int) -> int:
    """`pick_splits` for q [heads, rows, head_dim] over the arena layer k [kv_heads, arena,
    head_dim], on q's device (NOMINAL_SMS on the CPU), with the whole kernel's tiles."""
    heads, rows, head_dim = q.shape
    sms = sm_count(q.device) if q.is_cuda else NOMINAL_SMS
    tiles = whole.launch_tile(head_dim, q.dtype == torch.float32)
    return pick_splits(rows, heads, head_dim, key_span(k.shape[1], rows, window), sms, tiles)


def canvas_attention(
    q: torch.Tensor,  # [heads, rows, head_dim]
    k: torch.Tensor,  # [kv_heads, arena, head_dim] (one arena layer, this pass's rows written)
    v: torch.Tensor,  # [kv_heads, arena, head_dim]
    positions: torch.Tensor,  # [rows] int64, consecutive: start, start + 1, ...
    decoder: bool,
    window: int,  # the sliding window; 0: a full layer
    scale: float,
    splits: int | None = None,
) -> torch.Tensor:  # [heads, rows, head_dim], a view of a row-major [rows, heads, head_dim]
    """The whole kernel's attention with `splits` key splits (default: `default_splits`, chosen
    once per shape by `dlmrt/ops/canvas_launch.py` on the engine's path) merged by the combine
    pass; 1 split: the one-pass form, no partials."""
    if splits is None:
        splits = default_splits(q, k, window)
    if splits < 1:
        raise ValueError(f"canvas_attention_split: splits {splits} must be >= 1")
    return whole.canvas_attention(q, k, v, positions, decoder, window, scale, splits=splits)
