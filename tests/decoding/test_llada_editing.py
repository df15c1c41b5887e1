"""`llada_editing` on crafted proposals: exact M2T / T2T sets for both presets, prompt-tail
protection, tau_edit = 0, termination rules (HF remote-code semantics)."""

from __future__ import annotations

import pytest
import torch

from dlmrt.decoding import Proposal, make_rule
from dlmrt.decoding.llada_editing import PRESETS, LLaDAEditingRule
from dlmrt.params import DecodeParams

M = 99  # the mask id in these canvases


def _proposal(tokens: list[int], conf: list[float]) -> Proposal:
    n = len(tokens)
    return Proposal(torch.tensor(tokens), torch.tensor(conf), torch.zeros(n), torch.zeros(n))


def _run(rule, canvas, unresolved, editable, tokens, conf, post=0):
    return rule(
        _proposal(tokens, conf),
        torch.tensor(canvas),
        torch.tensor(unresolved, dtype=torch.bool),
        torch.tensor(0),
        torch.tensor(editable, dtype=torch.bool),
        torch.tensor(post),
    )


# Row 0 is the prompt tail (never editable); rows 1-2 were filled earlier; rows 3-5 are masks.
CANVAS = [7, 11, 12, M, M, M]
UNRES = [0, 0, 0, 1, 1, 1]
EDITABLE = [0, 1, 1, 1, 1, 1]
TOKENS = [8, 21, 12, 30, 31, 32]  # row 0 and row 1 propose a change, row 2 agrees
CONF = [0.99, 0.6, 0.99, 0.8, 0.6, 0.3]


@pytest.mark.parametrize(
    ("preset", "filled", "edited"),
    [
        ("quality", [3], [1]),  # 0.8 > 0.7; 0.6 > 0.5 edits row 1
        ("speed", [3, 4], [1]),  # 0.8, 0.6 > 0.5; tau_edit 0: any differing argmax
    ],
)
def test_exact_sets_per_preset(preset, filled, edited):
    out = _run(LLaDAEditingRule.preset(preset), CANVAS, UNRES, EDITABLE, TOKENS, CONF)
    assert torch.where(out.accepted)[0].tolist() == filled
    assert torch.where(out.edited)[0].tolist() == edited
    expect = list(CANVAS)
    for i in filled + edited:
        expect[i] = TOKENS[i]
    assert out.canvas.tolist() == expect
    assert out.canvas[0] == 7  # the prompt tail keeps its token despite p = 0.99
    assert out.unresolved.tolist() == [i in (3, 4, 5) and i not in filled for i in range(6)]
    assert not out.done and out.post_steps == 0


def test_quality_does_not_edit_below_tau_edit_and_speed_edits_any_difference():
    conf = [0.99, 0.05, 0.99, 0.8, 0.6, 0.3]  # row 1 wants a change at p = 0.05
    assert not _run(
        LLaDAEditingRule.preset("quality"), CANVAS, UNRES, EDITABLE, TOKENS, conf
    ).edited.any()
    out = _run(LLaDAEditingRule.preset("speed"), CANVAS, UNRES, EDITABLE, TOKENS, conf)
    assert torch.where(out.edited)[0].tolist() == [1]
    # an agreeing argmax is never an "edit", however confident
    same = [7, 11, 12, 30, 31, 32]
    assert not _run(
        LLaDAEditingRule.preset("speed"), CANVAS, UNRES, EDITABLE, same, conf
    ).edited.any()


def test_fallback_fills_the_single_most_confident_mask():
    conf = [0.99, 0.1, 0.99, 0.3, 0.69, 0.69]  # no mask above 0.7: the best (lowest row on ties)
    out = _run(LLaDAEditingRule.preset("quality"), CANVAS, UNRES, EDITABLE, TOKENS, conf)
    assert torch.where(out.accepted)[0].tolist() == [4]


def test_rows_filled_this_round_are_not_edited_and_masks_never_count_as_edits():
    out = _run(LLaDAEditingRule(0.5, 0.0), CANVAS, UNRES, EDITABLE, TOKENS, [0.1] * 6)
    assert torch.where(out.accepted)[0].tolist() == [3]  # fallback, p 0.1 everywhere
    assert torch.where(out.edited)[0].tolist() == [1]  # rows 3-5 were masks at the round start


def test_block_done_when_no_masks_and_no_edits():
    full = [7, 11, 12, 30, 31, 32]
    rule = LLaDAEditingRule.preset("quality")
    out = _run(rule, full, [0] * 6, EDITABLE, full, [0.9] * 6, post=0)
    assert out.done and out.post_steps == 1 and not out.edited.any()
    out = _run(rule, full, [0] * 6, EDITABLE, [7, 11, 13, 30, 31, 32], [0.9] * 6)
    assert not out.done and out.edited.tolist() == [0, 0, 1, 0, 0, 0]


def test_last_mask_filled_does_not_end_the_block():
    """The round that fills the last mask is followed by a checking round (as the HF loop)."""
    canvas = [7, 11, 12, 30, 31, M]
    out = _run(
        LLaDAEditingRule.preset("quality"),
        canvas,
        [0, 0, 0, 0, 0, 1],
        EDITABLE,
        canvas[:5] + [32],
        [0.9] * 6,
    )
    assert out.accepted.tolist() == [0, 0, 0, 0, 0, 1] and not out.unresolved.any()
    assert not out.done and out.post_steps == 0


@pytest.mark.parametrize("max_post", [0, 1, 3])
def test_termination_by_max_post_steps(max_post):
    """A block that keeps editing stops after exactly max_post_steps post-fill rounds."""
    rule = LLaDAEditingRule(0.5, 0.0, max_post)
    unres = torch.tensor([0, 1, 1, 1], dtype=torch.bool)
    editable = torch.tensor([0, 1, 1, 1], dtype=torch.bool)
    post, rounds = torch.tensor(0), 0
    canvas = torch.tensor([7, M, M, M])
    for r in range(20):
        tokens = torch.tensor([1, 2, 3, 4]) + 10 * (r % 2)  # flips every round: always edits
        out = rule(
            Proposal(tokens, torch.full((4,), 0.9), torch.zeros(4), torch.zeros(4)),
            canvas,
            unres,
            torch.tensor(r),
            editable,
            post,
        )
        canvas, unres, post, rounds = out.canvas, out.unresolved, out.post_steps, r + 1
        if out.done:
            break
    assert rounds == 1 + max_post  # one round fills all masks (p 0.9 > 0.5), then max_post edits
    assert rounds <= rule.max_rounds(4)
    assert canvas[0] == 7


def test_outputs_are_device_tensors():
    out = _run(LLaDAEditingRule.preset("speed"), CANVAS, UNRES, EDITABLE, TOKENS, CONF)
    for t in out:
        assert isinstance(t, torch.Tensor) and t.device == out.canvas.device
    assert out.done.dim() == 0 and out.done.dtype == torch.bool and out.post_steps.dim() == 0


def test_presets_and_params():
    assert PRESETS == {"quality": (0.7, 0.5), "speed": (0.5, 0.0)}
    rule = make_rule("llada_editing", editing="speed", max_post_steps=4)
    assert (rule.mask_threshold, rule.edit_threshold, rule.max_post_steps) == (0.5, 0.0, 4)
    assert rule.max_rounds(32) == 36
    with pytest.raises(ValueError, match="editing"):
        DecodeParams(editing="fast")
    with pytest.raises(ValueError, match="editing"):
        DecodeParams(editing="speed", rule="threshold")
    with pytest.raises(ValueError, match="max_post_steps"):
        DecodeParams(max_post_steps=-1)
