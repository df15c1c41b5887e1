"""Vocab-parallel statistics from per-shard partials equal the unsharded ones (one process).

The partial / combine halves are the exact functions the ranks run (`dlmrt/parallel/vocab.py`);
here the "all-gather" is a stack over the shards of one logits tensor."""

from __future__ import annotations

import pytest
import torch

from dlmrt.decoding.proposal import propose
from dlmrt.ops import reference
from dlmrt.parallel import vocab


def _logits(rows: int, v: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(rows, v, generator=gen)


def _sharded_stats(logits: torch.Tensor, world: int, temperature: float):
    shards = logits.chunk(world, dim=-1)
    n = shards[0].shape[-1]
    parts = torch.stack([vocab.stats_partials(s, temperature, r * n) for r, s in enumerate(shards)])
    return vocab.combine_stats(parts)


def _exact_stats(logits: torch.Tensor, temperature: float):
    """confidence, entropy, log_z of the unsharded softmax, in float64."""
    x = logits.double() / (temperature if temperature > 0 else 1.0)
    log_z = torch.logsumexp(x, dim=-1)
    p = torch.exp(x - log_z.unsqueeze(-1))
    entropy = log_z - torch.where(p > 0, p * x, 0.0).sum(-1)
    return p.max(dim=-1).values, entropy, log_z


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_token_stats_equal_the_unsharded_ones(world: int, temperature: float):
    """Within 1e-6 of the exact statistics; the fp32 twin itself is only within ~1e-5 of them
    (it subtracts sum p y from log_z, two numbers near 10), so against it the bound is fp32's."""
    logits = _logits(32, 256, seed=world)
    logits[3, 200] = -float("inf")  # -inf logits: p = 0, no nan
    twin = reference.token_stats(logits, temperature)
    got = _sharded_stats(logits, world, temperature)
    assert torch.equal(got[0], twin[0])  # argmax
    for g, exact, w in zip(got[1:], _exact_stats(logits, temperature), twin[1:], strict=True):
        torch.testing.assert_close(g.double(), exact, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(g, w)  # fp32 tolerances


def test_argmax_ties_pick_the_lowest_id_across_shards():
    logits = torch.zeros(2, 8)
    logits[0, [1, 5]] = 4.0  # tie across shards 0 and 1 -> id 1
    logits[1, [6, 7]] = 4.0  # tie inside shard 1 -> id 6
    assert _sharded_stats(logits, 2, 0.0)[0].tolist() == [1, 6]


@pytest.mark.parametrize("world", [2, 4])
def test_sampled_draw_equals_the_unsharded_draw(world: int):
    rows, v, t = 64, 128, 0.9
    logits = _logits(rows, v, seed=7, scale=1.5)
    uniform = torch.rand(rows, generator=torch.Generator().manual_seed(3))
    uniform[0] = 0.0
    want = propose(logits, t, uniform)
    log_z = _sharded_stats(logits, world, t)[3]
    shards = logits.chunk(world, dim=-1)
    masses = torch.stack([vocab.shard_mass(s, t, log_z) for s in shards])
    both = sum(vocab.sample_shard(s, t, log_z, masses, r, uniform) for r, s in enumerate(shards))
    assert torch.equal(both[:, 0].long(), want.tokens)
    torch.testing.assert_close(both[:, 1], want.confidence, atol=1e-6, rtol=1e-6)


def test_z_is_the_sum_of_per_shard_partials():
    logits, embed = _logits(16, 64, seed=2), torch.randn(64, 12)
    log_z = torch.logsumexp(logits, dim=-1)
    want = torch.softmax(logits, dim=-1) @ embed
    parts = [
        reference.softmax_probs(s, log_z, 1.0, embed.dtype) @ e
        for s, e in zip(logits.chunk(2, -1), embed.chunk(2, 0), strict=True)
    ]
    torch.testing.assert_close(vocab.reduce_sum(sum(parts), None), want, atol=1e-6, rtol=1e-6)
    lse = torch.logsumexp(torch.stack([torch.logsumexp(s, -1) for s in logits.chunk(4, -1)]), 0)
    torch.testing.assert_close(lse, log_z, atol=1e-6, rtol=1e-6)
