"""Structured decoding on the block engine: each round is decided left to right through a grammar.

The grammar lives on the host (`dlmrt/structured/grammar.py`: the request's `Constraint`), so a
structured request runs round by round: the forward is a `Pass` (a captured graph in round_graph
and block_graph engines, where it replays like round_graph; eager otherwise), never one block-long
graph. Per block, with `frontier` = the first generated row the grammar has not consumed:

  0. forced: while the frontier row is masked and the grammar forces tokens (llguidance's
     fast-forward, e.g. `{"answer":`, or the closing sequence when the budget is tight), they are
     committed with no forward; once the document is complete the remaining rows are stop tokens.
  1. the forward: logits [B, V] of the block's canvas.
  2. the chain is masked (`masked`; one read-back of each row's top-K ids, one upload): the
     frontier row to what the grammar allows there, each row right of it to what the grammar
     allows after the rows left of it (drafts, or their best allowed tokens); then the request's
     rule decides every row as usual (`RoundSpec.decide`): a masked row's confidence and entropy
     are those of its masked distribution.
  3. one read-back, with the non-finite flag of the unmasked logits (NaN / inf raises
     `NonFiniteError`: `engine/nonfinite.py`); the walk: the rows the rule accepted that are
     contiguous from the frontier are offered to the grammar left to right and consumed while
     valid (and closable in the budget); the first invalid one goes back to mask (and what the
     grammar forces there is committed, as in 0). A row accepted right of a masked row is a
     draft: it stays in the canvas (the model sees it) and is checked when the frontier reaches
     it (the masks right of the frontier hold on a speculated prefix only).
  4. editing rules: an edit of a consumed row is re-checked (the grammar rolls back to it and
     re-reads the rewritten rows); an edit that breaks the grammar is refused (the old token is
     put back). Edits of drafts need no check. After a complete document the stop rows are not
     the grammar's: an edit of one, or one that leaves the document open, is refused.
A block is done when every row is consumed (editing rules: and the rule says done). Rounds are
bounded: a draft is rejected only when the frontier reaches it, and the frontier never moves back.
Commits run unfolded (one commit pass per block), as with a recorder; each committed block is
kept for prefix reuse (`engine/prefix.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from dlmrt.attention import AttnContext
from dlmrt.config import EAGER, ROUND_GRAPH
from dlmrt.engine import nonfinite
from dlmrt.engine.block.round import decide_block, store_round
from dlmrt.engine.grammar_mask import TOP_K, best_allowed, mask_rows
from dlmrt.engine.graph.capture import check_stop
from dlmrt.engine.graph.loop import Pass
from dlmrt.errors import NonFiniteError

log = logging.getLogger("dlmrt")


class Constraint(Protocol):
    """What the engine asks of a request's grammar (`dlmrt.structured.grammar.Constraint`)."""

    host_s: float

    @property
    def done(self) -> bool: ...
    def allowed(self) -> torch.Tensor: ...
    def chain(self, rows: list[int | None], pick: Callable) -> list: ...
    def forced(self) -> list[int]: ...
    def take(self, tokens: list[int]) -> int: ...
    def replace(self, k: int, new: list[int]) -> bool: ...


@dataclass
class _Block:
    """The host's copy of the active block."""

    canvas: list[int]
    unresolved: list[bool]
    frontier: int  # first row the grammar has not consumed (the prompt tail is skipped)
    end: int  # block rows
    mask_id: int
    stop_id: int
    forced: int = 0
    stop_from: int | None = None  # the document was complete here: the stop fill from this row

    def finished(self) -> bool:
        return self.frontier >= self.end

    def consumed(self) -> int:
        """The end of the rows the grammar consumed (the stop fill after a complete document is
        never consumed)."""
        return self.frontier if self.stop_from is None else self.stop_from


def mode_of(runner_name: str) -> tuple[str, str]:
    """The mode a structured request runs in, and why (logged)."""
    if runner_name == EAGER:
        return EAGER, "the engine runs eager"
    return ROUND_GRAPH, "the grammar decides on the host each round: the forward replays per round"


def forward_pass(prog) -> tuple[Pass, torch.Tensor]:
    """The program's forward-only pass (logits into a static [B, V] buffer), built once."""
    if getattr(prog, "structured_forward", None) is None:
        spec, buf, kv = prog.spec, prog.buf, prog.kv
        vocab = spec.model.cfg.vocab_size
        logits = torch.zeros(spec.block_length, vocab, device=buf.canvas.device)

        def body() -> None:
            ctx = AttnContext(buf.positions, spec.block_length, kv, prog.kv_len, one_block=True)
            receives = spec.receives(buf.unresolved) if buf.z is not None else None
            logits.copy_(spec.model(buf.canvas, ctx, z=buf.z, receives=receives))

        prog.structured_forward = (Pass("structured_forward", body, (buf,)), logits)
    return prog.structured_forward


def settle(st: _Block, c: Constraint) -> None:
    """Steps 0 and 3's walk: consume drafts from the frontier, commit forced tokens, repeat."""
    while not st.finished():
        f = st.frontier
        if c.done:  # the document is complete: only stop tokens may follow
            for r in range(f, st.end):
                st.canvas[r], st.unresolved[r] = st.stop_id, False
            st.frontier, st.stop_from = st.end, f
            return
        if not st.unresolved[f]:  # a draft (or a run of them) at the frontier
            run = f
            while run < st.end and not st.unresolved[run]:
                run += 1
            n = c.take(st.canvas[f:run])
            st.frontier += n
            if n < run - f:  # the first invalid row goes back to mask; drafts after it stay
                r = st.frontier  # (and what the grammar forces there is committed next)
                st.canvas[r], st.unresolved[r] = st.mask_id, True
            continue
        toks = c.forced()[: st.end - f]
        n = c.take(toks)
        for i in range(n):
            st.canvas[f + i], st.unresolved[f + i] = toks[i], False
        st.frontier += n
        st.forced += n
        if n == 0:
            return


def run_block(
    prog, st: _Block, c: Constraint, should_stop: Callable[[], None], index: int
) -> tuple[int, list[int]]:
    """Decide block `index` through the grammar; (rounds run, final canvas). The block's buffers
    were started by the caller (`BlockIO`); the host copy `st` matches them. A round whose
    logits hold NaN / inf raises `NonFiniteError`."""
    spec, buf, runner = prog.spec, prog.buf, prog.runner
    fwd, logits = forward_pass(prog)
    edits = getattr(spec.rule, "edits", False)
    cap = spec.block_length**2 + spec.rule.max_rounds(spec.block_length) + 8
    start = st.frontier
    settle(st, c)
    rounds, rule_done = 0, False
    while not st.finished() or (edits and not rule_done and rounds < cap):
        if rounds >= cap:
            raise RuntimeError(f"structured block did not finish in {cap} rounds")
        should_stop()
        _upload(buf, st)
        runner.once(fwd)
        rounds += 1
        bad = nonfinite.flag(logits).view(1)  # before the mask writes -inf into the frontier row
        lg = logits if st.finished() or not st.unresolved[st.frontier] else masked(st, c, logits)
        d = decide_block(spec, buf, lg)
        store_round(buf, d)
        edited = d.out.edited if d.out.edited is not None else torch.zeros_like(d.out.accepted)
        packed = torch.cat(
            (buf.canvas, buf.unresolved.long(), edited.long(), buf.done.long().view(1), bad)
        )
        values = packed.tolist()  # the round's one read-back
        if values[-1]:
            raise nonfinite.error(spec.model, f"block {index} (round {rounds})")
        b = spec.block_length
        old = list(st.canvas)
        st.canvas, st.unresolved = values[:b], [bool(v) for v in values[b : 2 * b]]
        rule_done = bool(values[3 * b])
        if edits:
            check_edits_consumed(st, old, [bool(v) for v in values[2 * b : 3 * b]], c, start)
        settle(st, c)
    _upload(buf, st)
    return rounds, st.canvas


def masked(st: _Block, c: Constraint, logits: torch.Tensor) -> torch.Tensor:
    """The logits with the grammar's chain masked (`Constraint.chain`): the frontier row to what
    the grammar allows there, each row right of it to what the grammar allows after the rows
    left of it read as their drafts or their best allowed tokens (`best_allowed`). Rows past
    the chain (a rejected draft, no allowed token in the top K) keep their logits."""
    f, end, vocab = st.frontier, st.end, logits.shape[-1]
    top = logits[f:end].topk(min(TOP_K, vocab), dim=-1).indices.tolist()  # a small read-back
    rows = [None if st.unresolved[r] else st.canvas[r] for r in range(f, end)]
    chain = c.chain(rows, lambda i, ok: best_allowed(top[i], ok))
    return mask_rows(logits, [f + i for i, _ in chain], [ok for _, ok in chain])


def check_edits_consumed(
    st: _Block, old: list[int], edited: list[bool], c: Constraint, start: int
) -> None:
    """Editing rules: an edit of a row the grammar consumed (rows start .. consumed-1) is
    re-checked by rolling the grammar back to the first edited row; refused if it breaks it. After
    a complete document only stop tokens follow: an edit of a stop row is refused, and so is one
    that leaves the document open."""
    end = st.consumed()
    for r in range(end, st.frontier):  # the stop fill
        st.canvas[r] = old[r]
    rows = [r for r in range(start, end) if edited[r] and st.canvas[r] != old[r]]
    if not rows:
        return
    first = rows[0]
    ok = c.replace(end - first, st.canvas[first:end])
    if ok and st.stop_from is not None and not c.done:  # valid, but the stop rows need an end
        c.replace(end - first, old[first:end])  # the old tokens back (they were consumed)
        ok = False
    if not ok:
        for r in rows:
            st.canvas[r] = old[r]


def _upload(buf, st: _Block) -> None:
    """The host's block state into the device buffers (the next round reads them)."""
    dev = buf.canvas.device
    buf.canvas.copy_(torch.tensor(st.canvas, dtype=torch.long).to(dev))
    buf.unresolved.copy_(torch.tensor(st.unresolved, dtype=torch.bool).to(dev))


def run_blocks(engine, prog, prompt_ids, mask_id, seed, req, res, c: Constraint, emit) -> None:
    """The block loop of a structured request (`BlockEngine.generate` with a constraint): stage
    and start each block as usual, decide it through the grammar, emit it, commit it unfolded
    (and keep it for prefix reuse, `engine/prefix.py`)."""
    lay, runner = req.lay, prog.runner
    stop_id = min(req.stop_ids)
    res.mode, why = mode_of(runner.name)
    log.info("structured request: mode %s (%s)", res.mode, why)

    by_rounds = engine.stream_rounds and not getattr(prog.spec.rule, "edits", False)
    feed = req.feed if by_rounds else None
    shown: list = []  # (block start, output before it, the block's host state) for the feed

    def poll() -> None:  # before every round: hand over the rows the grammar consumed so far
        check_stop(req.should_stop)
        if feed is not None and shown:
            start, before, st = shown[0]
            rows = st.canvas[: st.frontier] + [-1] * (st.end - st.frontier)
            feed.show(start, before, rows)

    for b in range(lay.first_block, lay.num_blocks):
        bl = lay.block_length
        tail = prompt_ids[b * bl :] if b == lay.first_block else []
        prog.io.stage(tail, mask_id, b * bl, seed, False)
        prog.kv_len = engine._kv_len(b, bl)
        runner.chain((prog.io.copy_in, prog.start))
        prog.io.in_flight = False  # nothing reads the report row back
        canvas = list(tail) + [mask_id] * (bl - len(tail))
        unresolved = [False] * len(tail) + [True] * (bl - len(tail))
        st = _Block(canvas, unresolved, len(tail), bl, mask_id, stop_id)
        shown[:] = [(b * bl, list(res.token_ids), st)]
        try:
            rounds, final = run_block(prog, st, c, poll, b)
        except NonFiniteError:
            engine.prefix.clear()  # keep no K/V of a request that went non-finite
            raise
        res.denoising_forwards += rounds
        res.forced_tokens += st.forced
        if emit(res, req, b, rounds, final):
            break
        runner.once(prog.commit)
        res.commit_forwards += 1
        engine.prefix.commit(b * bl, final)  # its K/V are final now: the next request may reuse
    res.grammar_ms = c.host_s * 1e3
