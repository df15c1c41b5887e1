"""How our arena attention kernel launches for a shape: split-KV or one pass, and its tiles.

The table itself stays with the kernels (`kernels/arena_attention.py`'s `tile_config`,
`kernels/arena_attention_split.py`'s `pick_splits`: pure functions of the shape and the GPU); the
choice for each shape is made here, once, recorded in the choices registry (`ops/choices.py`) and
passed to the kernel, so a launch never re-derives it.
"""

from __future__ import annotations

import importlib

import torch

from dlmrt.ops import choices

Launch = tuple[int, tuple[int, int, int, int]]  # (key splits, (BLOCK_M, BLOCK_N, warps, stages))
_LAUNCH: dict[tuple, Launch] = {}  # shape key -> the registry's pick: the per-call lookup


def launch(q: torch.Tensor, k: torch.Tensor) -> Launch:
    """(splits, tiles) of `kernels/arena_attention.arena_attention` for q [heads, rows, head_dim]
    over one arena layer k [kv_heads, arena, head_dim]."""
    heads, rows, head_dim = q.shape
    key = (heads, rows, head_dim, k.shape[1], q.dtype, q.device)
    if key not in _LAUNCH:
        kernel = importlib.import_module("dlmrt._kernels.arena_attention")
        device = importlib.import_module("dlmrt._kernels.device")
        sms = device.sm_count(q.device) if q.is_cuda else 132
        splits = kernel.pick_splits(rows, heads, k.shape[1], sms)
        ieee = q.dtype == torch.float32
        tiles = kernel.tile_config(rows, head_dim, ieee, device.shared_memory(q.device))
        bm, bn, warps, stages = tiles
        pick = (
            f"split-KV kernel, {splits} key splits"
            if splits > 1
            else (f"one-pass kernel, {bm}x{bn} tiles, {warps} warps, {stages} stages")
        )
        what = f"arena attention launch: {heads} heads x {rows} rows over {k.shape[1]} keys"
        what += f", head_dim {head_dim}, {str(q.dtype).removeprefix('torch.')}"
        choices.record(what, pick, "shape table, kernels/arena_attention.py")
        _LAUNCH[key] = (splits, tiles)
    return _LAUNCH[key]
