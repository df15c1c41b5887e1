"""Decoding rules on crafted logits and proposals (CPU, no model): exact accepted sets."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MASK_ID

from dlmrt.decoding import Proposal, RuleOutput, propose
from dlmrt.decoding.entropy_budget import EntropyBudgetRule
from dlmrt.decoding.fixed_steps import FixedStepsRule
from dlmrt.decoding.threshold import ThresholdRule

STEP = torch.zeros((), dtype=torch.long)


def _prop(confidence=None, entropy=None) -> Proposal:
    """A proposal with tokens 100 + row index and the given confidences / entropies."""
    vals = confidence if confidence is not None else entropy
    n = len(vals)
    conf = torch.tensor(confidence if confidence is not None else [0.5] * n)
    ent = torch.tensor(entropy if entropy is not None else [1.0] * n)
    return Proposal(torch.arange(n) + 100, conf, ent, torch.zeros(n))


def _apply(rule, prop: Proposal, unresolved=None) -> RuleOutput:
    n = prop.tokens.shape[0]
    unres = torch.ones(n, dtype=torch.bool) if unresolved is None else torch.tensor(unresolved)
    canvas = torch.where(unres, torch.full((n,), MASK_ID), torch.arange(n) + 10)
    return rule(prop, canvas, unres, STEP)


def _rows(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask).flatten().tolist()


# --- propose -------------------------------------------------------------------------------------


def test_propose_greedy_uniform_over_four():
    """Uniform logits: token = first argmax, confidence 1/4, entropy log 4 nats, log_z = c + log 4."""
    p = propose(torch.full((1, 4), 2.0), 0.0)
    assert p.tokens.tolist() == [0]
    assert p.confidence.item() == pytest.approx(0.25, abs=1e-6)
    assert p.entropy.item() == pytest.approx(math.log(4), abs=1e-6)
    assert p.log_z.item() == pytest.approx(2.0 + math.log(4), abs=1e-6)


def test_propose_greedy_matches_hand_values():
    """Logits [0, ln 3]: token 1, confidence 3/4, entropy -(1/4 ln 1/4 + 3/4 ln 3/4), log_z ln 4."""
    p = propose(torch.tensor([[0.0, math.log(3)], [5.0, -1.0]]), 0.0)
    assert p.tokens.tolist() == [1, 0]
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert p.confidence[0].item() == pytest.approx(0.75, abs=1e-6)
    assert p.entropy[0].item() == pytest.approx(h, abs=1e-6)
    assert p.log_z[0].item() == pytest.approx(math.log(4), abs=1e-6)
    assert p.log_z[1].item() == pytest.approx(math.log(math.exp(5) + math.exp(-1)), abs=1e-5)


def test_propose_temperature_scales_statistics():
    """T = 2 on logits [0, ln 9] gives p = [1/4, 3/4]: confidence, entropy, log_z of logits / T."""
    logits = torch.tensor([[0.0, math.log(9)]])
    p = propose(logits, 2.0, torch.tensor([0.9]))
    assert p.tokens.tolist() == [1]
    assert p.confidence.item() == pytest.approx(0.75, abs=1e-6)
    assert p.entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert p.log_z.item() == pytest.approx(math.log(4), abs=1e-6)


@pytest.mark.parametrize(
    ("u", "token"), [(0.05, 0), (0.15, 1), (0.45, 1), (0.55, 2), (0.95, 3), (0.999, 3)]
)
def test_propose_inverse_cdf_sampling(u, token):
    """p = [0.1, 0.4, 0.1, 0.4]: uniform u picks the first token whose CDF exceeds u."""
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.1, 0.4]]))
    p = propose(logits, 1.0, torch.tensor([u]))
    assert p.tokens.tolist() == [token]
    assert p.confidence.item() == pytest.approx([0.1, 0.4, 0.1, 0.4][token], abs=1e-6)


def test_propose_sampling_one_hot_rows():
    """Near one-hot rows are sampled to their peak whatever the uniform (one uniform per row)."""
    logits = torch.full((3, 6), -30.0)
    logits[0, 4] = logits[1, 0] = logits[2, 5] = 30.0
    p = propose(logits, 1.0, torch.tensor([0.01, 0.5, 0.99]))
    assert p.tokens.tolist() == [4, 0, 5]


def test_propose_sampling_needs_uniform():
    """temperature > 0 without uniform noise raises."""
    with pytest.raises(ValueError, match="uniform"):
        propose(torch.zeros(2, 3), 1.0)


def test_propose_never_samples_zero_probability_token():
    """u = 0 or u -> 1 (u in [0, 1)) never picks a token whose probability underflowed to 0."""
    logits = torch.tensor([[-200.0, 0.0, -200.0], [0.0, -200.0, -200.0]])
    p = propose(logits, 1.0, torch.tensor([0.0, 0.9999999]))
    assert p.tokens.tolist() == [1, 0]
    assert p.confidence.tolist() == [1.0, 1.0]


def test_propose_entropy_finite_with_masked_vocabulary():
    """-inf logits (a masked vocabulary entry) contribute 0 to the entropy, not NaN."""
    p = propose(torch.tensor([[float("-inf"), 0.0, 0.0]]), 0.0)
    assert p.entropy.item() == pytest.approx(math.log(2), abs=1e-6)


# --- threshold -----------------------------------------------------------------------------------


def test_threshold_accepts_strictly_above_tau():
    """Rows with confidence > tau are accepted, == tau is not; the canvas takes accepted tokens."""
    out = _apply(ThresholdRule(0.5), _prop(confidence=[0.75, 0.5, 0.25, 0.875]))
    assert _rows(out.accepted) == [0, 3]
    assert out.canvas.tolist() == [100, MASK_ID, MASK_ID, 103]
    assert out.unresolved.tolist() == [False, True, True, False]
    assert not out.done


def test_threshold_forces_most_confident_when_none_exceed():
    """No row above tau: exactly the most confident unresolved row is accepted."""
    out = _apply(ThresholdRule(0.9), _prop(confidence=[0.25, 0.5, 0.375, 0.125]))
    assert _rows(out.accepted) == [1]


def test_threshold_row_equal_to_tau_accepted_only_when_forced():
    """A row exactly at tau is accepted only as the forced most-confident row."""
    out = _apply(ThresholdRule(0.5), _prop(confidence=[0.25, 0.5, 0.5]))
    assert _rows(out.accepted) == [1]


def test_threshold_tie_takes_lowest_index():
    """Ties for the forced row resolve to the lowest unresolved index."""
    out = _apply(
        ThresholdRule(0.9), _prop(confidence=[0.25, 0.5, 0.5, 0.5]), [True, False, True, True]
    )
    assert _rows(out.accepted) == [2]


def test_threshold_skips_resolved_rows():
    """A resolved row is never accepted, even the most confident; its canvas entry is kept."""
    out = _apply(
        ThresholdRule(0.9), _prop(confidence=[0.99, 0.25, 0.5, 0.95]), [False, True, True, False]
    )
    assert _rows(out.accepted) == [2]
    assert out.canvas.tolist() == [10, MASK_ID, 102, 13]


def test_threshold_done_when_last_row_accepted():
    """done is True exactly when no unresolved rows remain."""
    out = _apply(ThresholdRule(0.9), _prop(confidence=[0.1, 0.2]), [False, True])
    assert _rows(out.accepted) == [1]
    assert bool(out.done) and not out.unresolved.any()


def test_threshold_all_resolved_accepts_nothing():
    """All rows resolved: nothing accepted, canvas unchanged, done."""
    out = _apply(ThresholdRule(0.5), _prop(confidence=[0.9, 0.8]), [False, False])
    assert not out.accepted.any() and bool(out.done)
    assert out.canvas.tolist() == [10, 11]


# --- entropy_budget ------------------------------------------------------------------------------


def test_entropy_budget_paper_example_boundary():
    """H = [0.5, 0.1, 0.3, 2.0], gamma 0.4: prefix sums 0, 0.1, 0.4, 0.9 -> rows 1, 2, 0 accepted."""
    out = _apply(EntropyBudgetRule(0.4), _prop(entropy=[0.5, 0.1, 0.3, 2.0]))
    assert _rows(out.accepted) == [0, 1, 2]


def test_entropy_budget_verdict_independent_of_own_entropy():
    """Whether the 3rd-lowest row is accepted depends only on the two entropies below it."""
    verdicts = [
        _apply(EntropyBudgetRule(0.4), _prop(entropy=[0.1, 0.3, h])).accepted[2].item()
        for h in (0.45, 0.5, 0.7, 1.9)
    ]
    assert verdicts == [True] * 4


def test_entropy_budget_exact_prefix():
    """H = [0.5, 0.125, 0.25, 2.0], gamma 0.5: prefix sums 0, 0.125, 0.375, 0.875 -> rows 1, 2, 0."""
    out = _apply(EntropyBudgetRule(0.5), _prop(entropy=[0.5, 0.125, 0.25, 2.0]))
    assert _rows(out.accepted) == [0, 1, 2]
    assert out.canvas.tolist() == [100, 101, 102, MASK_ID]


def test_entropy_budget_boundary_is_inclusive():
    """A previous sum exactly equal to gamma accepts (dyadic values, no rounding)."""
    out = _apply(EntropyBudgetRule(0.375), _prop(entropy=[0.5, 0.125, 0.25, 2.0]))
    assert _rows(out.accepted) == [0, 1, 2]
    out = _apply(EntropyBudgetRule(0.25), _prop(entropy=[0.5, 0.125, 0.25, 2.0]))
    assert _rows(out.accepted) == [1, 2]


def test_entropy_budget_gamma_zero_takes_lowest_only():
    """gamma = 0: only the lowest-entropy row (nothing before it) is accepted."""
    out = _apply(EntropyBudgetRule(0.0), _prop(entropy=[0.5, 0.1, 0.3, 2.0]))
    assert _rows(out.accepted) == [1]


def test_entropy_budget_large_entropy_lowest_still_accepted():
    """Even a high-entropy row is accepted when it is the lowest (progress guarantee)."""
    out = _apply(EntropyBudgetRule(0.0), _prop(entropy=[7.0, 9.0]))
    assert _rows(out.accepted) == [0]


def test_entropy_budget_skips_resolved_rows():
    """Resolved rows with the lowest entropies are ignored: the budget runs over unresolved rows."""
    prop = _prop(entropy=[0.5, 0.0, 0.125, 0.25, 2.0])
    out = _apply(EntropyBudgetRule(0.25), prop, [True, False, False, True, True])
    assert _rows(out.accepted) == [0, 3]  # sorted: 0.25 (row 3), 0.5 (row 0: before 0.25), 2.0
    assert out.canvas.tolist() == [100, 11, 12, 103, MASK_ID]


def test_entropy_budget_ties_are_stable_by_index():
    """Equal entropies sort by row index: the lower-index ties come first."""
    out = _apply(EntropyBudgetRule(0.25), _prop(entropy=[1.0, 0.25, 0.25, 0.25]))
    assert _rows(out.accepted) == [1, 2]
    out = _apply(EntropyBudgetRule(0.0), _prop(entropy=[0.5, 0.5, 0.5]))
    assert _rows(out.accepted) == [0]


def test_entropy_budget_all_resolved():
    """All rows resolved: nothing accepted, canvas unchanged, done."""
    out = _apply(EntropyBudgetRule(0.8), _prop(entropy=[0.1, 0.2, 0.3]), [False, False, False])
    assert not out.accepted.any() and bool(out.done)
    assert out.canvas.tolist() == [10, 11, 12]


# --- invariants ----------------------------------------------------------------------------------

RULES = [ThresholdRule(0.9), ThresholdRule(0.3), EntropyBudgetRule(0.8), EntropyBudgetRule(0.0)]


def _random_round(gen: torch.Generator, rows: int, sample: bool) -> Proposal:
    logits = torch.randn(rows, 50, generator=gen) * (1 + 4 * torch.rand(rows, 1, generator=gen))
    if sample:
        return propose(logits, 0.7, torch.rand(rows, generator=gen))
    return propose(logits, 0.0)


@pytest.mark.parametrize("rule", RULES, ids=str)
def test_rule_invariants_random(rule):
    """accepted ⊆ unresolved, non-empty when any row is unresolved; canvas changes only there."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        rows = 1 + trial % 16
        prop = _random_round(gen, rows, sample=trial % 2 == 1)
        unres = torch.rand(rows, generator=gen) < 0.6
        canvas = torch.randint(0, 50, (rows,), generator=gen)
        out = rule(prop, canvas, unres, STEP)
        assert not (out.accepted & ~unres).any()
        assert out.accepted.any() == unres.any()
        assert torch.equal(out.canvas, torch.where(out.accepted, prop.tokens, canvas))
        assert torch.equal(out.unresolved, unres & ~out.accepted)


@pytest.mark.parametrize("rows", [1, 7, 32])
@pytest.mark.parametrize("rule", RULES, ids=str)
def test_rule_terminates_within_block_rounds(rule, rows):
    """Fed fresh random proposals, a block of B rows finishes in at most B rounds."""
    gen = torch.Generator().manual_seed(rows)
    for _ in range(10):
        canvas = torch.full((rows,), MASK_ID)
        unres = torch.ones(rows, dtype=torch.bool)
        for _round in range(rows):
            out = rule(_random_round(gen, rows, sample=False), canvas, unres, STEP)
            canvas, unres = out.canvas, out.unresolved
            if bool(out.done):
                break
        assert bool(out.done) and not (canvas == MASK_ID).any()


@pytest.mark.parametrize("rule", RULES, ids=str)
def test_rule_outputs_are_device_tensors(rule):
    """Outputs stay tensors on the input device (no host values); done is a 0-dim bool tensor."""
    prop = _random_round(torch.Generator().manual_seed(1), 8, sample=False)
    out = rule(prop, torch.full((8,), MASK_ID), torch.ones(8, dtype=torch.bool), STEP)
    for t in out[:4]:
        assert isinstance(t, torch.Tensor) and t.device == prop.tokens.device
    assert out.edited is None and out.post_steps is None  # absorbing rules never edit
    assert out.done.dim() == 0 and out.done.dtype == torch.bool
    assert out.accepted.dtype == out.unresolved.dtype == torch.bool
    assert out.canvas.dtype == torch.long and out.canvas.shape == (8,)


@pytest.mark.parametrize("steps,rows", [(3, 8), (1, 5), (23, 256), (8, 4)])
def test_fixed_steps_finishes_in_exactly_min_steps_rows(steps, rows):
    """fixed_steps accepts ceil(n / rounds left) most confident rows: min(S, B) rounds per block."""
    rule = FixedStepsRule(steps)
    gen = torch.Generator().manual_seed(steps)
    unresolved, canvas = torch.ones(rows, dtype=torch.bool), torch.zeros(rows, dtype=torch.long)
    for r in range(rows + 1):
        prop = propose(torch.randn(rows, 11, generator=gen), 0.0)
        out = rule(prop, canvas, unresolved, torch.tensor(r))
        conf = prop.confidence.masked_fill(~unresolved, -1.0)
        k = int(out.accepted.sum())
        assert k == -(-int(unresolved.sum()) // max(steps - r, 1))
        assert set(out.accepted.nonzero().flatten().tolist()) == set(conf.topk(k).indices.tolist())
        unresolved, canvas = out.unresolved, out.canvas
        if bool(out.done):
            break
    assert r + 1 == min(steps, rows)
