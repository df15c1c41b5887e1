"""Forward noise of block-diffusion SFT: how many and which response tokens of a block are masked.

Per noisy block with n response tokens (the prompt tail in the first decode block is never a
candidate), the number of masked tokens k is uniform on {1, ..., n} (k = ceil(t * n) with
t ~ U(0, 1), at least 1), and the k positions are a uniform random subset. So every block
contributes at least one loss token, and every mask ratio the decoder meets, from a fully
masked block down to its last token, is trained equally often. This is the per-block t of
BD3-LM/SDAR with an exact count instead of independent Bernoulli(t) draws.
"""

from __future__ import annotations

import torch


def mask_blocks(
    group: torch.Tensor,  # [n] long: block-copy index of each candidate token, sorted ascending
    num_groups: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (masked [n] bool, ratio [n] float: k / n of the token's block)."""
    n = group.shape[0]
    sizes = torch.bincount(group, minlength=num_groups)  # [G]
    t = torch.rand(num_groups, generator=generator, dtype=torch.float64)
    k = torch.ceil(t * sizes).long().clamp(min=1)
    k = torch.minimum(k, sizes)
    # Rank of each token inside its block under a random order: sort by (group, random score).
    score = torch.rand(n, generator=generator, dtype=torch.float64)
    order = torch.argsort(group.double() + score, stable=True)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty(n, dtype=torch.long)
    rank[order] = torch.arange(n) - starts[group[order]]
    masked = rank < k[group]
    ratio = (k.double() / sizes.clamp(min=1).double())[group].float()
    return masked, ratio
