"""DiffusionGemma canvas decoding (`entropy_bound_canvas`) against transformers' `generate`."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from conftest import slow_unless
from dg_helpers import (
    SETTINGS,
    STOPS,
    VOCAB,
    _expected,
    _prompt,
    tiny_checkpoint,
)

from dlmrt import LLM
from dlmrt.attention import AttnContext
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.loading.checkpoint import load_checkpoint

dg = pytest.importorskip("transformers.models.diffusion_gemma")
gen_mod = pytest.importorskip("transformers.models.diffusion_gemma.generation_diffusion_gemma")

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> tuple:
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def llm(ckpt) -> LLM:
    return LLM(ckpt[0], device="cpu")


@pytest.mark.parametrize(
    ("settings", "prompt_len", "max_new"),
    [
        slow_unless(s % 3 == i, s, n, m)
        for s in range(len(SETTINGS))
        for i, (n, m) in enumerate([(3, 20), (13, 8), (5, 30)])
    ],
)
def test_generate_matches_transformers(ckpt, llm, settings, prompt_len, max_new):
    """Same seed, same tokens as transformers' generate (torch RNG mode), over stopping regimes,
    prompts longer than the sliding window and max_new_tokens not a multiple of the canvas."""
    _, hf = ckpt
    kw = SETTINGS[settings]
    for seed in range(3):
        prompt = _prompt(prompt_len, 100 * settings + seed)
        torch.manual_seed(seed)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=max_new, **kw)
        out = llm.generate(prompt, max_new_tokens=max_new, seed=seed, **kw)
        assert out.token_ids == _expected(ref.sequences[0, prompt_len:].tolist(), max_new)
        stopped = out.token_ids[-1] in STOPS
        assert out.finish_reason == ("stop" if stopped else "length")
        assert out.num_denoising_forwards == sum(out.rounds_per_block)
        assert out.num_commit_forwards == len(out.rounds_per_block) - 1
        if settings == 1:
            assert set(out.rounds_per_block) == {1}


def test_step_counts_follow_the_stopping_rule(llm):
    """The cap bounds every canvas; stability 2 needs at least 3 steps (two equal predecessors)."""
    out = llm.generate(_prompt(4, 1), max_new_tokens=24, ignore_eos=True, **SETTINGS[0])
    assert out.rounds_per_block == [6, 6, 6]
    out = llm.generate(_prompt(4, 1), max_new_tokens=24, ignore_eos=True, **SETTINGS[3])
    assert all(3 <= r <= 48 for r in out.rounds_per_block)


def test_counter_rng_is_deterministic_and_seeded(llm):
    kw = dict(max_new_tokens=16, ignore_eos=True, rng="counter", **SETTINGS[2])
    a = llm.generate(_prompt(5, 2), seed=3, **kw)
    b = llm.generate(_prompt(5, 2), seed=3, **kw)
    c = llm.generate(_prompt(5, 2), seed=4, **kw)
    assert a.token_ids == b.token_ids and a.rounds_per_block == b.rounds_per_block
    assert a.token_ids != c.token_ids
    assert all(0 <= t < VOCAB for t in a.token_ids)


def test_acceptance_matches_transformers_sampler():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(1, 16, 50, generator=gen) * torch.rand(1, 16, 1, generator=gen) * 6
        current = torch.randint(0, 50, (1, 16), generator=gen)
        denoised = torch.randint(0, 50, (1, 16), generator=gen)
        sampler = gen_mod.EntropyBoundSampler(
            gen_mod.EntropyBoundSamplerConfig(entropy_bound=0.7), 16, 50, 8
        )
        sampler.accept_canvas(current, denoised, logits, 3)
        entropy = ebc.token_entropy(logits[0])
        assert torch.equal(entropy, torch.distributions.Categorical(logits=logits[0]).entropy())
        assert torch.equal(ebc.accept(entropy, 0.7), sampler.accepted_token_mask[0])


def test_acceptance_on_crafted_entropies():
    h = torch.tensor([0.30, 0.05, 2.0, 0.10, 0.31])
    # sorted 0.05, 0.10, 0.30, 0.31, 2.0: exclusive sums 0, 0.05, 0.15, 0.45, 0.76
    assert ebc.accept(h, 0.2).tolist() == [True, True, False, True, False]
    assert ebc.accept(h, 0.5).tolist() == [True, True, False, True, True]
    assert ebc.accept(torch.tensor([5.0, 9.0]), 1e-6).tolist() == [True, False]  # >= 1 row


def test_temperature_schedule_matches_transformers():
    s = ebc.CanvasSettings(max_denoising_steps=48, t_min=0.4, t_max=0.8)
    proc = gen_mod.LinearTemperatureScheduleLogitsProcessor(0.4, 0.8, 48)
    x = torch.ones(1, 2)
    x = torch.randn(3, 5)
    for step in (48, 47, 24, 1):
        cur = torch.tensor(step, dtype=torch.int32)  # what transformers' generate passes
        assert torch.equal(x / ebc.temperature(s, step), proc(None, x, cur))
    assert float(ebc.temperature(s, 48)) == pytest.approx(0.8)


def test_stopping_matches_transformers_criterion():
    gen = torch.Generator().manual_seed(1)
    for threshold in (0, 1, 2):
        crit = gen_mod.StableAndConfidentStoppingCriteria(threshold, 1.5)
        history = torch.full((threshold, 6), -1)
        for _ in range(12):
            argmax = torch.randint(0, 2, (6,), generator=gen)
            logits = torch.randn(6, 4, generator=gen)
            ref = crit(argmax[None], logits[None])[0]
            ours = ebc.is_stable(history, argmax) & (ebc.token_entropy(logits).mean() < 1.5)
            history = ebc.push(history, argmax)
            assert bool(ours) == bool(ref)


def test_cached_passes_equal_the_full_forward(ckpt):
    """Encoder passes into the context cache, then a decoder pass over the canvas, give the same
    canvas logits as one no-cache forward over [context | canvas] (sliding window 5 < context)."""
    model = load_checkpoint(ckpt[0], torch.float32, CPU).model
    prompt, first, canvas = _prompt(7, 1), _prompt(8, 2), torch.tensor(_prompt(8, 3))
    sc = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(5))
    rows = torch.cat((torch.tensor(prompt + first), canvas))
    with torch.no_grad():
        full = model(rows, AttnContext(torch.arange(23), block_size=1), 8, sc)
        cache = model.new_cache(CPU)
        model(torch.tensor(prompt), AttnContext(torch.arange(7), block_size=1), cache=cache)
        model(torch.tensor(first), AttnContext(torch.arange(7, 15), block_size=1), cache=cache)
        out = model(canvas, AttnContext(torch.arange(15, 23), block_size=1), 8, sc, cache=cache)
    assert len(cache) == 15
    assert torch.allclose(out, full[-8:], atol=1e-5, rtol=1e-5)


def test_role_orl_reads_the_recorded_settings(ckpt, tmp_path, caplog):
    path = ckpt[0]
    gen = json.loads((path / "generation_config.json").read_text())
    where = tmp_path / "generation_config.json"
    base = dict(gen, max_denoising_steps=12, sampler_config={"entropy_bound": 0.3})
    assert ebc.CanvasSettings.from_generation_config(base, where, None) == ebc.CanvasSettings(
        max_denoising_steps=12, entropy_bound=0.3
    )
    with caplog.at_level(logging.WARNING, logger="dlmrt"):
        same = ebc.CanvasSettings.from_generation_config(base, where, "orl")
    assert same.entropy_bound == 0.3 and "no 'orl' decoder settings" in caplog.text
    orl = dict(base, orl={"entropy_bound": 0.6, "t_min": 0.2})
    settings = ebc.CanvasSettings.from_generation_config(orl, where, "orl")
    assert (settings.entropy_bound, settings.t_min, settings.max_denoising_steps) == (0.6, 0.2, 12)
    assert ebc.CanvasSettings.from_generation_config(orl, where, None).entropy_bound == 0.3
    with pytest.raises(ValueError, match=f"^{where}: t_min must be a number"):
        ebc.CanvasSettings.from_generation_config(dict(base, t_min="low"), where, None)


def test_bad_requests_name_the_problem(llm, base_ckpt):
    with pytest.raises(ValueError, match="rule: 'threshold' does not apply"):
        llm.generate([7, 8], rule="threshold")
    with pytest.raises(ValueError, match="temperature, block_length"):
        llm.generate([7, 8], temperature=0.5)
    with pytest.raises(ValueError, match="threshold, entropy_budget: block-rule settings do not"):
        llm.generate([7, 8], threshold=0.5, entropy_budget=0.4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        llm.generate([7] * 250, max_new_tokens=16)
    assert set(llm.model_config.image_token_ids) == {255999, 258880, 258882}  # from config.json
    with pytest.raises(ValueError, match="rng: expected"):
        llm.generate([7, 8], rng="philox")
    with pytest.raises(ValueError, match="DiffusionGemma checkpoints only"):
        LLM(base_ckpt, device="cpu").generate("hi", entropy_bound=0.2)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        LLM(llm.path, device="cpu", mode="block_graph")


def test_image_tokens_are_refused(ckpt):
    """Text only: a prompt holding an image token id (in the vocabulary here) is a clear error."""
    import dataclasses

    llm = LLM(ckpt[0], device="cpu")
    llm.model_config = dataclasses.replace(llm.model_config, image_token_ids=(90,))
    with pytest.raises(ValueError, match="image token id 90.*not supported"):
        llm.generate([7, 90, 8])


def test_text_prompt_and_chat_free_generation(llm):
    """Text prompts go through the tokenizer; TPF counts canvas tokens per denoising forward."""
    out = llm.generate("ab", max_new_tokens=8, ignore_eos=True, **SETTINGS[1])
    assert out.prompt_tokens == 2 and len(out.token_ids) == 8
    assert out.tokens_per_forward == 8.0 and out.mode == "eager"


@pytest.fixture(scope="module")
def hf_bf16(ckpt):
    # transformers' eager experts loop: the reference roundings (its grouped_mm path needs
    # 16-byte strides, which these tiny experts do not have on the CPU)
    return dg.DiffusionGemmaForBlockDiffusion.from_pretrained(
        ckpt[0], dtype=torch.bfloat16, experts_implementation="eager"
    ).eval()


def test_bf16_cached_logits_are_bitwise_transformers(ckpt, hf_bf16):
    """bf16: encoder pass into the cache, then a decoder pass with self-conditioning, equal
    transformers' forward bit for bit (prompt 13 > sliding window 5)."""
    model = load_checkpoint(ckpt[0], torch.bfloat16, CPU).model
    prompt, canvas = torch.tensor(_prompt(13, 4)), torch.tensor(_prompt(8, 5))
    sc = (torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(6)) * 3).bfloat16()
    with torch.no_grad():
        ref = hf_bf16(
            input_ids=prompt[None],
            decoder_input_ids=canvas[None],
            self_conditioning_logits=sc[None],
        ).logits[0]
        cache = model.new_cache(CPU)
        model(
            prompt, AttnContext(torch.arange(13), block_size=1), cache=cache, compute_logits=False
        )
        out = model(canvas, AttnContext(torch.arange(13, 21), block_size=1), 8, sc, cache=cache)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("settings", [0, slow_unless(False, 2)])
def test_bf16_generate_matches_transformers(ckpt, hf_bf16, settings):
    """bf16 follows transformers' roundings (Gemma norms in fp32, RoPE in bf16, 4-D SDPA, the
    sliding cache's key set), so sampled generations are token-identical too."""
    llm = LLM(ckpt[0], device="cpu", dtype="bfloat16")
    kw = SETTINGS[settings]
    for seed, (prompt_len, max_new) in enumerate([(3, 20), (13, 8), (9, 30)]):
        prompt = _prompt(prompt_len, 50 + seed)
        torch.manual_seed(seed)
        with torch.no_grad():
            ref = hf_bf16.generate(torch.tensor([prompt]), max_new_tokens=max_new, **kw)
        out = llm.generate(prompt, max_new_tokens=max_new, seed=seed, **kw)
        assert out.token_ids == _expected(ref.sequences[0, prompt_len:].tolist(), max_new)


def test_generate_hits_eos_like_transformers(ckpt, llm):
    """A run that stops at a stop id mid-canvas: same tokens, cut after the stop id."""
    _, hf = ckpt
    prompt = _prompt(5, 101)
    torch.manual_seed(1)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=30, **SETTINGS[0])
    out = llm.generate(prompt, max_new_tokens=30, seed=1, **SETTINGS[0])
    assert out.finish_reason == "stop" and out.token_ids[-1] in STOPS
    assert out.token_ids == _expected(ref.sequences[0, 5:].tolist(), 30)
    assert len(out.token_ids) % 8 != 0  # the stop id is mid-canvas


def test_counter_samples_follow_the_tempered_softmax():
    """20,000 independent rows of one distribution: frequencies within 0.015 of the probabilities."""
    noise = ebc.make_noise("counter", 7, 6, CPU)
    probs = torch.softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0]) / 0.7, dim=-1)
    draws = noise.sample(probs.expand(20_000, 6).contiguous(), 0, 5)
    freq = torch.bincount(draws, minlength=6).float() / 20_000
    assert (freq - probs).abs().max() < 0.015
    canvas = noise.canvas(20_000, 0, 5)
    assert canvas.min() == 0 and canvas.max() == 5
    assert (torch.bincount(canvas, minlength=6).float() / 20_000 - 1 / 6).abs().max() < 0.015


def test_counter_never_reuses_a_draw():
    """Every (canvas, step, purpose) gets its own uniforms: no two draws share their row vector."""
    noise = ebc.make_noise("counter", 3, 1000, CPU)
    seen = set()
    for index in range(4):
        for step in range(1, 50):
            probs = torch.full((8, 1000), 1e-3)
            for draw in (noise.canvas(8, index, step), noise.sample(probs, index, step)):
                key = tuple(draw.tolist())
                assert key not in seen
                seen.add(key)
