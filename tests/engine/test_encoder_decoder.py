"""DiffusionGemma's static canvas path (arena + `canvas_step`, the graph modes' step) on the CPU.

Its eager runner must give the oracle's (`reference.canvas.generate(rng="counter")`) tokens in
fp32; the GPU file test_encoder_decoder_gpu.py checks round_graph and block_graph against it.
"""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import slow_unless
from dg_helpers import SETTINGS, STOPS, VOCAB, _prompt, ckpt  # noqa: F401

from dlmrt import LLM, reference
from dlmrt.attention import AttnContext
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.engine import EncoderDecoderEngine
from dlmrt.engine.graph import workspace
from dlmrt.engine.kv_cache import ContextArena
from dlmrt.errors import GenerationCancelled
from dlmrt.loading.checkpoint import load_checkpoint

CPU = torch.device("cpu")
CASES = [(3, 20), (13, 8), (5, 30)]  # prompt 13 > sliding window 5; 20, 30: not whole canvases


@pytest.fixture(scope="module")
def engines(ckpt):  # noqa: F811
    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    return model, EncoderDecoderEngine(model, CPU, "eager")


def _both(engines, prompt, settings, max_new, seed, **kw):
    model, static = engines
    args = dict(max_new_tokens=max_new, stop_ids=list(STOPS), seed=seed, **kw)
    ref = reference.canvas.generate(model, prompt, settings, rng="counter", **args)
    return ref, static.generate(prompt, settings, **args)


def _same(a, b) -> None:
    assert b.token_ids == a.token_ids
    assert b.rounds_per_block == a.rounds_per_block and b.finish_reason == a.finish_reason
    assert (b.denoising_forwards, b.commit_forwards) == (a.denoising_forwards, a.commit_forwards)


@pytest.mark.parametrize("settings", [slow_unless(s in (0, 3), s) for s in range(len(SETTINGS))])
def test_static_eager_matches_the_reference(engines, settings):
    """Token for token (and step for step) with the oracle (rng="counter"), fp32, one engine
    reused across every request (its buffers and arena carry over)."""
    s = ebc.CanvasSettings(**SETTINGS[settings])
    for seed in range(3):
        for prompt_len, max_new in CASES:
            a, b = _both(engines, _prompt(prompt_len, 10 * settings + seed), s, max_new, seed)
            _same(a, b)
            assert b.mode == "eager"
    assert s in engines[1].workspace.programs


def test_default_settings_and_ignore_eos(engines):
    """The checkpoint defaults (48 steps, confidence stop) over several canvases."""
    for seed in range(2):
        a, b = _both(engines, _prompt(9, seed), ebc.CanvasSettings(), 24, seed, ignore_eos=True)
        _same(a, b)
        assert len(b.token_ids) == 24


def test_a_stop_id_mid_canvas(engines):
    """A request that stops at a stop id inside a canvas: same cut, same reason."""
    s = ebc.CanvasSettings(**SETTINGS[0])
    for seed in range(40):
        a, b = _both(engines, _prompt(5, 200 + seed), s, 30, seed)
        _same(a, b)
        if a.finish_reason == "stop" and len(a.token_ids) % 8:
            return
    pytest.fail("no seed stopped mid-canvas")


def test_requests_reuse_the_runner(engines):
    """Two requests in a row: one runner (graphs in the graph modes), identical outputs."""
    static = engines[1]
    s = ebc.CanvasSettings(**SETTINGS[2])
    first = static.generate(_prompt(6, 3), s, max_new_tokens=17, stop_ids=[], seed=4)
    program = static.workspace.programs[s]
    second = static.generate(_prompt(6, 3), s, max_new_tokens=17, stop_ids=[], seed=4)
    assert static.workspace.programs[s] is program and first.token_ids == second.token_ids
    assert first.rounds_per_block == second.rounds_per_block


def test_an_empty_prompt(engines, ckpt):  # noqa: F811
    """No encoder pass before the first canvas (it starts at position 0): the reference path ran
    the model over zero rows and crashed; both paths now agree and count no prefill forward."""
    for si, max_new in ((0, 8), (2, 20)):
        s = ebc.CanvasSettings(**SETTINGS[si])
        a, b = _both(engines, [], s, max_new, si)
        _same(a, b)
        assert a.prefill_forwards == b.prefill_forwards == 0
    with pytest.raises(ValueError, match="prompt: is empty"):  # LLM refuses one, as the server
        LLM(ckpt[0], device="cpu").generate([], max_new_tokens=10, ignore_eos=True)


def test_arena_growth_keeps_tokens(ckpt, monkeypatch):  # noqa: F811
    """A small quantum forces growth on a longer request: the runners are dropped and rebuilt
    over the new arena, and tokens still match the reference."""
    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    engines = model, EncoderDecoderEngine(model, CPU, "eager")
    monkeypatch.setattr(workspace, "ARENA_QUANTUM", 16)
    s = ebc.CanvasSettings(**SETTINGS[0])
    space = engines[1].workspace
    _same(*_both(engines, _prompt(3, 1), s, 8, 1))
    small, program = space.arena, space.programs[s]
    assert small.max_len == 32  # 3 + (1 + 1) * 8 = 19 rows, rounded up to 16s
    _same(*_both(engines, _prompt(13, 2), s, 30, 2, ignore_eos=True))
    assert space.arena.max_len == 64 and space.programs[s] is not program
    _same(*_both(engines, _prompt(4, 3), s, 16, 3))  # smaller again: no shrink
    assert space.arena.max_len == 64


def test_decoder_pass_over_the_arena_equals_the_cache(ckpt):  # noqa: F811
    """One decoder pass over the padded arena == the growing cache's, fp32, with and without
    self-conditioning (the `first` flag stands for sc_logits=None); context 21 > window 5."""
    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    prompt, first, canvas = (torch.tensor(_prompt(n, i)) for i, n in ((1, 13), (2, 8), (3, 8)))
    sc = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(5)) * 3
    with torch.no_grad():
        cache, arena = model.new_cache(CPU), ContextArena(model.cfg, 40, torch.float32, CPU)
        for ids, start in ((prompt, 0), (first, 13)):
            pos = torch.arange(start, start + len(ids))
            model(ids, AttnContext(pos, block_size=1), cache=cache, compute_logits=False)
            model(ids, AttnContext(pos, 1, arena), compute_logits=False)
        ctx = AttnContext(torch.arange(21, 29), block_size=1)
        static = AttnContext(torch.arange(21, 29), 1, arena)
        for sc_in, flag in ((sc, False), (None, True)):
            ref = model(canvas, ctx, 8, sc_in, cache=cache)
            out = model(canvas, static, 8, sc, first=torch.tensor(flag))
            assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_device_scalar_helpers_equal_the_host_ones():
    """temperature() of a device step, counter_canvas/counter_sample: CounterNoise's bits."""
    s = ebc.CanvasSettings(max_denoising_steps=48, t_min=0.4, t_max=0.8)
    for step in (48, 47, 13, 1):
        assert torch.equal(ebc.temperature(s, torch.tensor(step)), ebc.temperature(s, step))
    noise, t = ebc.make_noise("counter", 5, 50, CPU), torch.tensor
    probs = torch.softmax(torch.randn(16, 50, generator=torch.Generator().manual_seed(0)), -1)
    assert torch.equal(noise.canvas(16, 2, 7), ebc.counter_canvas(t(5), t(2), t(7), 16, 50))
    assert torch.equal(noise.sample(probs, 2, 7), ebc.counter_sample(probs, t(5), t(2), t(7)))


def test_torch_rng_runs_the_oracle_and_the_static_path_can_be_cancelled(engines):
    (model, static), s = engines, ebc.CanvasSettings(**SETTINGS[0])
    kw = dict(max_new_tokens=8, stop_ids=[], seed=4)
    out = static.generate([7, 8], s, rng="torch", **kw)
    assert out.token_ids == reference.canvas.generate(model, [7, 8], s, rng="torch", **kw).token_ids
    with pytest.raises(ValueError, match="rng: expected 'torch' or 'counter'"):
        static.generate([7, 8], s, max_new_tokens=8, stop_ids=[], rng="philox")
    calls = []
    with pytest.raises(GenerationCancelled):
        static.generate(
            [7, 8], s, max_new_tokens=8, stop_ids=[], should_stop=lambda: calls.append(1) or True
        )
    assert calls == [1]


def test_cpu_mode_is_eager_with_a_reason(ckpt):  # noqa: F811
    llm = LLM(ckpt[0], device="cpu")
    assert llm.mode == "eager" and "no CUDA graphs" in llm.mode_reason
    assert isinstance(llm.engine, EncoderDecoderEngine) and llm.engine.mode == "eager"
    out = llm.generate(_prompt(4, 1), max_new_tokens=8, **SETTINGS[1])
    assert out.mode == "eager"
    with pytest.raises(ValueError, match="mode: round_graph needs a CUDA device"):
        LLM(ckpt[0], device="cpu", mode="round_graph")


class _Spy(EncoderDecoderEngine):
    """The engine with eager runners, standing in for a graph mode on the CPU; counts the
    requests that ran its static path (each fetches a program)."""

    def __init__(self, model, device, mode, kv_cache_dtype="auto", prefix_reuse=False):
        super().__init__(model, device, "eager", kv_cache_dtype, prefix_reuse)
        self.mode, self.calls = mode, 0

    def program(self, *args, **kwargs):
        self.calls += 1
        return super().program(*args, **kwargs)


def test_rng_decision_on_a_graph_mode_llm(ckpt, monkeypatch, caplog):  # noqa: F811
    """A graph-mode LLM draws counter noise by default (static path); an explicit rng="torch"
    runs the eager reference path (transformers' draws), says "eager", and logs it once."""
    import dlmrt.llm as llm_mod
    import dlmrt.styles.encoder_decoder as encoder_decoder_style

    monkeypatch.setattr(
        llm_mod, "select_mode", lambda mode, device, moe=False: ("block_graph", "test")
    )
    monkeypatch.setattr(encoder_decoder_style, "EncoderDecoderEngine", _Spy)
    llm = LLM(ckpt[0], device="cpu", dtype="float32")
    assert llm.mode == "block_graph" and llm.engine.mode == "block_graph"
    kw = dict(max_new_tokens=20, seed=2, **SETTINGS[2])
    fast = llm.generate(_prompt(7, 1), **kw)
    assert llm.engine.calls == 1
    s, stops = ebc.CanvasSettings(**SETTINGS[2]), sorted(llm.stop_ids)
    args = dict(max_new_tokens=20, stop_ids=stops, seed=2)
    ref = reference.canvas.generate(llm.model, _prompt(7, 1), s, rng="counter", **args)
    assert fast.token_ids == ref.token_ids
    with caplog.at_level(logging.INFO, logger="dlmrt"):
        slow = llm.generate(_prompt(7, 1), rng="torch", **kw)
        again = llm.generate(_prompt(7, 1), rng="torch", **kw)
    assert llm.engine.calls == 1 and slow.mode == again.mode == "eager"
    assert caplog.text.count("eager reference path") == 1
    torch_ref = reference.canvas.generate(llm.model, _prompt(7, 1), s, rng="torch", **args)
    assert slow.token_ids == torch_ref.token_ids
