"""One pass over the vocabulary per row: candidate token, confidence, entropy, log-normaliser.

Greedy (temperature 0): token = argmax, statistics of softmax(logits). Sampling (temperature T > 0):
statistics of softmax(logits / T) and the token drawn by inverse CDF from one uniform per row, so a
round consumes exactly B uniforms from the request's seeded generator whatever the vocabulary.
Under tensor parallelism the logits are this rank's vocabulary shard and every statistic (and the
draw) is combined across the ranks (`dlmrt/parallel/vocab.py`): the same proposal on every rank.
"""

from __future__ import annotations

import torch

from dlmrt import ops
from dlmrt.decoding.base import Proposal
from dlmrt.parallel import group as tp
from dlmrt.parallel import vocab


def propose(
    logits: torch.Tensor,  # [B, V]
    temperature: float,
    uniform: torch.Tensor | None = None,  # [B] in [0, 1); required when temperature > 0
) -> Proposal:
    group = tp.active()
    if group is not None:
        return _propose_sharded(logits, temperature, uniform, group)
    argmax, confidence, entropy, log_z = ops.token_stats(logits, temperature)
    if temperature <= 0:
        return Proposal(argmax, confidence, entropy, log_z)
    if uniform is None:
        raise ValueError("temperature > 0 needs uniform noise")
    p = torch.exp(logits.float() / temperature - log_z.unsqueeze(-1))
    cdf = torch.cumsum(p, dim=-1)
    target = (uniform * cdf[:, -1]).unsqueeze(-1).contiguous()
    # right=True: the first token whose cdf exceeds u * total, so u = 0 never picks a
    # zero-probability token (its cdf equals the previous one's).
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    tokens = tokens.clamp_(max=logits.shape[-1] - 1)
    confidence = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return Proposal(tokens, confidence, entropy, log_z)


def _propose_sharded(logits, temperature: float, uniform, group) -> Proposal:
    """`propose` from this rank's vocabulary shard of the logits."""
    argmax, confidence, entropy, log_z = vocab.token_stats(logits, temperature, group)
    if temperature <= 0:
        return Proposal(argmax, confidence, entropy, log_z)
    if uniform is None:
        raise ValueError("temperature > 0 needs uniform noise")
    tokens, confidence = vocab.sample(logits, temperature, log_z, uniform, group)
    return Proposal(tokens, confidence, entropy, log_z)
