"""The static KV arenas of both styles: allocated by the engine, read and written by the models.

Both start zeroed so masked-out rows can never inject NaN through 0 * garbage in attention, and
both are plain data: a model's forward writes its rows' K/V at the rows' positions and reads the
rows its visibility rule allows (`dlmrt/attention/`, `dlmrt/models/diffusion_gemma_context.py`).

KVCache      block style: K and V of [layers, kv_heads, max_len, head_dim]. Rows of the active
             block are scratch while it is denoised (each round writes them) and become
             permanent with its commit (a commit pass, or the folded joint pass); committed
             rows outlive the request, for the next one to reuse (`engine/prefix.py`).
ContextArena encoder-decoder style: per layer K and V of [kv_heads, max_len, head_dim] (layers
             differ in head count and head_dim). Arena row j holds position j. The prompt's
             rows and each committed canvas's (its encoder pass) outlive the request likewise;
             the active canvas's rows are scratch (its decoder passes write them).

`kv_cache_dtype="fp8"` stores both in e4m3 with a fixed per-tensor scale of 1 (as vLLM does
without calibrated scales): K is RMS-normalised per head before it is written (QK-norm), so its
entries are O(1), far inside e4m3's ±448; V has no norm but a trained model's values are small
too. The writers round to e4m3 from the compute dtype; the readers dequantize in registers
(`kernels/arena_attention.py`) or, on the torch paths, before the attention op. Half the arena
memory and half its read bytes; no per-head scales to calibrate or to carry in the checkpoint.
"""

from __future__ import annotations

import torch

from dlmrt.config import KV_AUTO, KV_CACHE_DTYPES  # KV_AUTO: the model's compute dtype


def arena_dtype(kv_cache_dtype: str, compute: torch.dtype) -> torch.dtype:
    """The arena's storage dtype for a `kv_cache_dtype` choice (a clear error for a bad name)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        choices = ", ".join(KV_CACHE_DTYPES)
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r}: expected one of {choices}")
    return compute if kv_cache_dtype == KV_AUTO else torch.float8_e4m3fn


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class ContextArena:
    """Per-layer K/V [kv_heads, max_len, head_dim] for `cfg.kv_heads` / `cfg.head_dims`."""

    def __init__(self, cfg, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        for heads, dim in zip(cfg.kv_heads, cfg.head_dims, strict=True):
            self.k.append(torch.zeros(heads, max_len, dim, dtype=dtype, device=device))
            self.v.append(torch.zeros(heads, max_len, dim, dtype=dtype, device=device))
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.k + self.v)
