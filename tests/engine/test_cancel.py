"""`should_stop` cancels a request between rounds and leaves the engine ready for the next one."""

from __future__ import annotations

import pytest

from dlmrt import LLM
from dlmrt.errors import GenerationCancelled


def test_should_stop_cancels_between_rounds_and_engine_recovers(orl_ckpt):
    """Polled before every round: True on the 4th poll ends the request after exactly 3 rounds."""
    llm = LLM(orl_ckpt, device="cpu")
    baseline = llm.generate("hello", max_new_tokens=24, ignore_eos=True)
    polls = []

    def stop() -> bool:
        polls.append(1)
        return len(polls) > 3

    rounds = []
    with pytest.raises(GenerationCancelled):
        llm.generate(
            "hello", max_new_tokens=24, ignore_eos=True, should_stop=stop, recorder=rounds.append
        )
    # block 0 finished in 3 rounds (recorded after it); the 4th poll, before block 1, cancels
    assert len(polls) == 4 and len(rounds) == 3 and {r.block_index for r in rounds} == {0}
    again = llm.generate("hello", max_new_tokens=24, ignore_eos=True)
    assert again.token_ids == baseline.token_ids


def test_should_stop_false_changes_nothing(orl_ckpt):
    llm = LLM(orl_ckpt, device="cpu")
    a = llm.generate("hi", max_new_tokens=16, ignore_eos=True)
    b = llm.generate("hi", max_new_tokens=16, ignore_eos=True, should_stop=lambda: False)
    assert a.token_ids == b.token_ids and a.num_denoising_forwards == b.num_denoising_forwards
