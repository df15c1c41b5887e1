"""KVCache: one static contiguous arena per request, allocated once for prompt + max_new_tokens.

Layout [layers, kv_heads, max_len, head_dim] for K and for V. Rows of the active block are scratch
while it is denoised (each round writes them) and become permanent with its commit pass. The arena
starts zeroed so masked-out rows can never inject NaN through 0 * garbage in attention.
"""

from __future__ import annotations

import torch


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
