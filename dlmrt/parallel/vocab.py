"""Vocab-parallel statistics: each rank holds logits over its vocabulary shard only.

Shards are equal and contiguous: rank r owns ids [r * n, (r + 1) * n), n = logits.shape[-1]. Every
statistic the rules need is combined from per-row partials, never from gathered logits (SGLang's
`tp_local_vocab_state.py` does the same for its dLLM path):

    per rank   m_r = max y, lse_r = logsumexp y, h_r = entropy of softmax_r(y) (the shard's own
               distribution), a_r = argmax y (global id); y = logits / T over the shard
    combined   log_z = logsumexp_r lse_r;  w_r = exp(lse_r - log_z) (the shard's mass)
               entropy = sum_r w_r h_r - sum_r w_r log w_r (no cancellation of large terms: closer
               to the exact entropy than log_z - sum p y);  argmax = a_r of the first rank with
               m_r = max m;  confidence = exp(max m - log_z)

One all-gather of [rows, 4] floats per round (ids travel as fp32: exact below 2^24). Sampling (T >
0) inverts the global CDF: each rank's probability mass (second gather), the rank whose cumulative
mass crosses u * total draws inside its shard, one all-reduce brings the token to every rank. The
pre-adapter residual z = p^T E is a per-shard partial sum plus one all-reduce (`reduce_sum`). The
`*_partials` / `combine_*` halves are plain functions so tests check them against the unsharded
twins (`dlmrt.ops.reference.token_stats`, `dlmrt.decoding.proposal.propose`) in one process.
"""

from __future__ import annotations

import torch

from dlmrt.parallel.group import TPGroup


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    x = logits.float()
    return x / temperature if temperature > 0 else x


def stats_partials(logits: torch.Tensor, temperature: float, offset: int) -> torch.Tensor:
    """[rows, 4] fp32: (max y, logsumexp y, entropy of the shard's softmax, global argmax)."""
    y = _scaled(logits, temperature)
    lse = torch.logsumexp(y, dim=-1)
    logp = y - lse.unsqueeze(-1)
    p = torch.exp(logp)
    h = -torch.where(p > 0, p * logp, 0.0).sum(-1)  # 0 * -inf would be nan (as the twin)
    m, a = y.max(dim=-1)
    return torch.stack((m, lse, h, (a + offset).float()), dim=-1)


def combine_stats(
    parts: torch.Tensor,  # [ranks, rows, 4] from `stats_partials`, in rank order
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """argmax, confidence, entropy, log_z over the whole vocabulary (as `ops.token_stats`)."""
    m, lse, h, idx = parts.unbind(-1)
    log_z = torch.logsumexp(lse, dim=0)
    log_w = lse - log_z
    w = torch.exp(log_w)
    entropy = torch.where(w > 0, w * (h - log_w), 0.0).sum(0)
    best = m.max(dim=0).values
    first = torch.argmax((m == best).to(torch.int8), dim=0)  # ties: the lowest id, as argmax
    token = idx.gather(0, first.unsqueeze(0)).squeeze(0).long()
    return token, torch.exp(best - log_z), entropy, log_z


def token_stats(logits: torch.Tensor, temperature: float, group: TPGroup):
    """`ops.token_stats` of the full-vocabulary logits, from this rank's shard."""
    offset = group.rank * logits.shape[-1]
    return combine_stats(group.all_gather(stats_partials(logits, temperature, offset)))


def shard_mass(logits: torch.Tensor, temperature: float, log_z: torch.Tensor) -> torch.Tensor:
    """[rows] fp32: the probability mass of this shard under the global log_z."""
    return torch.exp(_scaled(logits, temperature) - log_z.unsqueeze(-1)).sum(-1)


def sample_shard(
    logits: torch.Tensor,
    temperature: float,
    log_z: torch.Tensor,
    masses: torch.Tensor,  # [ranks, rows] every shard's `shard_mass`
    rank: int,
    uniform: torch.Tensor,  # [rows]
) -> torch.Tensor:
    """[rows, 2] fp32 (global token, its probability) where this shard holds the draw, else 0.

    The draw is the first token whose cumulative probability exceeds u * total (right=True, as
    `propose`): the shard is the first whose cumulative mass exceeds it, the token is found in
    the shard's own CDF at the remaining target. Summing the ranks' results gives the draw."""
    n = logits.shape[-1]
    cum = torch.cumsum(masses, dim=0)  # [ranks, rows]
    target = uniform * cum[-1]
    chosen = (cum <= target.unsqueeze(0)).sum(0).clamp_(max=masses.shape[0] - 1)
    before = torch.where(chosen > 0, cum.gather(0, (chosen - 1).clamp(min=0).unsqueeze(0))[0], 0.0)
    p = torch.exp(_scaled(logits, temperature) - log_z.unsqueeze(-1))
    cdf = torch.cumsum(p, dim=-1)
    local = (target - before).unsqueeze(-1).contiguous()
    tok = torch.searchsorted(cdf, local, right=True).squeeze(-1).clamp_(max=n - 1)
    conf = p.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    mine = (chosen == rank).float()
    return torch.stack(((tok + rank * n).float() * mine, conf * mine), dim=-1)


def sample(
    logits: torch.Tensor,
    temperature: float,
    log_z: torch.Tensor,
    uniform: torch.Tensor,
    group: TPGroup,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, confidence) of `propose`'s inverse-CDF draw over the whole vocabulary."""
    masses = group.all_gather(shard_mass(logits, temperature, log_z))
    both = group.all_reduce(sample_shard(logits, temperature, log_z, masses, group.rank, uniform))
    return both[:, 0].long(), both[:, 1]


def logsumexp(y: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """logsumexp over the last dim of the full-vocabulary y, from this rank's shard (fp32)."""
    return torch.logsumexp(group.all_gather(torch.logsumexp(y.float(), dim=-1)), dim=0)


def reduce_sum(x: torch.Tensor, group: TPGroup | None) -> torch.Tensor:
    """Sum of the ranks' partial x (z = p^T E); x itself when not sharded."""
    return x if group is None else group.all_reduce(x)
