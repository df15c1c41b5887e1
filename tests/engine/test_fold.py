"""Commit folding (engine/fold.py): folded == unfolded token for token, with fewer forwards (CPU)."""

from __future__ import annotations

import pytest
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint

from dlmrt import LLM, reference
from dlmrt.decoding import make_rule
from dlmrt.engine.block import program

QWEN_ADAPTERS = {
    "base": None,
    "masked": residual_config("masked"),
    "block": residual_config("block"),
}
QWEN_RULES = {"threshold": {"threshold": 0.25}, "entropy_budget": {"entropy_budget": 4.0}}
# As in test_llada2_oracle: small adapters keep the "block" recurrence contractive. "masked" without
# a post-norm folds the post-fill check; "block" and "masked" with a post-norm fold the commit only.
LLADA_ADAPTERS = {
    "base": None,
    "masked": residual_config("masked", post_norm_scale=None, output_scale=0.01),
    "block": residual_config("block", post_norm_scale=None, output_scale=0.01),
    "masked-postnorm": residual_config("masked", output_scale=0.01),
}


def _prompt(n: int) -> list[int]:
    return [(37 * i + 11) % 256 for i in range(n)]


def _pair(path) -> tuple[LLM, LLM]:
    return LLM(path, device="cpu"), LLM(path, device="cpu", fold_commits=False)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("fold-qwen")
    return {n: _pair(write_checkpoint(root / n, residual=r)) for n, r in QWEN_ADAPTERS.items()}


@pytest.fixture(scope="module")
def llada(tmp_path_factory):
    root = tmp_path_factory.mktemp("fold-llada")
    return {
        n: _pair(write_llada2_checkpoint(root / n, residual=r, seed=1))
        for n, r in LLADA_ADAPTERS.items()
    }


def _same(on: LLM, off: LLM, prompt: list[int], **kw):
    """Folded and unfolded give the same tokens, reasons and per-block rounds, folded with fewer
    forwards (one per committed block at least), no stand-alone commit."""
    a, b = on.generate(prompt, **kw), off.generate(prompt, **kw)
    assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
    assert a.rounds_per_block == b.rounds_per_block
    commits = len(b.rounds_per_block) - 1
    assert a.num_commit_forwards == 0 and b.num_commit_forwards == commits
    total = a.num_denoising_forwards, b.num_denoising_forwards + b.num_commit_forwards
    assert total[0] <= total[1] - commits
    # TPF (per denoising forward): equal when only the commit folds, higher when a check folds
    assert a.tokens_per_forward >= b.tokens_per_forward
    return a, b


@pytest.fixture
def passes(monkeypatch):
    """Every joint pass the eager runner runs: (block b done before it, redo, block b done after)."""
    events: list[tuple[bool, bool, bool]] = []
    real = program.joint_pass

    def spy(spec, fb, buf, kv, kv_len=None):
        before = bool(fb.done)
        real(spec, fb, buf, kv, kv_len)
        events.append((before, bool(fb.redo), bool(fb.done)))

    monkeypatch.setattr(program, "joint_pass", spy)
    return events


@pytest.mark.parametrize("adapter", list(QWEN_ADAPTERS))
@pytest.mark.parametrize("rule", list(QWEN_RULES))
def test_qwen_folded_equals_unfolded(qwen, adapter, rule, passes):
    """Prompts with a tail, ending on a block boundary (8, 16), a one-block request; T 0 and 0.8."""
    on, off = qwen[adapter]
    for plen, new, temp in ((3, 29, 0.0), (8, 24, 0.0), (16, 17, 0.8), (13, 21, 0.8), (3, 4, 0.0)):
        kw = dict(rule=rule, max_new_tokens=new, temperature=temp, seed=plen, ignore_eos=True)
        a, b = _same(on, off, _prompt(plen), **kw, **QWEN_RULES[rule])
        assert a.num_denoising_forwards == b.num_denoising_forwards  # a joint pass is round 0
    assert passes and not any(redo for _, redo, _ in passes)  # a plain commit is never redone


def test_qwen_folded_matches_the_oracle(qwen):
    for adapter in ("masked", "block"):
        llm = qwen[adapter][0]
        for rule, knob in QWEN_RULES.items():
            out = llm.generate(_prompt(13), rule=rule, max_new_tokens=27, ignore_eos=True, **knob)
            tokens, reason = reference.block.generate(
                llm.model,
                _prompt(13),
                rule=make_rule(rule, **knob),
                block_length=8,
                max_new_tokens=27,
                mask_id=llm.mask_id,
                stop_ids=llm.stop_ids,
                ignore_eos=True,
            )
            assert out.token_ids == tokens and out.finish_reason == reason
            assert out.num_commit_forwards == 0


def test_qwen_stop_mid_request(qwen):
    """A stop id ends the request at the same token; no joint pass after the last block."""
    on, off = qwen["masked"]
    free = on.generate(_prompt(5), max_new_tokens=30, ignore_eos=True, entropy_budget=4.0)
    stop = free.token_ids[12]
    saved = on.stop_ids
    on.stop_ids = off.stop_ids = {stop}
    try:
        a, _ = _same(on, off, _prompt(5), max_new_tokens=30, entropy_budget=4.0)
    finally:
        on.stop_ids = off.stop_ids = saved
    assert a.finish_reason == "stop" and a.token_ids[-1] == stop


@pytest.mark.parametrize("adapter", list(LLADA_ADAPTERS))
@pytest.mark.parametrize("editing", ["quality", "speed"])
def test_llada_folded_equals_unfolded(llada, adapter, editing):
    on, off = llada[adapter]
    for plen in (3, 8, 13):
        _same(on, off, _prompt(plen), editing=editing, max_new_tokens=21, ignore_eos=True)
    kw = dict(editing=editing, temperature=0.8, seed=3, max_new_tokens=21, ignore_eos=True)
    _same(on, off, _prompt(5), **kw)  # sampled checks draw with block b's own round counter


def test_llada_folded_check_repeats_and_matches_the_oracle(llada, passes):
    """The check edits (redo, the joint pass repeats) and settles; tokens equal the oracle's."""
    llm = llada["base"][0]
    for editing in ("quality", "speed"):
        out = llm.generate(_prompt(13), editing=editing, max_new_tokens=29, ignore_eos=True)
        tokens, reason = reference.block.generate(
            llm.model,
            _prompt(13),
            rule=make_rule("llada_editing", editing=editing),
            block_length=8,
            max_new_tokens=29,
            mask_id=llm.mask_id,
            stop_ids=llm.stop_ids,
            ignore_eos=True,
        )
        assert out.token_ids == tokens and out.finish_reason == reason
    checks = [p for p in passes if not p[0]]
    assert any(redo for _, redo, _ in checks), "no check edited: the repeat path did not run"
    assert any(not redo for _, redo, _ in checks)


def test_llada_exhausted_check_reruns_as_a_pure_commit(llada, passes):
    """max_post_steps reached with an edit: block b+1's half is discarded, one more pure pass."""
    on, off = llada["base"]
    for steps in (1, 2):
        kw = dict(editing="speed", max_post_steps=steps, max_new_tokens=30, ignore_eos=True)
        _same(on, off, _prompt(5), **kw)
    assert (False, True, True) in passes  # a check that edited and exhausted block b
    assert (True, False, True) in passes  # the pure commit + round 0 that followed


def test_llada_no_post_steps_and_stop(llada):
    """max_post_steps 0 (done when filled: pure commit) and a stop id in a checked block."""
    on, off = llada["masked"]
    _same(on, off, _prompt(6), editing="quality", max_post_steps=0, max_new_tokens=24)
    free = on.generate(_prompt(6), editing="quality", max_new_tokens=30, ignore_eos=True)
    stop = free.token_ids[9]
    saved = on.stop_ids
    on.stop_ids = off.stop_ids = {stop}
    try:
        a, _ = _same(on, off, _prompt(6), editing="quality", max_new_tokens=30)
    finally:
        on.stop_ids = off.stop_ids = saved
    assert a.finish_reason == "stop" and a.token_ids[-1] == stop


def test_llada_commit_only_fold_runs_post_fill_rounds_unfolded(llada, passes):
    """Adapter on "block" rows: block b's check is not a clean forward, so every joint pass is a
    pure commit (block b done before it) and none is repeated."""
    on, _ = llada["block"]
    on.generate(_prompt(5), editing="quality", max_new_tokens=24, ignore_eos=True)
    assert passes and all(before and not redo for before, redo, _ in passes)


def test_recorder_runs_unfolded(qwen):
    """Per-round records follow the unfolded schedule (the trainer replays it)."""
    on, off = qwen["masked"]
    records = []
    a = on.generate(_prompt(5), max_new_tokens=20, ignore_eos=True, recorder=records.append)
    b = on.generate(_prompt(5), max_new_tokens=20, ignore_eos=True)
    assert a.token_ids == b.token_ids and a.num_commit_forwards == len(a.rounds_per_block) - 1
    assert len(records) == a.num_denoising_forwards


def test_switch_in_config_and_cli(qwen):
    from dlmrt.cli import build_parser
    from dlmrt.config import EngineConfig

    assert EngineConfig().fold_commits is True
    assert qwen["base"][0].engine.fold_commits and not qwen["base"][1].engine.fold_commits
    parser = build_parser()
    assert parser.parse_args(["generate", "x"]).fold_commits is True
    assert parser.parse_args(["generate", "x", "--no-fold-commits"]).fold_commits is False
    sub = parser._subparsers._group_actions[0].choices["generate"]
    assert "--no-fold-commits" in sub.format_help()
