"""Drafts (`dlmrt/drafts.py`): a request's per-round drafts replay exactly to its output, for every
block rule (QwenDLM, LLaDA2's editing rule) and for DiffusionGemma's canvases; asking for them
never changes the tokens; `LLM.stream()` yields the same drafts and the output."""

from __future__ import annotations

import pytest
import torch
from conftest import residual_config, write_checkpoint, write_llada2_checkpoint
from dg_helpers import _prompt, ckpt  # noqa: F401
from draft_checks import assert_replays

from dlmrt import LLM
from dlmrt.drafts import ACCEPTED, FINAL, MASKED, Draft
from dlmrt.errors import GenerationCancelled

PROMPT = [(37 * i + 11) % 256 for i in range(5)]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# A request with drafts runs unfolded (`engine/block/trace.py`); the plain requests it is compared
# with run unfolded too, so that a difference could only come from the tracing itself (folded
# passes may round differently: a near-tie of these random models can flip).
@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> LLM:
    path = write_checkpoint(tmp_path_factory.mktemp("drafts") / "orl", residual=residual_config())
    return LLM(path, dtype="float32", device="cpu", fold_commits=False)


@pytest.fixture(scope="module")
def llada(tmp_path_factory) -> LLM:
    path = write_llada2_checkpoint(tmp_path_factory.mktemp("drafts") / "llada")
    return LLM(path, device="cpu", fold_commits=False)


@pytest.fixture(scope="module")
def gemma(ckpt) -> LLM:  # noqa: F811
    return LLM(ckpt[0], dtype="float32", device="cpu")


def _drafts(llm: LLM, prompt, **kw) -> tuple[list[Draft], object]:
    drafts: list[Draft] = []
    out = llm.generate(prompt, on_round=drafts.append, **kw)
    assert out.token_ids == llm.generate(prompt, **kw).token_ids  # drafts change nothing
    return drafts, out


@pytest.mark.parametrize(
    "kw",
    [
        {"rule": "threshold", "threshold": 0.5},
        {"rule": "entropy_budget"},
        {"rule": "fixed_steps", "denoising_steps": 4},
        {"rule": "entropy_budget", "temperature": 0.8, "seed": 3},
    ],
    ids=["threshold", "entropy_budget", "fixed_steps", "sampled"],
)
def test_block_rules_replay(qwen, kw):
    drafts, out = _drafts(qwen, PROMPT, max_new_tokens=19, ignore_eos=True, **kw)
    assert_replays(drafts, out)
    assert len(drafts[-1].ids) == 19  # cut at max_new_tokens inside the last block
    assert any(ACCEPTED in d.states and MASKED in d.states for d in drafts)  # a real middle round


def test_a_stop_id_ends_the_last_draft(qwen):
    """With the stop id allowed, the output and the last draft end at the same place."""
    reasons = set()
    for n in range(3, 12):
        drafts, out = _drafts(qwen, PROMPT[:1] * n, max_new_tokens=48, rule="threshold")
        assert_replays(drafts, out)
        reasons.add(out.finish_reason)
    assert "stop" in reasons  # the case was exercised


@pytest.mark.parametrize("editing", ["quality", "speed"])
def test_llada_editing_replays(llada, editing):
    drafts, out = _drafts(llada, PROMPT, max_new_tokens=20, ignore_eos=True, editing=editing)
    assert_replays(drafts, out)


@pytest.mark.parametrize("rng", ["torch", "counter"])
def test_canvases_replay(gemma, rng):
    """DiffusionGemma: one draft per denoising step (static path: read from the step history
    after the canvas; torch's draws: the oracle, live); all of a canvas's rows are generated."""
    drafts, out = _drafts(gemma, _prompt(5, 0), max_new_tokens=20, rng=rng)
    assert_replays(drafts, out, canvas=True)
    assert len(drafts) == out.num_denoising_forwards


def test_text_helpers(qwen):
    drafts, out = _drafts(qwen, PROMPT, max_new_tokens=16, ignore_eos=True)
    decode = qwen.tokenizer.decode
    for d in drafts:
        body = d.to_dict(decode)
        assert "".join(s["text"] for s in body["spans"]) == body["text"]
        assert {s["state"] for s in body["spans"]} <= {FINAL, ACCEPTED, MASKED}
        assert "".join(s["state"] * len(s["text"]) for s in body["spans"]).isalpha()
        assert body["committed_text"] == decode(list(d.prefix))
    last = drafts[-1].to_dict(decode)
    assert last["committed_text"] + last["text"] == out.text


def test_stream_yields_the_drafts_and_the_output(qwen):
    drafts, out = _drafts(qwen, PROMPT, max_new_tokens=19, ignore_eos=True)
    stream = qwen.stream(PROMPT, max_new_tokens=19, ignore_eos=True)
    assert list(stream) == drafts
    assert stream.output.token_ids == out.token_ids


def test_stream_close_cancels_the_request(qwen):
    with qwen.stream(PROMPT, max_new_tokens=400, ignore_eos=True, block_length=1) as stream:
        first = next(stream)
    assert first.block == 0 and stream.output is None
    assert qwen.generate(PROMPT, max_new_tokens=8).token_ids  # the engine is free again


def test_stream_reraises_request_errors(qwen):
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(qwen.stream(PROMPT, max_new_tokens=0))


def test_on_round_must_be_callable(qwen):
    with pytest.raises(TypeError, match="on_round"):
        qwen.generate(PROMPT, on_round=3)


def test_cancel_through_should_stop_still_raises(qwen):
    with pytest.raises(GenerationCancelled):
        qwen.generate(PROMPT, on_round=lambda d: None, should_stop=lambda: True)
