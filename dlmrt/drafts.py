"""Drafts: what a block (or a canvas) looks like after each denoising round.

A `Draft` is one round of one block, built from the engine's round history (`RoundRecord`, block
style; `CanvasStepRecord`, encoder-decoder style) by a `DraftBuilder`. Per generated row it says what the
row shows and in which state it is:

    F  final     resolved before this round (block style); a canvas's rows in its last draft
    A  accepted  accepted (or, editing rules, rewritten) this round; encoder-decoder style: sample kept
    M  masked    still undecided: the row shows the round's provisional proposal (its argmax, or
                 its sample when temperature > 0) with that proposal's probability

The last draft of each block is marked `final` and shows the block's output exactly (cut at a stop
id or at max_new_tokens, as the output is), so `prefix + tokens` of a request's last draft equals
its `token_ids`. Block style: the rounds arrive live from the round stream (`view`; block_graph:
a ring in pinned host memory the round body writes, `engine/block/row_stream.py`), each draft one
round late (a round is emitted when the next arrives, the last one at its block's end, as final).
With a recorder, and for DiffusionGemma's canvases, they are built from the records, a block at a
time, after it (`docs/drafts.md`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlmrt.outputs import CanvasStepRecord, ProgressCallback, RoundRecord, RoundView

FINAL, ACCEPTED, MASKED = "F", "A", "M"


@dataclass(frozen=True, slots=True)
class Draft:
    """One round of one block. `tokens`, `states` and `confidence` cover its generated rows."""

    block: int  # generated block (or canvas) number, from 0
    round: int  # rounds run in this block so far (from 1)
    prefix: tuple[int, ...]  # the output of the blocks before this one
    tokens: tuple[int, ...]  # per row: its token (F, A) or the provisional proposal (M)
    states: str  # per row: F, A or M
    confidence: tuple[float, ...]  # per row: the round's probability of the token shown (F: 1)
    final: bool = False  # the block's last draft: `tokens` is the block's output

    @property
    def ids(self) -> list[int]:
        """The request's tokens as of this draft: the finished blocks, then this block's rows."""
        return [*self.prefix, *self.tokens]

    @property
    def accepted_rows(self) -> list[int]:
        """Rows of this block that are decided (F or A)."""
        return [i for i, s in enumerate(self.states) if s != MASKED]

    def runs(self) -> list[tuple[list[int], str]]:
        """This block's rows as (tokens, state) runs of consecutive rows in one state."""
        runs: list[tuple[list[int], str]] = []
        start = 0
        for i in range(1, len(self.states) + 1):
            if i == len(self.states) or self.states[i] != self.states[start]:
                runs.append((list(self.tokens[start:i]), self.states[start]))
                start = i
        return runs

    def spans(self, decode: Callable[[list[int]], str]) -> list[tuple[str, str]]:
        """The runs as (text, state), each decoded on its own (a character whose bytes straddle
        two runs shows as U+FFFD in both)."""
        return [(decode(tokens), state) for tokens, state in self.runs()]

    def to_dict(
        self, decode: Callable[[list[int]], str], committed_text: str | None = None
    ) -> dict[str, Any]:
        """The JSON form of the server's `draft` events and the page (`docs/drafts.md`).
        committed_text: `decode(prefix)` if the caller has it (the same for a block's drafts)."""
        spans = self.spans(decode)
        if committed_text is None:
            committed_text = decode(list(self.prefix))
        return {
            "block": self.block,
            "round": self.round,
            "final": self.final,
            "committed_text": committed_text,
            "text": "".join(t for t, _ in spans),
            "spans": [{"text": t, "state": s} for t, s in spans],
            "tokens": list(self.tokens),
            "states": self.states,
            "confidence": [round(c, 4) for c in self.confidence],
        }


DraftCallback = Callable[[Draft], None]


@dataclass(frozen=True, slots=True)
class _Round:
    """One round on the host: block index, its number in the block (from 1), and all rows of the
    block: tokens, states, confidence; `generated`: the rows the request generates."""

    index: int
    number: int
    tokens: list[int]
    states: str
    confidence: list[float]
    generated: list[int]


def _round_view(rec: RoundRecord, generated: list[int]) -> _Round:
    """Block style: masked rows show the proposal; the others the canvas after the decision."""
    unresolved, accepted = rec.unresolved.tolist(), rec.accepted.tolist()
    edited = rec.edited.tolist() if rec.edited is not None else [False] * len(accepted)
    proposal, after = rec.proposal.tolist(), rec.canvas_after.tolist()
    states, tokens, conf = [], [], []
    confidence = rec.confidence.tolist()
    for u, a, e, p, c, q in zip(unresolved, accepted, edited, proposal, after, confidence):
        state = ACCEPTED if a or e else (MASKED if u else FINAL)
        states.append(state)
        tokens.append(p if state == MASKED else c)
        conf.append(1.0 if state == FINAL else q)
    return _Round(rec.block_index, rec.round + 1, tokens, "".join(states), conf, generated)


def _step_view(rec: CanvasStepRecord) -> _Round:
    """Encoder-decoder style: every row shows the step's argmax; accepted rows keep their sample."""
    states = "".join(ACCEPTED if a else MASKED for a in rec.accepted.tolist())
    rows = list(range(len(states)))
    return _Round(
        rec.canvas_index, rec.step + 1, rec.argmax.tolist(), states, rec.confidence.tolist(), rows
    )


def _live_view(v: RoundView) -> _Round:
    """Block style, from the round stream (`engine/block/row_stream.py`): the same fields."""
    states = "".join((FINAL, ACCEPTED, MASKED)[s] for s in v.states)
    rows = list(range(v.first, len(states)))
    return _Round(v.block_index, v.round, v.tokens, states, v.confidence, rows)


class DraftBuilder:
    """Turns a request's rounds and finished blocks into `Draft`s for `emit`.

    Feed it every round, as records (`record`: the engine's recorder, a block's records after the
    block) or live from the round stream (`view`: while the block runs), and every finished block
    (`on_progress`: the engine's block callback; it then calls `then`, the caller's own). Each
    round is emitted when the next one arrives, and a block's last round at its `on_progress`, as
    its `final` draft showing the block's output (cut at a stop id): one draft per round read, the
    last one final, all of a block's drafts before its `on_progress`.
    """

    def __init__(self, emit: Callable[[Draft], None], then: ProgressCallback | None = None) -> None:
        self._emit, self._then = emit, then
        self._held: _Round | None = None  # the newest round, not emitted yet
        self._unresolved: list[int] = []  # block style: round 0's rows to generate (records)
        self._first: int | None = None  # the first generated block's index
        self._tokens: list[int] = []  # the output as of the last finished block

    def record(self, rec: RoundRecord | CanvasStepRecord) -> None:
        if isinstance(rec, CanvasStepRecord):
            self._push(_step_view(rec))
            return
        if rec.round == 0:  # the prompt tail of the first block is resolved from the start
            self._unresolved = [i for i, u in enumerate(rec.unresolved.tolist()) if u]
        self._push(_round_view(rec, self._unresolved))

    def view(self, v: RoundView) -> None:
        self._push(_live_view(v))

    def _push(self, view: _Round) -> None:
        if self._first is None:
            self._first = view.index
        if self._held is not None:
            self._draft(self._held, None)
        self._held = view

    def on_progress(self, index: int, rounds: int, tokens: list[int]) -> None:
        before, self._tokens = self._tokens, list(tokens)
        if self._held is not None and self._held.index == index:
            self._draft(self._held, self._tokens[len(before) :], before)
            self._held = None
        if self._then is not None:
            self._then(index, rounds, tokens)

    def _draft(self, view: _Round, out: list[int] | None, before: list[int] | None = None) -> None:
        """Emit `view`; `out`: the block's output, which its final draft shows instead."""
        prefix = tuple(self._tokens if before is None else before)
        rows = view.generated
        tokens = [view.tokens[i] for i in rows]
        states = "".join(view.states[i] for i in rows)
        conf = [view.confidence[i] for i in rows]
        if out is not None:  # the output: nothing is provisional any more
            tokens, conf = out, conf[: len(out)]
            states = states[: len(out)].replace(MASKED, FINAL)
        block = view.index - (self._first or 0)
        final = out is not None
        self._emit(Draft(block, view.number, prefix, tuple(tokens), states, tuple(conf), final))


def chain(first: Callable | None, second: Callable) -> Callable:
    """A recorder that calls the user's (if any), then the draft builder's."""
    if first is None:
        return second

    def both(record) -> None:
        first(record)
        second(record)

    return both
