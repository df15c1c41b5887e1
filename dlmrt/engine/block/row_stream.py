"""RowStream: each round's rows of the block, from inside the block graph to the host while it runs.

In block_graph a block's rounds are one graph launch; the host reads the block once, after it. To
stream text every round (issue 54), the round body ends with a publish: the block's rows (a token
once resolved, -1 while masked) go into slot `round % slots` of a ring in pinned, mapped host
memory, tagged with the round number (the block's `step`, >= 1 after any round):

    slot = [round | block_start | row 0 .. row B-1]   int64

CUDA: one small kernel (`csrc/row_publish.cu`) stores into the ring through its device mapping, so
the graph has no copy node and no host sync; the round number is zeroed first and written last,
each after a system-wide fence. CPU: the same slot written by torch ops (its twin).

The host reads slots in round order (`poll`), a seqlock per slot: the round number, then the rows,
then the round number again; equal means the slot was whole. A reader that falls `slots` rounds
behind finds later rounds in its slots: it skips to the oldest one still there and counts the
rounds it missed (`overruns`); the writer never waits for it. The final rows do not depend on
which rounds were read (resolved rows never change for a rule that does not edit), so skipping
loses nothing but intermediate updates.

The ring is cleared before each block's launch, when the device is idle and after any capture of
the block's graphs (`Runner.prepare`): a capture's warm-up runs the round body once, and what it
published must not be read as the block's round 1.
"""

from __future__ import annotations

import ctypes

import torch

from dlmrt.engine.block.round import BlockBuffers

SLOTS = 64  # rounds the host may fall behind before it skips (counted in `overruns`)


def _device_pointer(host: torch.Tensor) -> int:
    """The device's address of a pinned tensor (with unified addressing: its own address)."""
    from cuda.bindings import runtime as cudart

    err, ptr = cudart.cudaHostGetDevicePointer(host.data_ptr(), 0)
    return int(ptr) if int(getattr(err, "value", err)) == 0 else host.data_ptr()


class RowStream:
    def __init__(self, rows: int, device: torch.device, slots: int | None = None) -> None:
        self.rows, self.slots, self.cuda = rows, slots or SLOTS, device.type == "cuda"
        self.ring = torch.zeros(self.slots, rows + 2, dtype=torch.long, pin_memory=self.cuda)
        self._host = self.ring.numpy()
        self._ptr = _device_pointer(self.ring) if self.cuda else 0
        self._next = 1  # the round the reader expects next
        self.overruns = 0  # rounds skipped because the reader fell `slots` behind

    def publish(self, buf: BlockBuffers) -> None:
        """Device side, capturable: the block's rows after this round into the round's slot."""
        if self.cuda:
            from dlmrt.engine.graph import nvrtc

            fn, _ = nvrtc.function("row_publish.cu", "dlmrt_row_publish")
            args = (
                (
                    buf.canvas.data_ptr(),
                    buf.unresolved.data_ptr(),
                    buf.step.data_ptr(),
                    buf.block_start.data_ptr(),
                    self._ptr,
                    self.rows,
                    self.slots,
                ),
                (ctypes.c_void_p,) * 5 + (ctypes.c_int, ctypes.c_int),
            )
            nvrtc.launch(fn, 128, args)
            return
        self.ring.index_copy_(0, (buf.step % self.slots).view(1), slot_of(buf).view(1, -1))

    def clear(self) -> None:
        """Host side: forget every slot; the next round read is 1. Waits for the stream first
        (idle between blocks: a few µs), so no publish (a warm-up's) lands after the clear."""
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        self._host[:, 0] = 0
        self._next = 1

    def poll(self) -> tuple[int, list[int]] | None:
        """(block_start, rows) of the newest whole round published since the last poll, or None."""
        latest, ring = None, self._host
        while True:
            slot = ring[self._next % self.slots]
            head = int(slot[0])
            if head == self._next:
                payload = slot[1:].tolist()
                if int(slot[0]) == head:  # not rewritten while it was copied
                    latest = (payload[0], payload[1:])
                    self._next += 1
                    continue
                head = int(slot[0])
            if head <= self._next:  # not yet written (0: being written, or cleared)
                return latest
            # lapped: the oldest round the ring still holds is newest - slots + 1
            newest = int(ring[:, 0].max())
            skip_to = max(newest - self.slots + 1, self._next + 1)
            self.overruns += skip_to - self._next
            self._next = skip_to


def slot_of(buf: BlockBuffers) -> torch.Tensor:
    """The torch twin of a slot: [round, block_start, token or -1 per row] (int64)."""
    rows = torch.where(buf.unresolved, -1, buf.canvas)
    return torch.cat([buf.step.view(1), buf.block_start.view(1), rows])
