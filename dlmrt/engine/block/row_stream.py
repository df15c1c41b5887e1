"""RowStream: each round's rows of the block, from inside the block graph to the host while it runs.

In block_graph a block's rounds are one graph launch; the host reads the block once, after it. To
stream every round (issue 54), the round body ends with a publish: an int64 row built by torch ops
on the device goes into slot `round % slots` of a ring in pinned, mapped host memory, tagged with
the round number (the block's `step`, >= 1 after any round):

    rows only     [round | block_start | bad | row (B)]
    with drafts   [round | block_start | bad | row (B) | shown (B) | state (B) | confidence bits (B)]

and one more column the publish kernel writes itself: the device's clock at the publish (ns,
`%globaltimer`; 0 on the CPU), which `stream_lag.py` compares with the host's receipt.

bad = 1 when the round's statistics are NaN / inf (`engine/nonfinite.py`: the host then takes
nothing more from the block, which the engine reports as an error after it); a row = its token
once resolved, -1 while masked; the draft fields are what `dlmrt/drafts.py`
shows per row: the token shown (the proposal while masked), its state (0 final, 1 accepted or
edited this round, 2 masked) and the proposal's probability (float32 bits; final rows 1.0).

CUDA: one small kernel (`csrc/slot_publish.cu`) copies the row into the ring through its device
mapping, so the graph has no copy node and no host sync; the slot's round number is zeroed first
and written last, each after a system-wide fence. CPU: the same slot written by torch ops (the
kernel's twin); the row is built by the same torch code on both.

The host reads slots in round order (`poll`), a seqlock per slot: the round number, then the
payload, then the round number again; equal means the slot was whole. A reader that falls `slots`
rounds behind finds later rounds in its slots: it skips to the oldest one still there and counts
the rounds it missed (`overruns`); the writer never waits for it. The final rows do not depend on
which rounds were read (resolved rows never change for a rule that does not edit), so skipping
loses intermediate updates only (and, with drafts, the drafts of the skipped rounds).

The ring is cleared before each block's launch, when no publish is in flight (the previous
block's read-back waited for its rounds; after a cancelled block `BlockIO.stage` waits for the
stream before the next launch), so the clear needs no sync of its own. In the graph modes the
publish is part of the captured graphs only: a capture's warm-up runs the bodies for real (out of
order in round_graph, before the block's buffers are loaded), and what a warm-up published could
be read as the block's round 1; so outside a capture a graph mode's publish does nothing.

The host reads slots with plain loads in order: the seqlock relies on x86's load ordering (an
aarch64 host would need an acquire load between the round number and the payload).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch

from dlmrt.engine import nonfinite
from dlmrt.engine.block.round import BlockBuffers, Decision

SLOTS = 64  # rounds the host may fall behind before it skips (counted in `overruns`)
FINAL, ACCEPTED, MASKED = 0, 1, 2  # a row's state in a draft slot


class Slot(NamedTuple):
    """One round as the host read it. `shown`, `states`, `confidence`: None without drafts."""

    round: int
    block_start: int
    nonfinite: bool  # the round's logits had NaN / inf: its rows are not to be shown
    rows: list[int]  # a token once resolved, -1 while masked
    shown: list[int] | None
    states: list[int] | None
    confidence: list[float] | None
    published_ns: int  # the device's clock at the publish (0: none, the CPU)


def device_pointer(host: torch.Tensor) -> int:
    """The device's address of a pinned tensor (with unified addressing: its own address)."""
    from cuda.bindings import runtime as cudart

    err, ptr = cudart.cudaHostGetDevicePointer(host.data_ptr(), 0)
    return int(ptr) if int(getattr(err, "value", err)) == 0 else host.data_ptr()


def payload(buf: BlockBuffers, d: Decision | None = None) -> torch.Tensor:
    """Device side, capturable: the round's row (see above); with `d`, the draft fields too."""
    rows = torch.where(buf.unresolved, -1, buf.canvas)
    bad = nonfinite.flag(buf.entropy).view(1)
    head = [buf.step.view(1), buf.block_start.view(1), bad, rows]
    if d is None:
        return torch.cat(head)
    moved = buf.accepted | buf.edited  # accepted or rewritten this round
    states = torch.where(moved, ACCEPTED, torch.where(buf.unresolved, MASKED, FINAL))
    shown = torch.where(buf.unresolved & ~moved, d.proposal.tokens, buf.canvas)
    conf = torch.where(states == FINAL, 1.0, d.proposal.confidence.float())
    bits = conf.view(torch.int32).long()
    return torch.cat([*head, shown, states, bits])


class RowStream:
    def __init__(
        self,
        rows: int,
        device: torch.device,
        drafts: bool = False,
        slots: int | None = None,
        graphs: bool = False,
    ) -> None:
        """graphs: the program runs as CUDA graphs (publish only while being captured)."""
        self.rows, self.drafts, self.slots = rows, drafts, slots or SLOTS
        self.graphs = graphs
        self.cuda = device.type == "cuda"
        self.width = 3 + rows * (4 if drafts else 1)
        # the payload's columns, then the publish's device clock
        self.ring = torch.zeros(self.slots, self.width + 1, dtype=torch.long, pin_memory=self.cuda)
        self._host = self.ring.numpy()
        self._ptr = device_pointer(self.ring) if self.cuda else 0
        self._next = 1  # the round the reader expects next
        self.overruns = 0  # rounds skipped because the reader fell `slots` behind

    def publish(self, buf: BlockBuffers, d: Decision | None = None) -> None:
        """Device side, capturable: this round's row (with drafts: needs the round's `d`)."""
        if self.graphs and not torch.cuda.is_current_stream_capturing():
            return  # a warm-up run: its rows are not the block's (see above)
        row = payload(buf, d if self.drafts else None)
        if not self.cuda:
            row = torch.cat([row, row.new_zeros(1)])  # no device clock on the CPU
            self.ring.index_copy_(0, (buf.step % self.slots).view(1), row.view(1, -1))
            return
        from dlmrt.engine.graph import nvrtc

        fn, _ = nvrtc.function("slot_publish.cu", "dlmrt_slot_publish")
        values = (row.data_ptr(), self._ptr, self.width, self.slots)
        types = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
        nvrtc.launch(fn, 128, (values, types))

    def clear(self) -> None:
        """Host side, with no publish in flight (see above): forget every slot; the next round
        read is 1."""
        self._host[:, 0] = 0
        self._next = 1

    def poll(self) -> list[Slot]:
        """The whole rounds published since the last poll, oldest first (none: [])."""
        out, ring = [], self._host
        while True:
            slot = ring[self._next % self.slots]
            head = int(slot[0])
            if head == self._next:
                values = slot.copy()
                if int(slot[0]) == head:  # not rewritten while it was copied
                    out.append(self._slot(values))
                    self._next += 1
                    continue
                head = int(slot[0])
            if head <= self._next:  # not yet written (0: being written, or cleared)
                return out
            # lapped: the oldest round the ring still holds is newest - slots + 1
            newest = int(ring[:, 0].max())
            skip_to = max(newest - self.slots + 1, self._next + 1)
            self.overruns += skip_to - self._next
            self._next = skip_to

    def _slot(self, values: np.ndarray) -> Slot:
        b, head = self.rows, (int(values[0]), int(values[1]), bool(values[2]))
        rows, stamp = values[3 : 3 + b].tolist(), int(values[self.width])
        if not self.drafts:
            return Slot(*head, rows, None, None, None, stamp)
        shown, states = values[3 + b : 3 + 2 * b].tolist(), values[3 + 2 * b : 3 + 3 * b].tolist()
        conf = values[3 + 3 * b : self.width].astype(np.uint32).view(np.float32).tolist()
        return Slot(*head, rows, shown, states, conf, stamp)
