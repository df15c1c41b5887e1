"""RoundTrace: a device-side history of a block's rounds, written inside the round body.

A recorder (the ORL trainer's state capture, the draft stream) needs what every round consumed
and produced. Handing it over from inside the round would need the host between rounds, so the
traced round body writes into these static [cap, B] buffers instead, at the round counter's row
(`index_copy_` with a device index: no host sync, capturable), and the engine turns rows
`[0, rounds)` into `RoundRecord`s after the block, with one device-to-device copy per field.
The same body runs in all three modes, so eager, round_graph and block_graph record the same
rounds; a traced request runs unfolded (the trainer replays the unfolded schedule; the tokens are
the same as folded: `fold.py`).
"""

from __future__ import annotations

import torch

from dlmrt.engine.block.round import BlockBuffers, Decision, RoundSpec, denoise_round
from dlmrt.outputs import RoundRecord


class RoundTrace:
    """Per-round rows of one block: what the round saw (canvas, unresolved, z) and decided."""

    def __init__(self, spec: RoundSpec, cap: int, device: torch.device) -> None:
        rows = spec.block_length
        self.cap = cap

        def new(dtype: torch.dtype, *tail: int) -> torch.Tensor:
            return torch.zeros(cap, rows, *tail, dtype=dtype, device=device)

        self.canvas, self.unresolved = new(torch.long), new(torch.bool)
        self.z = None
        if spec.has_residual:
            model = spec.model
            self.z = new(model.embed_table.dtype, model.cfg.hidden_size)
        self.entropy, self.accepted, self.edited = (
            new(torch.float32),
            new(torch.bool),
            new(torch.bool),
        )
        self.proposal, self.confidence = new(torch.long), new(torch.float32)
        self.canvas_after = new(torch.long)

    def _before(self, buf: BlockBuffers) -> None:
        # this round's row; clamped because the graph warm-up runs the body past the cap (its
        # writes are scratch: every row a block reports is rewritten by that block's rounds)
        at = buf.step.clamp(max=self.cap - 1).view(1)
        self.canvas.index_copy_(0, at, buf.canvas.unsqueeze(0))
        self.unresolved.index_copy_(0, at, buf.unresolved.unsqueeze(0))
        if self.z is not None:
            self.z.index_copy_(0, at, buf.z.unsqueeze(0))

    def _after(self, buf: BlockBuffers, d: Decision) -> None:
        at = (buf.step - 1).clamp(max=self.cap - 1).view(1)  # the round counter has advanced
        for dest, src in (
            (self.entropy, buf.entropy),
            (self.accepted, buf.accepted),
            (self.edited, buf.edited),
            (self.proposal, d.proposal.tokens),
            (self.confidence, d.proposal.confidence),
            (self.canvas_after, buf.canvas),
        ):
            dest.index_copy_(0, at, src.unsqueeze(0).to(dest.dtype))

    def round(self, spec: RoundSpec, buf: BlockBuffers, kv, kv_len: int | None) -> Decision:
        """`denoise_round`, its inputs and outputs written at the round counter's row."""
        self._before(buf)
        d = denoise_round(spec, buf, kv, kv_len)
        self._after(buf, d)
        return d

    def records(self, block_index: int, rounds: int) -> list[RoundRecord]:
        """The block's first `rounds` rows as records (copies: the trace is reused next block)."""
        z = None if self.z is None else self.z[:rounds].clone()
        fields = (
            self.canvas,
            self.unresolved,
            self.entropy,
            self.accepted,
            self.edited,
            self.proposal,
            self.confidence,
            self.canvas_after,
        )
        canvas, unresolved, entropy, accepted, edited, proposal, confidence, after = (
            f[:rounds].clone() for f in fields
        )
        return [
            RoundRecord(
                block_index,
                r,
                canvas[r],
                unresolved[r],
                None if z is None else z[r],
                entropy[r],
                accepted[r],
                edited[r],
                proposal[r],
                confidence[r],
                after[r],
            )
            for r in range(rounds)
        ]
