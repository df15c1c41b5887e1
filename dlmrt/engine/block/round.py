"""The denoising round: one forward of the active block, the proposal, the rule, the next residual.

`RoundSpec.decide` is the pure per-round decision (shared with the oracle); `denoise_round` runs a
round over static `BlockBuffers` in place. Neither syncs with the host or allocates shapes that
depend on data, so the graph modes capture `denoise_round` unchanged: the block's position, the
round counter and the sampling seed are device tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from dlmrt.account import label
from dlmrt.attention import AttnContext
from dlmrt.decoding import DecodeRule, Proposal, RuleOutput, propose
from dlmrt.decoding.noise import counter_uniform
from dlmrt.engine.block import vocab_step
from dlmrt.models.residual import soft_embedding


class Decision(NamedTuple):
    out: RuleOutput  # new canvas, unresolved, accepted, done
    proposal: Proposal
    z: torch.Tensor | None  # [B, hidden] residual for the next round (None: Base model)


@dataclass(frozen=True, slots=True)
class RoundSpec:
    """What stays fixed for a request: the model, the rule, the sampling temperature, the block
    length; and whether its rounds run the vocabulary in one pass from the final hidden
    (`one_pass`: `engine/block/vocab_step.py`, decided here). `allow_one_pass` False keeps the
    logits whatever the setting: a structured request masks them before `decide`."""

    model: torch.nn.Module
    rule: DecodeRule
    temperature: float
    block_length: int
    allow_one_pass: bool = True
    one_pass: bool = field(init=False)

    def __post_init__(self) -> None:
        on = self.allow_one_pass and vocab_step.one_pass(self.model, self.temperature)
        object.__setattr__(self, "one_pass", on)

    def head_out(self, ids: torch.Tensor, ctx: AttnContext, **kw) -> torch.Tensor:
        """The model's forward for a round: the logits, or the final normed hidden with
        `one_pass` (what `decide` takes)."""
        return (
            self.model(ids, ctx, normed=True, **kw) if self.one_pass else self.model(ids, ctx, **kw)
        )

    @property
    def has_residual(self) -> bool:
        return getattr(self.model, "adapter", None) is not None

    def receives(self, unresolved: torch.Tensor) -> torch.Tensor:
        """Rows that get alpha * g(z): the adapter decides (`ResidualAdapter.receives`)."""
        return self.model.adapter.receives(unresolved)

    def decide(
        self,
        logits: torch.Tensor,  # [B, V] this round's logits of the block rows ([B, hidden]: see below)
        canvas: torch.Tensor,
        unresolved: torch.Tensor,
        step: torch.Tensor,  # [] int64 rounds already run in this block
        seed: torch.Tensor,  # [] int64
        block_start: torch.Tensor,  # [] int64
        editable: torch.Tensor | None = None,  # [B] bool rows the request generates (editing rules)
        post_steps: torch.Tensor | None = None,  # [] int64 post-fill rounds so far (editing rules)
        with_z: bool = True,  # False: skip the next residual (a folded check half never uses it)
    ) -> Decision:
        """Proposal + rule + next residual; sampling noise is counter-based (seed, block, round, row).
        With `one_pass`, `logits` is the final normed hidden (`head_out`) and the vocabulary pass
        makes the proposal and z from it."""
        if self.one_pass:
            prop, z = vocab_step.propose_one_pass(
                self.model, logits, self.temperature, self.has_residual and with_z
            )
            with label("rule", canvas):
                out = self.rule(prop, canvas, unresolved, step, editable, post_steps)
            return Decision(out, prop, z)
        with label("vocab_stats", logits):
            noise = None
            if self.temperature > 0:
                noise = counter_uniform(seed, block_start, step, logits.shape[0])
            prop = propose(logits, self.temperature, noise)
        with label("rule", canvas):
            out = self.rule(prop, canvas, unresolved, step, editable, post_steps)
        z = None
        if self.has_residual and with_z:
            t_res = self.model.adapter.cfg.temperature
            # Reuse the decoder's log-normaliser when both softmaxes use the same temperature.
            same = t_res == (self.temperature if self.temperature > 0 else 1.0)
            z = soft_embedding(logits, self.model.embed_table, t_res, prop.log_z if same else None)
        return Decision(out, prop, z)


class BlockBuffers:
    """Static device state of the active block; one set per block length, reused across blocks."""

    def __init__(self, spec: RoundSpec, device: torch.device) -> None:
        rows, model = spec.block_length, spec.model
        self.canvas = torch.zeros(rows, dtype=torch.long, device=device)
        self.unresolved = torch.zeros(rows, dtype=torch.bool, device=device)
        self.z = None
        if spec.has_residual:
            self.z = torch.zeros(
                rows, model.cfg.hidden_size, dtype=model.embed_table.dtype, device=device
            )
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.done = torch.zeros((), dtype=torch.bool, device=device)
        self.block_start = torch.zeros((), dtype=torch.long, device=device)
        self.seed = torch.zeros((), dtype=torch.long, device=device)
        self.offsets = torch.arange(rows, device=device)
        self.entropy = torch.zeros(rows, dtype=torch.float32, device=device)  # last round's
        self.accepted = torch.zeros(rows, dtype=torch.bool, device=device)  # last round's
        # Editing rules: the rows this request generates (the initial unresolved rows: never the
        # prompt tail), the rows the last round edited, and the post-fill round counter.
        self.editable = torch.zeros(rows, dtype=torch.bool, device=device)
        self.edited = torch.zeros(rows, dtype=torch.bool, device=device)
        self.post_steps = torch.zeros((), dtype=torch.long, device=device)
        # Commit folding (engine/fold.py): the block's initial canvas (a discarded joint pass
        # restores it), `halt` = the round loop's stop flag (done, or all rows filled when
        # `until_filled`: the post-fill checks then run folded into the next block's first pass).
        self.init_canvas = torch.zeros(rows, dtype=torch.long, device=device)
        self.halt = torch.zeros((), dtype=torch.bool, device=device)
        self.until_filled = torch.zeros((), dtype=torch.bool, device=device)

    def load(
        self,
        canvas: torch.Tensor,
        unresolved: torch.Tensor,
        block_start: int,
        seed: int,
        until_filled: bool = False,
    ) -> None:
        """Start a block from device tensors: stream-ordered copies into the static tensors, z = 0,
        round 0 (benchmarks start a block of any canvas so; the engine uses `block_io.BlockIO`)."""
        self.canvas.copy_(canvas)
        self.init_canvas.copy_(canvas)
        self.halt.zero_()
        self.until_filled.fill_(until_filled)
        self.unresolved.copy_(unresolved)
        self.editable.copy_(unresolved)
        self.edited.zero_()
        self.post_steps.zero_()
        if self.z is not None:
            self.z.zero_()
        self.step.zero_()
        self.done.zero_()
        self.block_start.fill_(block_start)
        self.seed.fill_(seed)

    @property
    def positions(self) -> torch.Tensor:
        return self.block_start + self.offsets


def _context(spec: RoundSpec, buf: BlockBuffers, kv, kv_len: int | None) -> AttnContext:
    # kv_len (host int, CPU): read that many arena rows. None (CUDA, every mode): visible lengths
    # come from the device-side positions, so a captured graph serves every block. A round's rows
    # are its block's canvas: one block.
    return AttnContext(buf.positions, spec.block_length, kv, kv_len, one_block=True)


def denoise_round(spec: RoundSpec, buf: BlockBuffers, kv, kv_len: int | None = None) -> Decision:
    """One round, in place on `buf` (kv_len: see `_context`); returns its decision."""
    ctx = _context(spec, buf, kv, kv_len)
    with label("receives", buf.unresolved):
        receives = spec.receives(buf.unresolved) if buf.z is not None else None
    d = decide_block(spec, buf, spec.head_out(buf.canvas, ctx, z=buf.z, receives=receives))
    with label("store_round", buf.canvas, buf.z):
        store_round(buf, d)
    return d


def decide_block(spec: RoundSpec, buf: BlockBuffers, logits: torch.Tensor) -> Decision:
    """`spec.decide` on the active block's logits (or hidden: `RoundSpec.head_out`) and buffers."""
    return spec.decide(
        logits,
        buf.canvas,
        buf.unresolved,
        buf.step,
        buf.seed,
        buf.block_start,
        buf.editable,
        buf.post_steps,
    )


def store_round(buf: BlockBuffers, d: Decision) -> None:
    """Write a round's decision into the buffers and advance the round counter (in place)."""
    if d.z is not None:
        buf.z.copy_(d.z)
    if d.out.edited is not None:  # the same branch every round: static under graph capture
        buf.edited.copy_(d.out.edited)
        buf.post_steps.copy_(d.out.post_steps)
    buf.canvas.copy_(d.out.canvas)
    buf.unresolved.copy_(d.out.unresolved)
    buf.accepted.copy_(d.out.accepted)
    buf.entropy.copy_(d.proposal.entropy)
    buf.done.copy_(d.out.done)
    buf.halt.copy_(d.out.done | (buf.until_filled & ~d.out.unresolved.any()))
    buf.step.add_(1)


def commit_pass(spec: RoundSpec, buf: BlockBuffers, kv, kv_len: int | None = None) -> None:
    """Clean forward of the finished block (h = E[x], no residual): writes its K/V, no logits.
    Runs only with `fold_commits` off; folded, `fold.joint_pass` does this work."""
    spec.model(buf.canvas, _context(spec, buf, kv, kv_len), compute_logits=False)
