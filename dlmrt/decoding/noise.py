"""Counter-based uniform noise: u = hash(seed, block, round, row), a pure function of device tensors.

torch's Philox state is baked into a captured CUDA graph and repeats inside a WHILE body, so the
graph modes cannot use `torch.rand`. A SplitMix64 finaliser over a counter gives the same numbers
on every device and in every execution mode (eager, per-round graph, WHILE node), so sampled
requests stay token-identical across modes and reproducible from their seed.
"""

from __future__ import annotations

import torch


def _i64(u: int) -> int:
    """An unsigned 64-bit constant as the signed int64 with the same bits (products wrap)."""
    return u - (1 << 64) if u >= 1 << 63 else u


_GOLDEN, _MIX1, _MIX2 = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)
_K_BLOCK, _K_ROUND = _i64(0x632BE59BD9B4E019), 0x85157AF5


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def counter_uniform(
    seed: torch.Tensor, block: torch.Tensor, step: torch.Tensor, rows: int
) -> torch.Tensor:  # [rows] float32 in [0, 1)
    """Uniforms for one round; seed, block (its first position) and step are int64 device scalars."""
    row = torch.arange(rows, dtype=torch.int64, device=seed.device)
    x = seed * _GOLDEN + block * _K_BLOCK + step * _K_ROUND + (row + 1) * _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    x = x ^ _shr(x, 31)
    return _shr(x, 40).to(torch.float32) * (1.0 / (1 << 24))  # top 24 bits: exact in fp32
