"""BlockProgram: the block style's work for one request shape, as loops and passes for a runner.

    rounds   Loop  denoise_round until the block halts (done, or filled when its check is folded)
    fold     Loop  joint passes [block b | block b+1] until one is not discarded (`fold.py`)
    commit   Pass  the clean forward of a finished block (`fold_commits` off)

over one set of static buffers (`BlockBuffers`, `FoldBuffers`) and the engine's arena. One program
per (block length, rule, temperature): the graphs bake them in. `kv_len` is the CPU's host-side
bound on the arena rows to read, set by the engine per block; it is None on CUDA, where every
mode derives the visible rows on the device (one captured graph serves every block).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlmrt.engine.block.fold import FoldBuffers, joint_pass, max_passes
from dlmrt.engine.block.round import BlockBuffers, RoundSpec, commit_pass, denoise_round
from dlmrt.engine.graph.loop import EagerRunner, Loop, Pass, Runner
from dlmrt.engine.kv_cache import KVCache
from dlmrt.outputs import Recorder, RoundRecord


class BlockProgram:
    def __init__(
        self,
        spec: RoundSpec,
        kv: KVCache,
        runner: Runner,
        device: torch.device,
        recorder: Recorder | None = None,
    ) -> None:
        """recorder: gets every round's `RoundRecord` (the trainer); needs an `EagerRunner`."""
        if recorder is not None and not isinstance(runner, EagerRunner):
            raise ValueError("a round hook needs the host between rounds: use an EagerRunner")
        self.spec, self.kv, self.runner = spec, kv, runner
        self.kv_len: int | None = None
        self.buf, self.fold_buf = BlockBuffers(spec, device), FoldBuffers(spec, device)
        buf, fb = self.buf, self.fold_buf
        max_rounds = spec.rule.max_rounds(spec.block_length)
        self.rounds = Loop(
            "rounds",
            self._recorded(recorder)
            if recorder
            else lambda: denoise_round(spec, buf, kv, self.kv_len),
            buf.halt,
            buf.step,
            max_rounds,
            (buf,),
        )
        self.fold = Loop(
            "fold",
            lambda: joint_pass(spec, fb, buf, kv, self.kv_len),
            fb.settled,
            fb.passes,
            max_passes(spec),
            (buf, fb),
        )
        self.commit = Pass("commit", lambda: commit_pass(spec, buf, kv, self.kv_len), (buf,))

    def _recorded(self, recorder: Recorder) -> Callable[[], None]:
        """A round body that hands `recorder` what the round consumed and produced."""
        spec, buf = self.spec, self.buf

        def body() -> None:
            index, r = int(buf.block_start) // spec.block_length, int(buf.step)
            z = None if buf.z is None else buf.z.clone()
            canvas, unresolved = buf.canvas.clone(), buf.unresolved.clone()
            denoise_round(spec, buf, self.kv, self.kv_len)
            after = buf.entropy.clone(), buf.accepted.clone(), buf.edited.clone()
            recorder(RoundRecord(index, r, canvas, unresolved, z, *after))

        return body
