"""BlockRequest: one block-style request's end conditions and listeners, and the two steps the
block loop and the structured loop share: `emit` (a block is final) and `launch` (run a block's
chain, clearing the round stream first when the request streams by rounds)."""

from __future__ import annotations

from dataclasses import dataclass

from dlmrt.blocks import Layout, finish
from dlmrt.engine.block.program import BlockProgram
from dlmrt.engine.block.token_feed import TokenFeed
from dlmrt.outputs import EngineResult, ProgressCallback, Recorder, StopCheck


@dataclass(frozen=True, slots=True)
class BlockRequest:
    """What decides when a request ends, and who hears about each finished block."""

    lay: Layout
    stop_ids: set[int]
    max_new_tokens: int
    ignore_eos: bool
    on_progress: ProgressCallback | None
    should_stop: StopCheck | None
    recorder: Recorder | None
    feed: TokenFeed | None = None  # on_tokens: the final tokens as they become final

    @property
    def between_rounds(self) -> StopCheck | None:
        """What the host checks between rounds: the round stream, then `should_stop`."""
        if self.feed is None or not self.feed.streams_rounds:
            return self.should_stop
        return self.feed.between(self.should_stop)


def emit(res: EngineResult, req: BlockRequest, index: int, rounds: int, tokens: list[int]) -> bool:
    """Block `index` is final: append its tokens, apply the stop rule; True if the request ended."""
    res.rounds_per_block.append(rounds)
    res.token_ids += tokens[req.lay.tail :] if index == req.lay.first_block else tokens
    res.token_ids, reason = finish(res.token_ids, req.stop_ids, req.max_new_tokens, req.ignore_eos)
    if req.on_progress is not None:  # first: a block's drafts come before its text
        req.on_progress(index, rounds, list(res.token_ids))
    if req.feed is not None:
        req.feed.offer(res.token_ids)
    if reason is None:
        return False
    res.finish_reason = reason
    return True


def launch(prog: BlockProgram, parts: tuple, req: BlockRequest, index: int, before: list[int]):
    """Run block `index`'s chain; a streamed request first clears the round stream
    (`row_stream.py`) and reads block `index`'s rounds from then on."""
    if req.feed is not None and req.feed.streams_rounds:
        req.feed.start_block(index, before)
    prog.runner.chain(parts, req.between_rounds)
