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
from dlmrt.account import label
from dlmrt.attention import AttnContext
from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.decoding.noise import counter_uniform
from dlmrt.engine.kv_cache import ContextArena
from dlmrt.outputs import CanvasStepRecord
from dlmrt.parallel import group as tp
from dlmrt.parallel import vocab as tp_vocab


@dataclass(frozen=True, slots=True)
class CanvasSpec:
    """What stays fixed for a set of buffers (and the graphs captured over them)."""

    model: torch.nn.Module
    settings: ebc.CanvasSettings
    trace: bool = False  # keep a device-side history of every step (`CanvasBuffers.trace_*`)
    vocab_kernel: str = (
        "split"  # `ops.canvas_vocab`'s kernel on CUDA, or "onepass" (`vocab_choice.py`)
    )

    @property
    def one_pass(self) -> bool:
        """The step's vocabulary runs as `ops.canvas_vocab_pass` from the final normed hidden."""
        return self.vocab_kernel == "onepass"

    @property
    def length(self) -> int:
        return self.model.cfg.canvas_length


class CanvasBuffers:
    """Static device state of the active canvas; one set per settings, reused across canvases."""

    def __init__(self, spec: CanvasSpec, device: torch.device) -> None:
        rows = spec.length
        dtype = spec.model.embed_table.dtype
        long = dict(dtype=torch.long, device=device)
        self.canvas = torch.zeros(rows, **long)
        self.argmax = torch.zeros(rows, **long)
        vocab = spec.model.lm_head.out_features  # tensor parallel: this rank's vocabulary shard
        # The next step's self-conditioning input: softmax of this step's tempered logits, in
        # the model dtype (the vocabulary pass writes it; the model's soft embedding is one GEMM),
        # or with the one pass that GEMM's product already (probs @ E [rows, hidden]).
        width = spec.model.cfg.hidden_size if spec.one_pass else vocab
        self.sc = torch.zeros(rows, width, dtype=dtype, device=device)
        self.first = torch.ones((), dtype=torch.bool, device=device)  # no self-conditioning yet
        self.history = torch.full((spec.settings.stability_threshold, rows), -1, **long)
        self.step = torch.zeros((), **long)  # steps taken in this canvas
        self.done = torch.zeros((), dtype=torch.bool, device=device)
        self.start = torch.zeros((), **long)  # position of the canvas's first row
        self.index = torch.zeros((), **long)  # canvas index within the request
        self.seed = torch.zeros((), **long)
        self.offsets = torch.arange(rows, device=device)
        # The step history (spec.trace): row k = step k of the active canvas, written inside the
        # step body (graph-safe: indexed by the device-side counter) and read after the canvas.
        self.trace_argmax = self.trace_confidence = self.trace_accepted = None
        if spec.trace:
            steps = spec.settings.max_denoising_steps
            self.trace_argmax = torch.zeros(steps, rows, **long)
            self.trace_confidence = torch.zeros(steps, rows, dtype=torch.float32, device=device)
            self.trace_accepted = torch.zeros(steps, rows, dtype=torch.bool, device=device)


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
    t_step = s.max_denoising_steps - buf.step  # the reference's `step`: N, N - 1, ..., 1
    if spec.one_pass:
        h = spec.model(buf.canvas, ctx, spec.length, sc_embed=buf.sc, first=buf.first, normed=True)
        head, table = spec.model.lm_head.weight, spec.model.embed_table
        with label("canvas_vocab_pass", h, head, table, writes=(buf.sc,)):
            sampled, argmax, entropy, confidence = _one_pass(spec, buf, h, t_step)
    else:
        raw = spec.model(
            buf.canvas, ctx, spec.length, sc_probs=buf.sc, first=buf.first, softcap=False
        )
        with label("canvas_vocab", raw, writes=(buf.sc,)):
            sampled, argmax, entropy, confidence = _vocab_pass(spec, buf, raw, t_step)
    with label("rule", buf.canvas):
        _decide(spec, buf, t_step, sampled, argmax, entropy, confidence)


def _decide(spec: CanvasSpec, buf: CanvasBuffers, t_step, sampled, argmax, entropy, confidence):
    """The step's rule from its vocabulary pass: acceptance, re-noise, the stop test, the
    canvas, the trace; the step counter advanced."""
    s = spec.settings
    accepted = ebc.accept(entropy, s.entropy_bound)
    vocab = spec.model.cfg.vocab_size
    renoise = ebc.counter_canvas(buf.seed, buf.index, t_step, spec.length, vocab)
    buf.done.copy_(ebc.is_stable(buf.history, argmax) & (entropy.mean() < s.confidence_threshold))
    buf.history.copy_(ebc.push(buf.history, argmax))
    buf.canvas.copy_(torch.where(accepted, sampled, renoise))
    buf.argmax.copy_(argmax)
    if buf.trace_argmax is not None:  # fixed per spec: the same branch every step
        _trace(buf, argmax, confidence, accepted)
    buf.first.fill_(False)
    buf.step.add_(1)


def _vocab_pass(spec: CanvasSpec, buf: CanvasBuffers, raw: torch.Tensor, t_step: torch.Tensor):
    """(counter sample, argmax, entropy, argmax probability) of softmax(z), z = softcapped(raw) / T
    from the LM head's output `raw`; the next step's self-conditioning probabilities written into
    `buf.sc`. One device: ops.canvas_vocab (softcap, softmax, the uniform of
    `ebc.counter_sample`, argmax, entropy, sc; on CUDA the kernel `spec.vocab_kernel`: one program
    per row, or rows x vocabulary splits); the argmax probability (for the draft trace only) is a
    second pass. Tensor parallel: `_draw` over the vocabulary shards."""
    temperature = ebc.temperature(spec.settings, t_step)
    cap = spec.model.cfg.final_logit_softcapping
    if tp.active() is not None:
        z = ops.vocab.softcapped(raw, cap) / temperature
        out = _draw(z, buf, t_step)
        probs = spec.model.self_conditioning_probs(z.to(buf.sc.dtype), 1.0)  # over the shards
        buf.sc.copy_(probs.to(buf.sc.dtype))
        return out
    u = counter_uniform(buf.seed, buf.index, 2 * t_step, spec.length)
    argmax, entropy, sampled = ops.canvas_vocab(raw, cap, temperature, u, buf.sc, spec.vocab_kernel)
    confidence = None
    if buf.trace_argmax is not None:  # from z in the model dtype (the old sc buffer)
        z = ops.vocab.softcapped(raw, cap) / temperature
        confidence = ops.vocab.confidence(z, argmax, buf.sc.dtype)
    return sampled, argmax, entropy, confidence


def _one_pass(spec: CanvasSpec, buf: CanvasBuffers, h: torch.Tensor, t_step: torch.Tensor):
    """`_vocab_pass` from the final normed hidden h in one stream over the vocabulary
    (`ops.canvas_vocab_pass`: the LM head too), writing the next step's self-conditioning
    embedding probs @ E into `buf.sc`; the argmax probability comes with it."""
    model = spec.model
    temperature = ebc.temperature(spec.settings, t_step)
    u = counter_uniform(buf.seed, buf.index, 2 * t_step, spec.length)
    cap = model.cfg.final_logit_softcapping
    argmax, entropy, sampled, confidence = ops.canvas_vocab_pass(
        h, model.lm_head.weight, model.embed_table, cap, temperature, u, buf.sc
    )
    return sampled, argmax, entropy, confidence


def _draw(z: torch.Tensor, buf: CanvasBuffers, t_step: torch.Tensor):
    """(counter sample, argmax, entropy, argmax probability) of softmax(z) per row. Tensor
    parallel: z is this rank's vocabulary shard, combined across the ranks
    (`dlmrt/parallel/vocab.py`)."""
    group = tp.active()
    if group is None:
        probs = torch.softmax(z, dim=-1, dtype=torch.float32)
        sampled = ebc.counter_sample(probs, buf.seed, buf.index, t_step)
        argmax = torch.argmax(z, dim=-1)
        confidence = probs.gather(-1, argmax[:, None])[:, 0]
        return sampled, argmax, ebc.token_entropy(z), confidence
    argmax, confidence, entropy, log_z = tp_vocab.token_stats(z, 0.0, group)
    u = counter_uniform(buf.seed, buf.index, 2 * t_step, z.shape[0])  # as `ebc.counter_sample`
    sampled, _ = tp_vocab.sample(z, 0.0, log_z, u, group)
    return sampled, argmax, entropy, confidence


def _trace(buf: CanvasBuffers, argmax, confidence, accepted) -> None:
    """Row `buf.step` of the history (before the counter advances). Inside the loop step < cap;
    the clamp keeps a graph warm-up (two bodies from step 0, restored afterwards) in bounds when
    cap is 1: an out-of-range index_copy_ would be a device-side assert."""
    at = buf.step.clamp(max=buf.trace_argmax.shape[0] - 1).view(1)
    buf.trace_argmax.index_copy_(0, at, argmax[None])
    buf.trace_confidence.index_copy_(0, at, confidence[None])
    buf.trace_accepted.index_copy_(0, at, accepted[None])


def read_trace(buf: CanvasBuffers, index: int, steps: int) -> list[CanvasStepRecord]:
    """The finished canvas's `steps` records (device-side clones, no host read)."""
    argmax, conf = buf.trace_argmax[:steps].clone(), buf.trace_confidence[:steps].clone()
    accepted = buf.trace_accepted[:steps].clone()
    return [CanvasStepRecord(index, k, argmax[k], conf[k], accepted[k]) for k in range(steps)]


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
