"""BlockIO: a block's host <-> device traffic, one copy in and one read-back out (issue 23).

Starting a block used to be ~25 small launches (the canvas and mask built on the device, each
static buffer copied or zeroed one by one) and reading it back four syncs (halt, step, done, the
canvas). Now the host writes the block's inputs into one pinned row,

    inputs = [canvas (B) | unresolved (B) | block_start, seed, until_filled]   int64

copied with ONE async copy (`copy_in`) into a device row; the `start` pass loads every buffer
from it, after stashing block b-1 for its folded commit when there is one. After the round loop
the `report` pass packs what the host needs,

    report = [canvas (B) | step, halt, done, nonfinite]   int64

and ONE copy (`copy_out`) + sync brings it back (a folded check's result likewise: `fold_out`). The
copies are passes like the others (pinned rows: capturable), so in block_graph a block's copy in,
start, folded commit, rounds, report and copy out are one graph launch (`BlockGraphRunner.chain`).
Before the host rewrites the pinned input row it waits for the stream when a block was launched and
never read back (a request cancelled between the two): the copy in may still be reading the row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from dlmrt.engine import nonfinite
from dlmrt.engine.block.fold import FoldBuffers
from dlmrt.engine.block.round import BlockBuffers
from dlmrt.engine.graph.loop import Pass

POLL_S = 1e-4  # the host's poll interval while a block runs (a round takes milliseconds)


class Report(NamedTuple):
    canvas: list[int]
    step: int
    halt: bool
    done: bool
    nonfinite: bool  # the last round's logits had NaN / inf (`engine/nonfinite.py`)


class FoldReport(NamedTuple):
    """Block b-1 after the joint passes that carried its folded check."""

    canvas: list[int]
    step: int
    passes: int
    redo: bool


def _staging(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A device row of n int64 and its host twin (pinned on CUDA: the copies are async)."""
    host = torch.zeros(n, dtype=torch.long)
    return torch.zeros(n, dtype=torch.long, device=device), (
        host.pin_memory() if device.type == "cuda" else host
    )


def _pack(row: torch.Tensor, canvas: torch.Tensor, scalars: tuple[torch.Tensor, ...]) -> None:
    """Device side (capturable): row = [canvas | scalars] (int64)."""
    b = canvas.numel()
    row[:b].copy_(canvas)
    row[b:].copy_(torch.stack(scalars))


class BlockIO:
    def __init__(self, buf: BlockBuffers, fb: FoldBuffers, device: torch.device) -> None:
        self.buf, self.fb, self.rows = buf, fb, buf.canvas.numel()
        self.cuda = device.type == "cuda"
        self.inputs, self.host_in = _staging(2 * self.rows + 3, device)
        self.report, self.host_out = _staging(self.rows + 4, device)
        self.in_flight = False  # a block was launched and not read back yet
        self.copy_in = Pass("copy_in", self._copy_in, ())
        self.copy_out = Pass("copy_out", self._copy_out, ())
        # a folded check's result (block b-1 after the joint passes): one row, one copy
        self.fold_report, self.host_fold = _staging(self.rows + 3, device)
        self.fold_out = Pass("fold_out", self._fold_out, ())

    def stage(
        self, tail: list[int], mask_id: int, block_start: int, seed: int, until_filled: bool
    ) -> None:
        """Host side of a block's start: canvas = the prompt `tail` then masks (the tail rows
        resolved), in the pinned row; the `copy_in` pass moves it, the `start` pass loads it."""
        if self.in_flight and self.cuda:
            torch.cuda.current_stream().synchronize()  # the last copy in has read the row
        self.in_flight = True
        b, n, host = self.rows, len(tail), self.host_in.numpy()
        host[:n] = tail
        host[n:b] = mask_id
        host[b : b + n] = 0
        host[b + n : 2 * b] = 1
        host[2 * b :] = (block_start, seed, int(until_filled))

    def _copy_in(self) -> None:
        self.inputs.copy_(self.host_in, non_blocking=self.cuda)

    def start(self) -> None:
        """Device side (capturable): every block buffer from `inputs`; z, counters and flags zeroed."""
        b, buf, x = self.rows, self.buf, self.inputs
        canvas, unresolved = x[:b], x[b : 2 * b].bool()
        buf.canvas.copy_(canvas)
        buf.init_canvas.copy_(canvas)
        buf.unresolved.copy_(unresolved)
        buf.editable.copy_(unresolved)
        buf.block_start.copy_(x[2 * b])
        buf.seed.copy_(x[2 * b + 1])
        buf.until_filled.copy_(x[2 * b + 2].bool())
        for t in (buf.halt, buf.edited, buf.post_steps, buf.step, buf.done):
            t.zero_()
        if buf.z is not None:
            buf.z.zero_()

    def start_after(self) -> None:
        """`start` after stashing block b-1 (awaiting its folded commit) into the fold buffers."""
        self.fb.stash(self.buf)
        self.start()

    def pack(self) -> None:
        """Device side (capturable): what the host reads after the round loop, in one row."""
        buf = self.buf
        bad = nonfinite.flag(buf.entropy)
        _pack(self.report, buf.canvas, (buf.step, buf.halt.long(), buf.done.long(), bad))

    def _copy_out(self) -> None:
        self.host_out.copy_(self.report, non_blocking=self.cuda)

    def _fold_out(self) -> None:
        """Device side (capturable): block b-1's canvas, rounds, joint passes and redo flag, packed
        and copied to the pinned host row."""
        fb = self.fb
        _pack(self.fold_report, fb.canvas, (fb.step, fb.passes, fb.redo.long()))
        self.host_fold.copy_(self.fold_report, non_blocking=self.cuda)

    def _values(
        self, host: torch.Tensor, poll: Callable[[], None] | None = None
    ) -> tuple[list[int], list[int]]:
        """(canvas, scalars) of a pinned row, once the copies into it are done (one sync).
        `poll`: called every ~0.1 ms while the stream still runs (the round stream's reader)."""
        if self.cuda:
            stream = torch.cuda.current_stream()
            while poll is not None and not stream.query():
                poll()
                time.sleep(POLL_S)
            stream.synchronize()
        values = host.tolist()
        return values[: self.rows], values[self.rows :]

    def read_fold(self) -> FoldReport:
        """The one read-back of a folded check (after the `fold_out` pass ran)."""
        canvas, (step, passes, redo) = self._values(self.host_fold)
        return FoldReport(canvas, step, passes, bool(redo))

    def read(self, poll: Callable[[], None] | None = None) -> Report:
        """The one read-back of a block (after the `report` and `copy_out` passes ran); `poll`
        runs while the block does (`_values`)."""
        canvas, (step, halt, done, bad) = self._values(self.host_out, poll)
        self.in_flight = False
        return Report(canvas, step, bool(halt), bool(done), bool(bad))
