"""TokenFeed: a request's final tokens, handed to `on_tokens` as soon as they are final.

`on_tokens(tokens)` receives the request's output so far (cut at a stop id or max_new_tokens as
the output is) every time it grows: from the round stream (`row_stream.py`) while a block is
being denoised, and at each finished block. A block's rows are final once resolved for every rule
that does not edit (an editing rule's block is final only when the block is: it is not streamed
by rounds). The feed passes on the block's resolved rows from its first generated row up to the
first masked one, after the blocks before it; since those rows never change and `finish` cuts a
prefix of a list at a prefix of where it cuts the list, every call extends the previous one and
the last one equals the output: nothing streamed is ever retracted.

When the host sees the rows: between rounds in eager and round_graph (the host loop syncs every
round anyway), and in block_graph while it waits for the block's read-back (`BlockIO.read`
polls the ring instead of blocking in a stream sync). A ring with drafts also hands every round
it read to `on_view` (`RoundView`: what `dlmrt/drafts.py` turns into a `Draft`).
"""

from __future__ import annotations

from collections.abc import Callable

from dlmrt.blocks import Layout, finish
from dlmrt.engine.block import stream_lag
from dlmrt.engine.block.row_stream import RowStream, Slot
from dlmrt.outputs import RoundView, RoundViewCallback, StopCheck, TokensCallback


class TokenFeed:
    def __init__(
        self,
        on_tokens: TokensCallback | None,
        lay: Layout,
        stop_ids: set[int],
        max_new_tokens: int,
        ignore_eos: bool,
        rows: RowStream | None,
        final_rows: bool = True,
        on_view: RoundViewCallback | None = None,
    ) -> None:
        """rows: the program's round stream (None: the feed hears only finished blocks).
        final_rows: the rule's resolved rows are final (False for a rule that edits: its tokens
        go over per block). on_view: every round read, when the ring carries drafts."""
        self._on_tokens, self._lay, self._rows = on_tokens, lay, rows
        self._final_rows, self._on_view = final_rows, on_view
        self._cut = (stop_ids, max_new_tokens, ignore_eos)
        self._sent = 0  # tokens handed over so far
        self._block: tuple[int, list[int]] | None = None  # (block start, output before it)
        self._end = 0  # the block's final prefix (rows) as of the last slot read
        self._held: BaseException | None = None  # a listener's error from a poll, raised later

    @property
    def streams_rounds(self) -> bool:
        return self._rows is not None

    def offer(self, tokens: list[int]) -> int | None:
        """The output so far (already cut): handed over if it grew. Returns the host clock
        (`stream_lag.clock`) just before `on_tokens` was called, or None if it was not."""
        if len(tokens) > self._sent and self._on_tokens is not None:
            self._sent = len(tokens)
            now = stream_lag.clock()
            self._on_tokens(list(tokens))
            return now
        return None

    def start_block(self, index: int, before: list[int]) -> None:
        """Block `index` is about to launch after the output `before`: clear the ring (no
        publish in flight: `row_stream.py`) and read its rounds from now on."""
        if self._rows is None:
            return
        self._rows.clear()
        start = index * self._lay.block_length
        self._block, self._end = (start, list(before)), self._first_row(start)

    def poll(self) -> None:
        """Read the ring; hand over the block's newly final rows, if any. A listener's error is
        held, and nothing more is handed over in this block, until `end_block` or the
        between-rounds check raises it: after the block's read-back (where `on_progress` may
        raise too), or after the caller's `should_stop` has been called (a collective under
        tensor parallelism: every rank still calls it once per round)."""
        if self._rows is None or self._block is None or self._held is not None:
            return
        try:
            self._poll(*self._block)
        except Exception as e:
            self._held = e

    def _raise_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._block = None
            raise held

    def _poll(self, start: int, before: list[int]) -> None:
        slots = [s for s in self._rows.poll() if s.block_start == start]
        bad = next((i for i, s in enumerate(slots) if s.nonfinite), None)
        if bad is not None:  # nothing from this round on: the engine raises after the block
            slots, self._block = slots[:bad], None
        if self._on_view is not None:
            for s in slots:
                self._on_view(self._view(s))
        if slots and self._final_rows:
            recorder = stream_lag.RECORDER  # measurement only: no scan of the slots without it
            grew = self._oldest_growth(start, slots) if recorder is not None else None
            handed = self.show(start, before, slots[-1].rows)
            if handed is not None and grew is not None:
                recorder.record(grew.published_ns, handed)

    def _oldest_growth(self, start: int, slots: list[Slot]) -> Slot | None:
        """The first of `slots` whose final prefix is longer than the last slot read before it
        (its rows waited longest: `stream_lag.py`)."""
        oldest, first = None, self._first_row(start)
        for s in slots:
            end = _final_end(s.rows, first)
            if end > self._end:
                oldest, self._end = oldest or s, end
        return oldest

    def _view(self, s: Slot) -> RoundView:
        first = self._first_row(s.block_start)
        index = s.block_start // self._lay.block_length
        return RoundView(index, s.round, first, s.shown, s.states, s.confidence)

    def _first_row(self, start: int) -> int:
        """The block's first generated row (the first block holds the prompt's tail)."""
        return self._lay.tail if start == self._lay.first_block * self._lay.block_length else 0

    def show(self, start: int, before: list[int], rows: list[int]) -> int | None:
        """The block starting at row `start`, after the output `before`: its rows (a token once
        final, -1 before that); hands over the final ones up to the first that is not (returns
        `offer`'s hand-over time, None if nothing new was)."""
        first = self._first_row(start)
        tokens, _ = finish(before + rows[first : _final_end(rows, first)], *self._cut)
        return self.offer(tokens)

    def end_block(self) -> None:
        """The block was read back: a last poll (its final rounds), then no more ring reads; a
        listener's error held during the block is raised now."""
        self.poll()
        self._raise_held()
        self._block = None

    def between(self, should_stop: StopCheck | None) -> Callable[[], bool]:
        """The host loops' between-rounds check: poll the ring, then the caller's `should_stop`
        (called exactly as before: under tensor parallelism it is a collective)."""

        def check() -> bool:
            self.poll()
            stop = should_stop is not None and bool(should_stop())
            self._raise_held()
            return stop

        return check


def _final_end(rows: list[int], first: int) -> int:
    """The end of the run of final rows (>= 0) from row `first`."""
    end = first
    while end < len(rows) and rows[end] >= 0:
        end += 1
    return end
