"""Commit folding (the ORL paper's engine section): a finished block's commit rides in the next block's first round.

Unfolded, block b ends with a commit pass (a clean forward of its final tokens, h = E[x], that writes
its K/V) before block b+1's round 0. Folded, ONE forward over 2B rows [block b | block b+1] at
positions bB .. bB+2B-1 does both: block-causal attention over the arena lets block b's rows see
only the prefix and themselves (exactly the commit), while block b+1's rows also see block b's K/V
written by this same pass in each layer (exactly round 0 after the commit). The residual z (zero in
round 0) enters block b+1's rows only; block b's rows get h = E[x]. Same tokens, one forward less.

Editing rules (`llada_editing`) check a block after its masks are filled: post-fill rounds repeat
until a round edits nothing (or `max_post_steps` is reached). When such a round is itself a clean
forward (`folds_check`), it runs as block b's half of the joint pass too: the round loop of block b
stops once its masks are filled (`BlockBuffers.until_filled`), and the joint pass repeats:

  pass k: block b's half decides with block b's own counters (step, post_steps, editable, seed), so
    its logits and decision equal the k-th unfolded post-fill round (same tokens, same attended K/V:
    the prefix and block b's rows, written from the same canvas). Then
    - no edit: block b is settled, exactly as unfolded; the K/V this pass wrote for block b are those
      of its final tokens, i.e. the unfolded commit, so block b+1's half equals unfolded round 0.
      It stands; the loop ends.
    - an edit: block b's canvas changed after this pass wrote its K/V, so block b+1's half saw stale
      context: it is discarded (block b+1's buffers restored to the block's initial state). If block
      b is not done the next pass is post-fill round k+1; if it is done ("exhausted": the edit came
      in round max_post_steps), the next pass is a pure commit + round 0 (block b's half decides
      nothing), which is the unfolded commit followed by round 0.
  By induction block b runs the unfolded post-fill rounds one for one, ends with the unfolded
  tokens, and block b+1 starts from the unfolded state after its round 0.

A post-fill round is a clean forward only if block b's rows get h = E[x]: a Base model, or an
adapter on "masked" rows (none are left, so m = 0 and h = E[x] + 0) without a post-norm. With an
adapter on "block" rows (z enters every row) or a post-norm (h = s * RMSNorm(E[x]) != E[x]) the check
cannot double as the commit: the post-fill rounds then run unfolded and only the plain commit folds.

Counting: a joint pass is one forward, counted as a denoising forward (its logits feed a rule).
"""

from __future__ import annotations

import torch

from dlmrt.attention import AttnContext
from dlmrt.engine.block.round import BlockBuffers, RoundSpec, decide_block, store_round


def folds_check(spec: RoundSpec) -> bool:
    """Whether an editing rule's post-fill check round can ride in the joint pass (see above)."""
    if not getattr(spec.rule, "edits", False):
        return False
    return not spec.has_residual or spec.model.adapter.filled_block_is_clean


def max_passes(spec: RoundSpec) -> int:
    """Bound on the joint passes of one block pair: post-fill checks + one pure commit."""
    return spec.rule.max_rounds(spec.block_length) + 1


class FoldBuffers:
    """Static device state of the finished block b awaiting its (folded) commit and check."""

    def __init__(self, spec: RoundSpec, device: torch.device) -> None:
        rows = spec.block_length
        self.canvas = torch.zeros(rows, dtype=torch.long, device=device)
        self.unresolved = torch.zeros(rows, dtype=torch.bool, device=device)  # all False (filled)
        self.editable = torch.zeros(rows, dtype=torch.bool, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.post_steps = torch.zeros((), dtype=torch.long, device=device)
        self.done = torch.zeros((), dtype=torch.bool, device=device)  # True: only the commit left
        self.block_start = torch.zeros((), dtype=torch.long, device=device)
        self.offsets = torch.arange(2 * rows, device=device)
        self.redo = torch.zeros((), dtype=torch.bool, device=device)  # last pass discarded b+1
        self.settled = torch.zeros((), dtype=torch.bool, device=device)  # ~redo: loop stop flag
        self.passes = torch.zeros((), dtype=torch.long, device=device)  # joint passes run

    def stash(self, buf: BlockBuffers) -> None:
        """Take over block b's state from the block buffers, before block b+1 loads into them."""
        for name in ("canvas", "unresolved", "editable", "step", "post_steps", "done"):
            getattr(self, name).copy_(getattr(buf, name))
        self.block_start.copy_(buf.block_start)
        self.redo.zero_()
        self.settled.zero_()
        self.passes.zero_()

    @property
    def positions(self) -> torch.Tensor:
        return self.block_start + self.offsets


def joint_pass(
    spec: RoundSpec, fb: FoldBuffers, buf: BlockBuffers, kv, kv_len: int | None = None
) -> None:
    """One forward over [block b | block b+1]: b's commit (and check), b+1's round 0. In place,
    no host sync (graph-capturable). kv_len: CPU arena rows to read, (b + 2) * B; None on CUDA."""
    rows, check = spec.block_length, folds_check(spec)
    ids = torch.cat((fb.canvas, buf.canvas))
    ctx = AttnContext(fb.positions, rows, kv, kv_len)
    receives = spec.receives(buf.unresolved) if buf.z is not None else None
    last = None if check else rows  # a pure commit half needs no logits
    logits = spec.head_out(ids, ctx, z=buf.z, receives=receives, last_logits=last)
    store_round(buf, decide_block(spec, buf, logits[-rows:]))
    if check:
        redo = _check_half(spec, fb, buf.seed, logits[:rows])
        _discard_where(buf, redo)
        fb.redo.copy_(redo)
    fb.settled.copy_(~fb.redo)
    fb.passes.add_(1)


def _check_half(
    spec: RoundSpec, fb: FoldBuffers, seed: torch.Tensor, logits: torch.Tensor
) -> torch.Tensor:
    """Block b's post-fill round on its half of the logits, unless b is done; returns `redo`
    (the round edited a row, so block b+1's half saw stale K/V)."""
    active = ~fb.done
    d = spec.decide(
        logits,
        fb.canvas,
        fb.unresolved,
        fb.step,
        seed,
        fb.block_start,
        fb.editable,
        fb.post_steps,
        with_z=False,
    )
    fb.canvas.copy_(torch.where(active, d.out.canvas, fb.canvas))
    fb.post_steps.copy_(torch.where(active, d.out.post_steps, fb.post_steps))
    fb.step.add_(active.long())
    fb.done.copy_(fb.done | d.out.done)  # when inactive, done is already True
    return (d.out.edited & active).any()


def _discard_where(buf: BlockBuffers, redo: torch.Tensor) -> None:
    """Where `redo`, put block b+1 back to its state before round 0 (branch-free, capturable)."""
    keep = ~redo
    buf.canvas.copy_(torch.where(redo, buf.init_canvas, buf.canvas))
    buf.unresolved.copy_(torch.where(redo, buf.editable, buf.unresolved))  # editable = initial
    if buf.z is not None:
        buf.z.masked_fill_(redo, 0.0)
    buf.step.masked_fill_(redo, 0)
    buf.post_steps.masked_fill_(redo, 0)
    buf.edited.masked_fill_(redo, False)
    buf.accepted.masked_fill_(redo, False)
    buf.entropy.masked_fill_(redo, 0.0)
    buf.done.copy_(buf.done & keep)
    buf.halt.copy_(buf.halt & keep)
