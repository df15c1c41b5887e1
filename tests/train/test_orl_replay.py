"""Replay exactness (replayed logits == the rollout's, fp32) and packing leaves the loss unchanged."""

from __future__ import annotations

import math

import pytest
import torch
from orl_helpers import rollouts, tiny_orl

from dlmrt.train.masks import dense_mask
from dlmrt.train.orl.losses import LossSpec, combine, row_terms
from dlmrt.train.orl.plan import Doc, Target, pack_docs, plan
from dlmrt.train.orl.replay import replay_logits
from dlmrt.train.orl.row import build_row

CPU = torch.device("cpu")


@pytest.mark.parametrize("positions", ["masked", "block"])
def test_replay_reproduces_the_rollout_logits(tmp_path, positions):
    model, llm, path = tiny_orl(tmp_path, positions)
    r = rollouts(llm, path, n=1)[0]
    assert len(r.blocks) >= 2 and all(s.logits is not None for s in r.states)
    vocab = model.cfg.vocab_size
    # every state alone, then all states of the rollout packed into one row (one doc per block)
    alone = [Doc(r, [s], 1.0, [Target()]) for s in r.states]
    with torch.no_grad():
        for doc in alone:
            row = build_row([doc], vocab, CPU)
            got = replay_logits(model, row, dense_mask(row.meta))
            err = (got - doc.states[0].logits).abs().max().item()
            assert err <= 1e-5, (doc.states[0].block, doc.states[0].round, err)
        row = build_row(alone, vocab, CPU, pad_to=64)
        got = replay_logits(model, row, dense_mask(row.meta))
    want = torch.cat([s.logits for s in r.states])
    # a row of ~10 documents: longer softmax reductions, so 1e-5 relative to the logits' scale
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())


def test_replay_with_other_weights_differs(tmp_path):
    """The check can fail: the same state replayed with perturbed weights gives other logits."""
    model, llm, path = tiny_orl(tmp_path)
    r = rollouts(llm, path, n=1)[0]
    s = r.states[-1]
    row = build_row([Doc(r, [s], 1.0, [Target()])], model.cfg.vocab_size, CPU)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
        got = replay_logits(model, row, dense_mask(row.meta))
    assert (got - s.logits).abs().max().item() > 1e-3


def _loss(model, rows, p, spec):
    total = 0.0
    for docs in rows:
        row = build_row(docs, model.cfg.vocab_size, CPU, pad_to=16)
        logits = replay_logits(model, row, dense_mask(row.meta))
        loss, _ = combine(
            row_terms(logits, logits.detach(), row, spec), p.responses, p.aec_den, spec
        )
        total = total + loss
    return total


@pytest.mark.parametrize("gated", [False, True])
def test_packed_loss_equals_one_by_one(tmp_path, gated):
    model, llm, path = tiny_orl(tmp_path)
    rs = rollouts(llm, path, n=2, tap_first=False)
    p = plan(rs, 0.25, None, model.cfg.vocab_size)
    assert p.responses == 4 and p.pairs > 0 and len(p.docs) > 4
    spec = LossSpec(
        temperature=1.0, rho=0.3, aec_weight=2.0, entropy_gate=gated, zeta=0.3, rkl_cap=5.0
    )
    one = _loss(model, [[d] for d in p.docs], p, spec)
    packed_rows = pack_docs(p.docs, 256)
    assert len(packed_rows) < len(p.docs)
    packed = _loss(model, packed_rows, p, spec)
    assert math.isclose(packed.item(), one.item(), rel_tol=1e-5, abs_tol=1e-6)
    g1 = torch.autograd.grad(one, model.model.layers[1].mlp.up_proj.weight)[0]
    g2 = torch.autograd.grad(packed, model.model.layers[1].mlp.up_proj.weight)[0]
    assert torch.allclose(g1, g2, atol=1e-6, rtol=1e-4)
