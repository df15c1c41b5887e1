"""FlashAttention-4 (`flash-attn-4`, optional) as the arena attention of a round, where it measures faster.

A round's rows are one block: every row sees the same keys, arena rows [0, (p // B + 1) * B) for
any row position p of the block. That is plain (non-causal) attention over a prefix of the arena
whose length lives on the device, which FlashAttention-4's `flash_attn_varlen_func` takes as
`seqused_k` (an int32 tensor: no host sync, CUDA-graph capturable). Passes whose rows span several
blocks (prefill, folded commits) keep our kernel: their visibility differs row by row.

Layouts: the arena is head-major [kv_heads, arena, head_dim]; FlashAttention-4 takes
[batch, seqlen, heads, head_dim] with a unit last stride and aligned other strides, so the
arena's transpose is passed as is (no copy). Its output [1, rows, heads, head_dim] is returned
as the [heads, rows, head_dim] view our kernel returns too (o_proj's reshape is then free).

Used only when all of these hold, else our Triton kernel (`kernels/arena_attention.py`) runs:
flash-attn-4 imports (detected once, logged), DLMRT_FA4 is not "off", a CUDA device of compute
capability >= 9.0, bf16 / fp16 q and arena (no FP8 arena), head_dim <= 256 and a multiple of 8,
and, under DLMRT_FA4=auto, FlashAttention-4 timed faster than our kernel for that shape (heads,
rows, kv_heads, head_dim, arena length), once, outside graph capture (`_measure`). The detection
and each shape's choice are recorded in the choices registry (`ops/choices.py`, logged once).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from dlmrt import envs
from dlmrt.ops import choices
from dlmrt.ops.timing import graph_time_us

_FN: list[Callable | None] = []  # [flash_attn_varlen_func or None], resolved on first use
_CHOICE: dict[tuple, bool] = {}  # shape key -> the registry's pick: the per-call lookup
MODULE = "flash_attn.cute"
INSTALL = "pip install 'dlmrt[fa4]'"
LIBRARY = "flash-attn-4 for block-row arena attention"  # the detection's key in the registry


def varlen_fn() -> Callable | None:
    """FlashAttention-4's `flash_attn_varlen_func`, or None (not installed / DLMRT_FA4=off), logged once."""
    if not _FN:
        fn, pick, why = None, "off", "DLMRT_FA4=off"
        if envs.fa4() != "off":
            try:
                fn, pick, why = (
                    importlib.import_module(MODULE).flash_attn_varlen_func,
                    "installed",
                    "",
                )
            except Exception as exc:  # noqa: BLE001 (any failed import means: not usable)
                pick, why = "not usable", f"{type(exc).__name__}: {exc}; {INSTALL}"
        choices.record(LIBRARY, pick, why)
        _FN.append(fn)
    return _FN[0]


def fits(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether FlashAttention-4 takes these tensors (device, dtypes, head_dim)."""
    head_dim = q.shape[-1]
    if not (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and k.dtype == q.dtype):
        return False
    if head_dim > 256 or head_dim % 8:
        return False
    return torch.cuda.get_device_capability(q.device)[0] >= 9


def visible_keys(positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """int32 [1]: the arena rows the block of `positions` sees (every row of it the same)."""
    return ((positions[:1] // block_size + 1) * block_size).to(torch.int32)


def _bshd(t: torch.Tensor) -> torch.Tensor:
    """[heads, len, d] -> the [1, len, heads, d] view FlashAttention-4 takes (no copy)."""
    return t.transpose(0, 1).unsqueeze(0)


def arena_attention(
    q: torch.Tensor,  # [heads, rows, head_dim], the rows of one block
    k: torch.Tensor,  # [kv_heads, arena, head_dim]
    v: torch.Tensor,  # [kv_heads, arena, head_dim]
    positions: torch.Tensor,  # [rows] absolute positions, all in one block
    block_size: int,
    scale: float,
    fn: Callable | None = None,
) -> torch.Tensor:  # [heads, rows, head_dim]
    """The rows' attention over the visible arena prefix through FlashAttention-4 (`fn`: its
    `flash_attn_varlen_func`, default the installed one). Same result as
    `reference.arena_attention` when the rows are one block."""
    fn = fn or varlen_fn()
    res = fn(
        _bshd(q),
        _bshd(k),
        _bshd(v),
        seqused_k=visible_keys(positions, block_size),
        softmax_scale=scale,
        causal=False,
    )
    out = res[0] if isinstance(res, tuple) else res  # (out, lse) in 4.0 betas
    return out[0].transpose(0, 1)


def _measure(q, k, v, block_size: int, scale: float, fn: Callable) -> tuple[float, float]:
    """(our kernel µs, FlashAttention-4 µs) at this shape with the whole arena visible, graph
    replay on random tensors (the arena itself is not touched)."""
    from dlmrt._kernels.arena_attention import arena_attention as ours

    qq, kk, vv = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)
    rows, arena = q.shape[1], k.shape[1]
    last = max(arena - rows, 0) // block_size * block_size  # the block that sees the most keys
    pos = torch.arange(last, last + rows, device=q.device)
    mine = graph_time_us(lambda: ours(qq, kk, vv, pos, block_size, scale))
    theirs = graph_time_us(lambda: arena_attention(qq, kk, vv, pos, block_size, scale, fn))
    return mine, theirs


def chosen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int, scale: float
) -> bool:
    """Whether this block-row arena attention runs FlashAttention-4 (decided once per shape)."""
    if (fn := varlen_fn()) is None:  # cached: cheap when absent
        return False
    key = (tuple(q.shape), tuple(k.shape), q.dtype, k.dtype, block_size, q.device)
    if key not in _CHOICE:  # decided once per key, so the per-call cost is one lookup
        what = f"arena attention {key[0]} over {key[1]}"
        if not fits(q, k):
            _CHOICE[key] = False
        elif envs.fa4() == "on":
            _CHOICE[key] = (
                choices.record(what, "flash-attn-4", "DLMRT_FA4=on").pick == "flash-attn-4"
            )
        elif torch.cuda.is_current_stream_capturing():
            return False  # no timing inside a capture (the warm-up before it decides)
        else:
            mine, theirs = _measure(q, k, v, block_size, scale, fn)
            pick = "flash-attn-4" if theirs < mine else "Triton"
            why = f"Triton {mine:.1f} us, flash-attn-4 {theirs:.1f} us"
            options = {"Triton": mine, "flash-attn-4": theirs}
            _CHOICE[key] = choices.record(what, pick, why, options).pick == "flash-attn-4"
    return _CHOICE[key]


def reset() -> None:
    """Forget the detection and the measured choices (tests)."""
    _FN.clear()
    _CHOICE.clear()
    choices.forget(LIBRARY)
    choices.forget("arena attention (")
