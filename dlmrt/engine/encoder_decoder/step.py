"""The static canvas step: DiffusionGemma's denoising step over fixed buffers, graph-capturable.

`canvas_step` is the oracle's step (`dlmrt/reference/canvas.py`, `_denoise`'s loop body) with every per-step value in a device tensor
(canvas, self-conditioning logits, argmax, stability history, step counter, done flag) and every
shape fixed, so the graph modes capture it unchanged: no host sync, no data-dependent shape.
Noise is the counter RNG (`entropy_bound_canvas.counter_*`: hashed from seed, canvas index and
step, all device scalars); torch's generator cannot be replayed inside a WHILE body.

    begin(prompt start, seed)   eager: canvas 0's position, index 0, then `reset_canvas`
    canvas_step                 one decoder pass + the decoder's step, in place
    advance                     commit the argmax canvas (encoder pass over its canvas_length rows
                                at the device-side offset), move to the next canvas, `reset_canvas`
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrt import ops
from dlmrt.attention import AttnContext
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.decoding.noise import counter_uniform
from dlmrt.engine.kv_cache import ContextArena


@dataclass(frozen=True, slots=True)
class CanvasSpec:
    """What stays fixed for a set of buffers (and the graphs captured over them)."""

    model: torch.nn.Module
    settings: ebc.CanvasSettings

    @property
    def length(self) -> int:
        return self.model.cfg.canvas_length


class CanvasBuffers:
    """Static device state of the active canvas; one set per settings, reused across canvases."""

    def __init__(self, spec: CanvasSpec, device: torch.device) -> None:
        rows, cfg = spec.length, spec.model.cfg
        dtype = spec.model.embed_table.dtype
        long = dict(dtype=torch.long, device=device)
        self.canvas = torch.zeros(rows, **long)
        self.argmax = torch.zeros(rows, **long)
        self.sc = torch.zeros(rows, cfg.vocab_size, dtype=dtype, device=device)
        self.first = torch.ones((), dtype=torch.bool, device=device)  # no self-conditioning yet
        self.history = torch.full((spec.settings.stability_threshold, rows), -1, **long)
        self.step = torch.zeros((), **long)  # steps taken in this canvas
        self.done = torch.zeros((), dtype=torch.bool, device=device)
        self.start = torch.zeros((), **long)  # position of the canvas's first row
        self.index = torch.zeros((), **long)  # canvas index within the request
        self.seed = torch.zeros((), **long)
        self.offsets = torch.arange(rows, device=device)


def reset_canvas(spec: CanvasSpec, buf: CanvasBuffers) -> None:
    """A fresh noise canvas at (seed, index): draw step N + 1, as the oracle's `_denoise`."""
    n = spec.settings.max_denoising_steps
    draw = torch.full_like(buf.step, n + 1)
    vocab = spec.model.cfg.vocab_size
    buf.canvas.copy_(ebc.counter_canvas(buf.seed, buf.index, draw, spec.length, vocab))
    buf.first.fill_(True)
    buf.history.fill_(-1)
    buf.step.zero_()
    buf.done.zero_()


def begin(spec: CanvasSpec, buf: CanvasBuffers, start: int, seed: int) -> None:
    """Canvas 0 of a request (eager: host values into the static tensors, stream-ordered)."""
    buf.start.fill_(start)
    buf.index.zero_()
    buf.seed.fill_(seed)
    reset_canvas(spec, buf)


def canvas_step(spec: CanvasSpec, buf: CanvasBuffers, arena: ContextArena) -> None:
    """One denoising step in place: forward, T from the step counter (counting N down), softmax,
    counter sample, entropy, acceptance, re-noise, stability + confidence stop, history, step + 1."""
    s = spec.settings
    ctx = AttnContext(buf.start + buf.offsets, 1, arena)
    logits = spec.model(buf.canvas, ctx, spec.length, buf.sc, first=buf.first)
    t_step = s.max_denoising_steps - buf.step  # the reference's `step`: N, N - 1, ..., 1
    # one vocabulary pass (ops.canvas_vocab): softmax, counter sample (the uniform of
    # `ebc.counter_sample`), argmax, entropy, and logits / T into the self-conditioning buffer
    u = counter_uniform(buf.seed, buf.index, 2 * t_step, spec.length)
    temperature = ebc.temperature(s, t_step)
    argmax, entropy, sampled = ops.canvas_vocab(logits, temperature, u, buf.sc)
    accepted = ebc.accept(entropy, s.entropy_bound)
    vocab = spec.model.cfg.vocab_size
    renoise = ebc.counter_canvas(buf.seed, buf.index, t_step, spec.length, vocab)
    buf.done.copy_(ebc.is_stable(buf.history, argmax) & (entropy.mean() < s.confidence_threshold))
    buf.history.copy_(ebc.push(buf.history, argmax))
    buf.canvas.copy_(torch.where(accepted, sampled, renoise))
    buf.argmax.copy_(argmax)
    buf.first.fill_(False)
    buf.step.add_(1)


def encode(model, arena: ContextArena, ids: torch.Tensor, start: torch.Tensor) -> None:
    """Encoder pass of `ids` at positions start.. (the prompt eagerly; canvases via `advance`)."""
    pos = start + torch.arange(ids.shape[0], device=ids.device)
    model(ids, AttnContext(pos, 1, arena), 0, compute_logits=False)


def advance(spec: CanvasSpec, buf: CanvasBuffers, arena: ContextArena) -> None:
    """Commit the finished canvas (its argmax) into the arena, then start the next canvas."""
    encode(spec.model, arena, buf.argmax, buf.start)
    buf.start.add_(spec.length)
    buf.index.add_(1)
    reset_canvas(spec, buf)
