"""Which kernel runs DiffusionGemma's canvas attention on CUDA, and with how many key splits.

"whole": kernels/canvas_attention.py at its shipped tiles and key splits (`launch_tile`).
"split": kernels/canvas_attention_split.py, the same kernel with its key range cut into as many
splits as fill about two waves of the device's SMs (`pick_splits`), merged by the split arena
kernel's combine pass. DLMRT_CANVAS_ATTN pins it ("whole" by default: faster on an H100,
`python -m benchmarks.kernels.canvas_attention_split`). The kernel is decided once, on
the first CUDA call (again after `forget`: `ops.use`, tests), and recorded in the choices
registry (`ops/choices.py`) under "canvas attention kernel"; the split count once per shape,
under "canvas attention launch: ...". The CPU runs the torch twin and decides nothing here.
"""

from __future__ import annotations

import importlib

import torch

from dlmrt import envs
from dlmrt.ops import choices

KERNEL_KEY = "canvas attention kernel"
_KERNEL: dict[str, str] = {}  # {"pick": "whole" | "split"}: the per-call lookup
_SPLITS: dict[tuple, int] = {}  # shape key -> key splits of the split kernel


def kernel() -> str:
    """ "whole" or "split": the canvas attention kernel (deciding, and recording, on first use)."""
    if "pick" not in _KERNEL:
        pick = envs.canvas_attn()
        why = f"DLMRT_CANVAS_ATTN={pick}"
        if pick == "whole":
            why += " (the default: faster than the split kernel on an H100)"
        _KERNEL["pick"] = choices.record(KERNEL_KEY, pick, why).pick
    return _KERNEL["pick"]


def splits(q: torch.Tensor, k: torch.Tensor, window: int) -> int:
    """Key splits of kernels/canvas_attention_split.py for q [heads, rows, head_dim] over the arena
    layer k [kv_heads, arena, head_dim] with `window` (0: a full layer), recorded per shape."""
    heads, rows, head_dim = q.shape
    key = (heads, rows, head_dim, k.shape[1], window, q.dtype, q.device)
    if key not in _SPLITS:
        module = importlib.import_module("dlmrt._kernels.canvas_attention_split")
        n = module.default_splits(q, k, window)
        what = f"canvas attention launch: {heads} heads x {rows} rows over {k.shape[1]} keys"
        what += f", head_dim {head_dim}, window {window}, {str(q.dtype).removeprefix('torch.')}"
        choices.record(what, f"{n} key splits", "SM count and key span, pick_splits")
        _SPLITS[key] = n
    return _SPLITS[key]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    decoder: bool,
    window: int,
    scale: float,
) -> torch.Tensor:
    """`ops.canvas_attention` on CUDA, once its op resolved to Triton: the chosen kernel."""
    if kernel() == "split":
        module = importlib.import_module("dlmrt._kernels.canvas_attention_split")
        n = splits(q, k, window)
        return module.canvas_attention(q, k, v, positions, decoder, window, scale, n)
    module = importlib.import_module("dlmrt._kernels.canvas_attention")
    return module.canvas_attention(q, k, v, positions, decoder, window, scale)


def forget() -> None:
    """Decide again on the next call (a changed DLMRT_CANVAS_ATTN is read then)."""
    _KERNEL.clear()
    _SPLITS.clear()
    choices.forget("canvas attention ")
