"""Prefix reuse for DiffusionGemma (engine/prefix.py, granule 1): a request reuses the longest
common prefix of its prompt with the context rows earlier requests left (their prompts and
committed canvases), to the token, and decodes exactly what a cold request decodes (CPU, fp32).

Every expected count follows from the canvas layout alone: a request that ran to its length
leaves its prompt and every canvas but its last encoded (the last is never committed; its rows
hold the decoder passes' scratch K/V). The static path runs with counter noise (rng="counter");
rng="torch" runs the oracle, which does not touch the arena.
"""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch
from dg_helpers import CANVAS, VOCAB, ckpt  # noqa: F401

from dlmrt import LLM
from dlmrt.decoding import entropy_bound_canvas as ebc

NEW = 20  # max_new_tokens: three canvases of 8, the last one never committed
KW = dict(
    max_new_tokens=NEW,
    ignore_eos=True,
    rng="counter",
    max_denoising_steps=6,
    confidence_threshold=50.0,
)


def _ids(n: int, salt: int = 0) -> list[int]:
    """Token ids in [6, VOCAB) (clear of the test stop ids); distinct salts differ at row 0."""
    return [(37 * i + 11 + 5 * salt) % (VOCAB - 6) + 6 for i in range(n)]


@pytest.fixture(scope="module")
def pair(ckpt):  # noqa: F811
    """(an LLM with prefix reuse, the same checkpoint without), fp32 on the CPU."""
    torch.set_num_threads(1)  # tiny models on a busy 2-core box
    path = ckpt[0]
    return (
        LLM(path, device="cpu", dtype="float32"),
        LLM(path, device="cpu", dtype="float32", prefix_reuse=False),
    )


def _committed(prompt_len: int) -> int:
    """Context rows a request that ran to its length leaves: its prompt, its canvases but the
    last (never committed)."""
    return prompt_len + (math.ceil(NEW / CANVAS) - 1) * CANVAS


def test_a_conversation_decodes_as_cold_and_reuses_the_committed_canvases(pair):
    """Three turns (prompt 13 > the sliding window 5): the same tokens as cold, each turn reusing
    the previous prompt and its answer's committed canvases; the reused context rows hold what a
    cold encode of the same tokens writes (the canvases' rows come from their encoder pass)."""
    llm, cold = pair
    ids: list[int] = []
    held = 0  # context rows the previous turn left
    for turn, new in enumerate((_ids(13), _ids(5, 1), _ids(11, 2))):
        ids = ids + new
        out, ref = llm.generate(ids, **KW), cold.generate(ids, **KW)
        assert out.token_ids == ref.token_ids, turn
        assert ref.num_cached_tokens == 0 and cold.engine.prefix.reused == 0
        assert out.num_cached_tokens == llm.engine.prefix.reused == held, turn
        assert out.num_prefill_forwards == 1  # each turn adds tokens after the held rows
        held = _committed(len(ids))
        ids = ids + out.token_ids
    rows = len(ids) - len(out.token_ids)  # the last prompt's rows: reused here, encoded cold there
    a, c = llm.engine.workspace.arena, cold.engine.workspace.arena
    for layer in range(len(a.k)):
        for mine, theirs in ((a.k[layer], c.k[layer]), (a.v[layer], c.v[layer])):
            torch.testing.assert_close(mine[:, :rows], theirs[:, :rows], rtol=1e-5, atol=1e-5)


def test_the_last_canvas_is_never_reused(pair):
    """A prompt that repeats the whole answer reuses only its committed canvases: the last
    canvas's rows were written by decoder passes (scratch), not by an encoder pass."""
    llm, cold = pair
    prompt = _ids(9, 3)
    out = llm.generate(prompt, **KW)
    follow = prompt + out.token_ids
    again = llm.generate(follow, **KW)
    assert again.num_cached_tokens == _committed(len(prompt)) < len(follow)
    assert again.token_ids == cold.generate(follow, **KW).token_ids


def test_divergence_reuses_only_the_rows_before_it(pair):
    llm, cold = pair
    first = _ids(21, 4)
    assert llm.generate(first, **KW).num_cached_tokens == 0

    def reused(prompt: list[int]) -> int:
        out = llm.generate(prompt, **KW)
        assert out.token_ids == cold.generate(prompt, **KW).token_ids
        return out.num_cached_tokens

    inside = first[:11] + [first[11] % (VOCAB - 7) + 7] + first[12:]
    assert inside[11] != first[11]
    assert reused(inside) == 11  # to the token: every row before the first difference
    assert reused(first) == 11  # `inside` overwrote the rows from 11 on
    assert reused(first[:15]) == 15  # all held: no encoder pass at all
    out = llm.generate(first[:15], **KW)
    assert out.num_prefill_forwards == 0 and out.num_cached_tokens == 15
    assert reused(_ids(21, 5)) == 0  # fully different
    assert reused(first) == 0  # ... and that request overwrote row 0


def test_an_empty_prompt_reuses_nothing_and_forgets_what_it_overwrote(pair):
    llm, _ = pair
    prompt = _ids(10, 6)
    llm.generate(prompt, **KW)
    assert llm.generate(prompt, **KW).num_cached_tokens == len(prompt)
    settings = ebc.CanvasSettings(max_denoising_steps=6, confidence_threshold=50.0)
    res = llm.engine.generate([], settings, max_new_tokens=16, stop_ids=[], ignore_eos=True)
    assert res.cached_tokens == 0 and res.prefill_forwards == 0
    assert llm.engine.prefix.ids == res.token_ids[:CANVAS]  # its first canvas, from row 0
    assert llm.generate(prompt, **KW).num_cached_tokens == 0


def test_torch_noise_reuses_nothing_and_keeps_the_held_rows(pair):
    """rng="torch" runs the oracle (its own growing cache): it reuses nothing and leaves the
    arena and its held rows as they were."""
    llm, _ = pair
    prompt = _ids(12, 7)
    llm.generate(prompt, **KW)
    held = list(llm.engine.prefix.ids)
    assert llm.generate(prompt, **{**KW, "rng": "torch"}).num_cached_tokens == 0
    assert llm.engine.prefix.reused == 0 and llm.engine.prefix.ids == held
    assert llm.generate(prompt, **KW).num_cached_tokens == len(prompt)


@pytest.mark.parametrize("at", [0, 1])
def test_a_request_stopped_from_its_progress_callback_keeps_only_committed_canvases(pair, at):
    """The server ends a request by raising from `on_progress` (a stop string, a disconnect):
    the canvas just handed over is not committed yet (its encoder pass comes before the next
    canvas), so only the prompt and the canvases before it are held."""
    llm, cold = pair
    prompt, seen = _ids(7, 8 + at), []

    def stop(index, steps, tokens):
        seen.append(tokens)
        if index == at:
            raise RuntimeError("client left")

    with pytest.raises(RuntimeError, match="client left"):
        llm.generate(prompt, on_progress=stop, **KW)
    assert llm.engine.prefix.ids == prompt + seen[-1][: at * CANVAS]
    follow = prompt + seen[-1] + _ids(4, 9)
    out = llm.generate(follow, **KW)
    assert out.num_cached_tokens == len(prompt) + at * CANVAS
    assert out.token_ids == cold.generate(follow, **KW).token_ids


def test_the_controls(ckpt, pair):  # noqa: F811
    """On through `LLM` by default, off with prefix_reuse=False and for `LLM.from_model`."""
    llm, cold = pair
    assert llm.engine.prefix.enabled and not cold.engine.prefix.enabled
    live = LLM.from_model(llm.model, llm.tokenizer, path=ckpt[0])
    assert not live.engine.prefix.enabled


@pytest.mark.parametrize("reuse", [True, False])
def test_an_arena_growth_frees_the_old_arena_first(ckpt, monkeypatch, reuse):  # noqa: F811
    """Workspace.reserve drops the old context arena before allocating: nothing else (the
    prefix's bookkeeping included) may keep it alive, or growth peaks at old + new."""
    from dlmrt.engine.encoder_decoder import engine as ed_engine
    from dlmrt.engine.graph import workspace

    monkeypatch.setattr(workspace, "ARENA_QUANTUM", 16)
    llm = LLM(ckpt[0], device="cpu", dtype="float32", prefix_reuse=reuse)
    llm.generate(_ids(7, 10), **KW)
    old, alive, arena = weakref.ref(llm.engine.workspace.arena), [], ed_engine.ContextArena

    def new_arena(*args):
        gc.collect()
        alive.append(old() is not None)
        return arena(*args)

    monkeypatch.setattr(ed_engine, "ContextArena", new_arena)
    out = llm.generate(_ids(7, 10) + _ids(30, 11), **KW)
    assert alive == [False] and out.num_cached_tokens == 0
