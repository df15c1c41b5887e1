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
its `token_ids`. The engines hand a block's records over after the block (block_graph: from
device-side history buffers, no host sync inside the block), so drafts arrive a block at a time;
`docs/drafts.md` says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlmrt.outputs import CanvasStepRecord, ProgressCallback, RoundRecord

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
    """One record, on the host: block index, tokens, states, confidence (all rows of the block)."""

    index: int
    tokens: list[int]
    states: str
    confidence: list[float]


def _round_view(rec: RoundRecord) -> _Round:
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
    return _Round(rec.block_index, tokens, "".join(states), conf)


def _step_view(rec: CanvasStepRecord) -> _Round:
    """Encoder-decoder style: every row shows the step's argmax; accepted rows keep their sample."""
    states = "".join(ACCEPTED if a else MASKED for a in rec.accepted.tolist())
    return _Round(rec.canvas_index, rec.argmax.tolist(), states, rec.confidence.tolist())


class DraftBuilder:
    """Turns a request's records and finished blocks into `Draft`s for `emit`.

    Feed it every record (`record`: the engine's recorder) and every finished block (`on_progress`:
    the engine's block callback; it then calls `then`, the caller's own). Both engines hand a
    block's records over before its `on_progress` (after the block, in every mode), so a block's
    drafts are emitted at its `on_progress`, when its output (cut at a stop id) is known.
    """

    def __init__(self, emit: Callable[[Draft], None], then: ProgressCallback | None = None) -> None:
        self._emit, self._then = emit, then
        self._rounds: dict[int, list[_Round]] = {}  # block -> its rounds so far
        self._generated: dict[int, list[bool]] = {}  # block -> rows the request generates
        self._first: int | None = None  # the first generated block's index
        self._tokens: list[int] = []  # the output as of the last finished block

    def record(self, rec: RoundRecord | CanvasStepRecord) -> None:
        if isinstance(rec, CanvasStepRecord):
            view = _step_view(rec)
            self._generated.setdefault(view.index, [True] * len(view.tokens))
        else:
            view = _round_view(rec)
            if rec.round == 0:  # the prompt tail of the first block is resolved from the start
                self._generated[view.index] = rec.unresolved.tolist()
        if self._first is None:
            self._first = view.index
        self._rounds.setdefault(view.index, []).append(view)

    def on_progress(self, index: int, rounds: int, tokens: list[int]) -> None:
        before, self._tokens = self._tokens, list(tokens)
        if index in self._rounds:
            self._emit_block(index, self._rounds.pop(index), before, self._tokens)
        if self._then is not None:
            self._then(index, rounds, tokens)

    def _emit_block(self, index: int, rounds: list[_Round], before, after) -> None:
        rows = [i for i, g in enumerate(self._generated.pop(index)) if g]
        block, prefix = index - (self._first or 0), tuple(before)
        out = after[len(before) :]  # the block's output: its generated rows, maybe cut
        for r, view in enumerate(rounds):
            tokens = [view.tokens[i] for i in rows]
            states = "".join(view.states[i] for i in rows)
            conf = [view.confidence[i] for i in rows]
            last = r == len(rounds) - 1
            if last:  # the output: nothing is provisional any more
                tokens, conf = out, conf[: len(out)]
                states = states[: len(out)].replace(MASKED, FINAL)
            draft = Draft(block, r + 1, prefix, tuple(tokens), states, tuple(conf), last)
            self._emit(draft)


def chain(first: Callable | None, second: Callable) -> Callable:
    """A recorder that calls the user's (if any), then the draft builder's."""
    if first is None:
        return second

    def both(record) -> None:
        first(record)
        second(record)

    return both
