"""Selection on a crafted trajectory; the losses and their normalisation on crafted inputs."""

from __future__ import annotations

import math

import torch
from orl_helpers import crafted_rollout

from dlmrt.train.orl.capture import State
from dlmrt.train.orl.losses import aec_hinge, capped_rkl, normalized_entropy
from dlmrt.train.orl.plan import plan, valid_positions
from dlmrt.train.orl.selection import aec_pairs, select_rounds


def _states(accepted: list[int], empty: tuple[int, ...] = ()) -> list[State]:
    out = []
    for k, a in enumerate(accepted):
        unres = torch.ones(8, dtype=torch.bool)
        if k in empty:
            unres[:] = False
        acc = torch.zeros(8, dtype=torch.bool)
        acc[:a] = True
        out.append(State(0, k, torch.zeros(8, dtype=torch.long), unres, None, torch.zeros(8), acc))
    return out


def test_selection_top_quarter_plus_final_and_pairs():
    st = _states([1, 3, 0, 2, 4, 1])
    sel = select_rounds(st, 0.25)  # ceil(1.5) = 2 most accepting: rounds 4 (4), 1 (3); + final 5
    assert sel == [1, 4, 5]
    assert aec_pairs(st, sel) == [0, 3, 4]  # sources of 1, 4, 5 (the sources 0, 3 unselected)
    st = _states([2, 2, 1, 2], empty=(0,))  # ties: the earlier round; empty unresolved: no pair
    assert select_rounds(st, 0.25) == [0, 3]
    assert aec_pairs(st, [1, 3]) == [2]
    assert select_rounds(st, 0.0) == [3] and select_rounds([], 0.25) == []


def test_aec_is_zero_once_the_entropy_contracted_by_rho():
    h_src = torch.tensor([0.5, 0.5, 0.5])
    h_next = torch.tensor([0.40, 0.30, 0.50])
    got = aec_hinge(h_next, h_src, rho=0.2)  # (1 - rho) * 0.5 = 0.4
    assert torch.allclose(got, torch.tensor([0.0, 0.0, 0.01]))


def test_rkl_zero_with_zero_gradient_for_identical_and_capped_above_c():
    logits = torch.randn(3, 11, requires_grad=True)
    same = capped_rkl(logits, logits.detach().clone(), cap=5.0)
    (g,) = torch.autograd.grad(same.sum(), logits)
    assert same.abs().max() < 1e-6 and g.abs().max() < 1e-6
    far = torch.zeros(1, 11)
    far[0, 0] = 40.0
    ref = torch.zeros(1, 11)
    ref[0, 1] = 40.0
    far.requires_grad_(True)
    out = capped_rkl(far, ref, cap=5.0)  # KL ~ 40 nats, capped
    (g,) = torch.autograd.grad(out.sum(), far)
    assert out.item() == 5.0 and g.abs().max() == 0.0
    p = torch.log_softmax(torch.tensor([[1.0, 0.0]]), -1)
    q = torch.log_softmax(torch.tensor([[0.0, 1.0]]), -1)
    want = (p.exp() * (p - q)).sum().item()  # 0.462 nats: under the cap
    assert math.isclose(capped_rkl(torch.tensor([[1.0, 0.0]]), q, 5.0).item(), want, rel_tol=1e-6)


def test_normalized_entropy():
    assert math.isclose(normalized_entropy(torch.zeros(1, 64), 1.0).item(), 1.0, rel_tol=1e-6)
    peaked = torch.tensor([[30.0] + [0.0] * 63])
    assert normalized_entropy(peaked, 1.0).item() < 1e-6
    assert normalized_entropy(peaked, 1e3).item() > 0.99  # taken at the rollout temperature


def test_response_normalisation_weights():
    """Each verified response weighs the same: token weight 1 / N_R, pairs 1 / |P(R)|."""
    a = crafted_rollout(6, 9, 4, [3, 2, 2])  # blocks 1..3, valid positions 2, 4, 3
    b = crafted_rollout(8, 5, 4, [2, 3])  # blocks 2, 3: valid positions 4, 1
    c = crafted_rollout(8, 5, 4, [2, 3])
    c.verified = False  # rejected: contributes nothing
    assert [valid_positions(a, k, 4) for k in (1, 2, 3)] == [2, 4, 3]
    p = plan([a, b, c], 0.25, None, vocab=512)
    assert p.responses == 2
    # every round accepts one row (ties: the earlier round), so a block of n rounds selects
    # round 0 and its final round: a: {0, 2}, {0, 1}, {0, 1}; b: {0, 1}, {0, 2}
    n_a, n_b = 2 * 2 + 2 * 4 + 2 * 3, 2 * 4 + 2 * 1
    weights = {id(d.rollout): d.token_weight for d in p.docs}
    assert weights == {id(a): 1 / n_a, id(b): 1 / n_b}
    # pairs (b, k) -> (b, k+1): a: (1,1), (2,0), (3,0); b: (2,0), (3,1)
    assert p.pairs == 5 and math.isclose(p.aec_den, 2.0)  # each response's pair weights sum to 1
    gated = plan([a, b], 0.25, 0.01, vocab=512)  # H_roll = 0.5 / log 512 = 0.08 > 0.01: all out
    assert gated.aec_den == 0.0 and gated.pairs == 5
    h = [t.h_source for d in p.docs for t in d.targets if t.aec_weight > 0]
    assert all(math.isclose(x, 0.5 / math.log(512), rel_tol=1e-6) for x in h)


def test_largest_cost_first_assignment_balances_ranks():
    from dlmrt.train.orl.balance import assign
    from dlmrt.train.orl.plan import Doc, Target

    r = crafted_rollout(6, 9, 4, [3, 2, 2])
    docs = [
        Doc(r, [r.blocks[b][0] for b in bs], 1.0, [Target()] * len(bs))
        for bs in ([1], [1, 2, 3], [2], [3], [1, 2])
    ]
    lengths = [d.length for d in docs]  # 8, 24, 12, 16, 16
    parts = assign(docs, 2)
    assert [[lengths[docs.index(d)] for d in p] for p in parts] == [[24, 12], [16, 16, 8]]
    assert assign(docs, 1) == [sorted(docs, key=lambda d: -d.length)]


def test_aec_diagnostics_count_gated_pairs_and_active_hinges():
    from types import SimpleNamespace

    from dlmrt.train.orl.losses import aec_diagnostics, normalized_entropy

    torch.manual_seed(0)
    logits = torch.randn(6, 11)
    h = normalized_entropy(logits, 1.0)
    # three states of two rows each; state 0 is no AEC target, states 1 and 2 are
    row = SimpleNamespace(
        aec_weight=torch.tensor([0.0, 0.5, 0.5]),
        unresolved=torch.ones(6, dtype=torch.bool),
        segment=torch.tensor([0, 0, 1, 1, 2, 2]),
        h_source=torch.tensor([9.0, 9.0, 0.0]),  # state 1 contracted a lot, state 2 not at all
    )
    h_next = torch.stack([h[0:2].mean(), h[2:4].mean(), h[4:6].mean()])  # as row_terms' means
    got = aec_diagnostics(h_next, aec_hinge(h_next, row.h_source, 0.2), row)
    assert got[0] == 2 and got[1] == 1  # two gated pairs, only state 2's hinge is active
    assert torch.allclose(got[2], torch.tensor(9.0)) and torch.allclose(got[3], h_next[1:].sum())
