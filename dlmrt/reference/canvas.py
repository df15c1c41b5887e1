"""The encoder-decoder oracle: DiffusionGemma's canvas decoding exactly as transformers' `generate`.

A growing context cache (the model's `ContextCache`), torch's draws (`rng="torch"`: transformers'
own noise) or the counter noise (`rng="counter"`: what the engine's static path draws, so the two
can be compared token for token), one host read of the stop flag per step, no graphs, no static
buffers. `LLM` also serves requests with `rng="torch"` through it: torch's generator cannot be
replayed inside a CUDA graph (those requests report mode "eager").
"""

from __future__ import annotations

from typing import Protocol

import torch

from dlmrt.attention import AttnContext
from dlmrt.canvas_loop import canvas_loop
from dlmrt.config import EAGER
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.errors import GenerationCancelled
from dlmrt.outputs import (
    CanvasRecorder,
    CanvasStepRecord,
    EngineResult,
    ProgressCallback,
    StopCheck,
)


class CanvasGrammar(Protocol):
    """What the step loop asks of a structured request's grammar
    (`dlmrt/engine/encoder_decoder/structured.py`)."""

    @property
    def done(self) -> bool: ...
    def stops(self, length: int, device: torch.device) -> torch.Tensor: ...
    def mask(self, logits: torch.Tensor) -> torch.Tensor: ...
    def settle(self, logits: torch.Tensor) -> torch.Tensor: ...


@torch.inference_mode()
def generate(
    model: torch.nn.Module,
    prompt: list[int],
    settings: ebc.CanvasSettings,
    *,
    max_new_tokens: int,
    stop_ids: list[int],
    seed: int = 0,
    rng: str = "torch",
    ignore_eos: bool = False,
    on_progress: ProgressCallback | None = None,
    should_stop: StopCheck | None = None,
    recorder: CanvasRecorder | None = None,
    grammar: CanvasGrammar | None = None,
) -> EngineResult:
    """Decode one request; the result counts forwards as the engine does. `recorder` gets each
    step's `CanvasStepRecord` as the step runs. `grammar` (a structured request) masks each step's
    logits and settles each canvas (`engine/encoder_decoder/structured.py`)."""
    device = model.embed_table.device
    length = model.cfg.canvas_length
    noise = ebc.make_noise(rng, seed, model.cfg.vocab_size, device)
    cache = model.new_cache(device)
    if prompt:  # an empty prompt has no encoder pass (the first canvas starts at position 0)
        _encode(model, prompt, 0, cache)
    start = [len(prompt)]

    def denoise(index: int) -> tuple[torch.Tensor, int]:
        return _denoise(
            model, start[0], settings, noise, index, cache, should_stop, recorder, grammar
        )

    def commit(canvas: list[int]) -> None:
        _encode(model, canvas, start[0], cache)
        start[0] += length

    res = canvas_loop(
        denoise,
        commit,
        canvas_length=length,
        max_new_tokens=max_new_tokens,
        stop_ids=stop_ids,
        ignore_eos=ignore_eos,
        on_progress=on_progress,
        mode=EAGER,
    )
    res.prefill_forwards = int(bool(prompt))
    return res


def _encode(model, ids: list[int], start: int, cache) -> None:
    device = model.embed_table.device
    pos = torch.arange(start, start + len(ids), device=device)
    rows = torch.tensor(ids, dtype=torch.long, device=device)
    model(rows, AttnContext(pos, 1), 0, compute_logits=False, cache=cache)


def _denoise(
    model,
    start: int,
    s: ebc.CanvasSettings,
    noise,
    index: int,
    cache,
    should_stop,
    recorder,
    grammar=None,
):
    """Refine one canvas; -> (argmax canvas [L] on the device, denoising steps taken). With a
    grammar, every step's logits are masked first and the last step's argmax is settled through
    it (a valid prefix)."""
    length, device = model.cfg.canvas_length, model.embed_table.device
    if grammar is not None and grammar.done:  # stop rows only: no step needed
        return grammar.stops(length, device), 0
    ctx = AttnContext(torch.arange(start, start + length, device=device), 1)
    canvas = noise.canvas(length, index, s.max_denoising_steps + 1)
    history = torch.full((s.stability_threshold, length), -1, device=device)
    sc, argmax, taken = None, canvas, 0
    for step in range(s.max_denoising_steps, 0, -1):
        if should_stop is not None and should_stop():
            raise GenerationCancelled("request cancelled")
        logits = model(canvas, ctx, length, sc, cache=cache)
        if grammar is not None:
            logits = grammar.mask(logits)
        z = logits / ebc.temperature(s, step, device)
        probs = torch.softmax(z, dim=-1, dtype=torch.float32)
        sampled = noise.sample(probs, index, step)
        argmax = torch.argmax(z, dim=-1)
        entropy = ebc.token_entropy(z)
        accepted = ebc.accept(entropy, s.entropy_bound)
        canvas = torch.where(accepted, sampled, noise.canvas(length, index, step))
        done = ebc.is_stable(history, argmax) & (entropy.mean() < s.confidence_threshold)
        history = ebc.push(history, argmax)
        if recorder is not None:
            conf = probs.gather(-1, argmax[:, None])[:, 0]
            recorder(CanvasStepRecord(index, taken, argmax, conf, accepted))
        sc, taken = z.to(model.embed_table.dtype), taken + 1
        if bool(done):  # one host read per step (the engine keeps it on the device)
            break
    if grammar is not None:
        argmax = grammar.settle(z)
    return argmax, taken
