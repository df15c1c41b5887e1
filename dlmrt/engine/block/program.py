"""BlockProgram: the block style's work for one request shape, as loops and passes for a runner.

    rounds   Loop  denoise_round until the block halts (done, or filled when its check is folded)
    fold     Loop  joint passes [block b | block b+1] until one is not discarded (`fold.py`)
    commit   Pass  the clean forward of a finished block (`fold_commits` off)
    start    Pass  load a block's buffers from its one staged copy (`block_io.py`); `start_after`
                   stashes block b-1 for its folded commit first
    report   Pass  pack what the host reads after the round loop into one row (one read-back)

A streamed program also ends every round body (and the joint pass, the next block's round 0) with
a publish into the round stream `rows_out` (`row_stream.py`), which the host reads while the block
runs: `stream="rows"` the block's rows (rules that do not edit: their resolved rows are final),
`stream="drafts"` the rows and each round's draft fields (any rule; such requests run unfolded).

over one set of static buffers (`BlockBuffers`, `FoldBuffers`) and the engine's arena. One program
per (block length, rule, temperature, traced): the graphs bake them in. A traced program's round
body also writes the round into a `RoundTrace` (`trace.py`), in any mode. `kv_len` is the CPU's host-side
bound on the arena rows to read, set by the engine per block; it is None on CUDA, where every
mode derives the visible rows on the device (one captured graph serves every block).
"""

from __future__ import annotations

import torch

from dlmrt.config import EAGER
from dlmrt.engine.block.block_io import BlockIO
from dlmrt.engine.block.fold import FoldBuffers, joint_pass, max_passes
from dlmrt.engine.block.round import BlockBuffers, RoundSpec, commit_pass, denoise_round
from dlmrt.engine.block.row_stream import RowStream
from dlmrt.engine.block.trace import RoundTrace
from dlmrt.engine.graph.loop import Loop, Pass, Runner
from dlmrt.engine.kv_cache import KVCache


class BlockProgram:
    def __init__(
        self,
        spec: RoundSpec,
        kv: KVCache,
        runner: Runner,
        device: torch.device,
        traced: bool = False,
        stream: str | None = None,
    ) -> None:
        """traced: every round is also written into `self.trace` (read it after the block).
        stream: None, "rows" or "drafts": what every round publishes to `rows_out` (above)."""
        self.spec, self.kv, self.runner = spec, kv, runner
        self.kv_len: int | None = None
        self.buf, self.fold_buf = BlockBuffers(spec, device), FoldBuffers(spec, device)
        buf, fb = self.buf, self.fold_buf
        rows, max_rounds = spec.block_length, spec.rule.max_rounds(spec.block_length)
        self.trace = RoundTrace(spec, max_rounds, device) if traced else None
        trace = self.trace
        if stream not in (None, "rows", "drafts"):
            raise ValueError(f"stream: expected None, 'rows' or 'drafts', got {stream!r}")
        graphs = runner.name != EAGER  # publish from the captured graphs only (`row_stream.py`)
        rows_out = (
            None if stream is None else RowStream(rows, device, stream == "drafts", None, graphs)
        )
        self.rows_out = rows_out

        def round_body() -> None:
            if trace is not None:
                d = trace.round(spec, buf, kv, self.kv_len)
            else:
                d = denoise_round(spec, buf, kv, self.kv_len)
            if rows_out is not None:
                rows_out.publish(buf, d)

        def fold_body() -> None:
            joint_pass(spec, fb, buf, kv, self.kv_len)
            if rows_out is not None and not rows_out.drafts:  # block b+1's round 0
                rows_out.publish(buf)

        self.rounds = Loop(
            "rounds",
            round_body,
            buf.halt,
            buf.step,
            max_rounds,
            (buf,),
        )
        self.fold = Loop(
            "fold",
            fold_body,
            fb.settled,
            fb.passes,
            max_passes(spec),
            (buf, fb),
        )
        self.commit = Pass("commit", lambda: commit_pass(spec, buf, kv, self.kv_len), (buf,))
        self.io = io = BlockIO(buf, fb, device)
        self.start = Pass("start", io.start, (buf,))
        self.start_after = Pass("start_after", io.start_after, (buf, fb))
        self.report = Pass("report", io.pack, ())
