"""Grammars (one per tokenizer) and Constraint (one per request), on llguidance.

`grammars_for(tokenizer, vocab_size, stop_ids)` wraps the tokenizer for llguidance once (cached on
the tokenizer object) and compiles a request's `ResponseFormat` into a checked grammar (cached by
the format's text). `Grammars.constraint(fmt, max_new_tokens)` is the request's grammar state that
the block engine drives round by round (`dlmrt/engine/block/structured.py`):

    allowed()        [V] bool: the tokens the grammar allows at the frontier (the next row)
    chain(rows, pick) the allowed tokens of each masked row from the frontier, given the rows left
                     of it (drafts, or the model's best allowed token): speculative masks
    take(tokens)     consume a run of proposed tokens left to right; how many were valid
    forced()         tokens the grammar (or the budget) forces next: committed without a forward
    replace(k, new)  re-check the last k consumed tokens rewritten as `new` (an editing rule)
    done             the document is complete and nothing more may follow (stop rows only)

The budget is part of the grammar: the constraint keeps `closing`, a sequence that completes the
document from the current state (`closing.py`), no longer than the tokens left. A token after
which no completion fits is refused, and from then on the closing sequence is forced. A
`max_new_tokens` that cannot hold any document is a ValueError before decoding starts.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dlmrt.structured.closing import Mask, byte_tokens, closing
from dlmrt.structured.formats import ResponseFormat, choices_regex

log = logging.getLogger("dlmrt")
EXTRA = "pip install 'dlmrt[structured]'"
# Compact JSON (no optional whitespace): fewer tokens, and the model cannot pad forever.
JSON_OPTIONS = {"whitespace_flexible": False}
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# The closing search runs after a token only near the budget: while more than SLACK tokens beyond
# the last closing length plus the growth estimated since remain, it waits. Each token taken adds
# STALE_GROWTH plus the tokens the grammar then forces (a `{` whose required key follows forces
# the key: the closing grew by at least that). A grammar where one token opens more closing
# tokens than that could reach the budget before the search resumes: the document is then cut at
# the budget (`unclosable`; docs/structured-output.md: limits).
SLACK, STALE_GROWTH = 8, 4
FIRST_CLOSINGS = 1024  # (grammar, budget) start-state closing searches kept per tokenizer


def engine() -> Any:
    """The llguidance module, or a ValueError naming the extra that installs it."""
    try:
        import llguidance
    except ImportError:
        raise ValueError(
            "response_format: structured output needs the grammar engine llguidance, which is "
            f"not installed ({EXTRA})"
        ) from None
    return llguidance


def grammars_for(tokenizer: Any, vocab_size: int, stop_ids: set[int]) -> Grammars:
    """The tokenizer's `Grammars` (built once: wrapping a large vocabulary takes ~1 s)."""
    key = (vocab_size, tuple(sorted(stop_ids)))
    per_tok = _CACHE.setdefault(tokenizer, {})
    if key not in per_tok:
        per_tok[key] = Grammars(tokenizer.to_json(), vocab_size, stop_ids)
    return per_tok[key]


class Grammars:
    def __init__(self, tokenizer_json: str, vocab_size: int, stop_ids: set[int]) -> None:
        ll = self.ll = engine()
        stops = sorted(stop_ids)
        self.tok = ll.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=stops)
        self.vocab_size, self.stop_id = vocab_size, stops[0]
        self.order = byte_tokens(lambda b: self.tok.tokenize_bytes(b))
        self._compiled: dict[str, str] = {}
        # (grammar, budget) -> the closing search's result from the grammar's start state
        self._first_closing: dict[tuple[str, int], tuple[int, ...] | None] = {}

    def first_closing(self, matcher, grammar: str, budget: int, allowed) -> list[int] | None:
        """The closing search from `matcher`, a fresh matcher of `grammar`, within `budget`. Every
        request of a grammar starts in the same state, and the search is deterministic (it
        costs hundreds of grammar masks), so its result is kept per (grammar, budget)."""
        key = (grammar, budget)
        if key not in self._first_closing:
            found = closing(matcher, self.order, allowed, budget)
            self._first_closing[key] = None if found is None else tuple(found)
            if len(self._first_closing) > FIRST_CLOSINGS:  # the oldest goes
                del self._first_closing[next(iter(self._first_closing))]
        found = self._first_closing[key]
        return None if found is None else list(found)

    def grammar(self, fmt: ResponseFormat) -> str:
        """The checked llguidance grammar of `fmt`; a ValueError naming the part it cannot compile."""
        key = fmt.key()
        if key not in self._compiled:
            ll, part = self.ll.LLMatcher, f"response_format.{fmt.kind}"
            if fmt.kind == "json_object":
                text = ll.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
            elif fmt.kind == "json_schema":
                part += ".schema"
                try:
                    text = ll.grammar_from_json_schema(fmt.value, JSON_OPTIONS)
                except ValueError as e:
                    raise ValueError(f"{part}: {e}") from None
            else:
                pattern = fmt.value if fmt.kind == "regex" else choices_regex(fmt.value)
                text = ll.grammar_from_regex(pattern)
            failed, messages = ll.validate_grammar_with_warnings(text, self.tok)
            if failed:
                raise ValueError(f"{part}: cannot be compiled: {messages[0].strip()}")
            self._compiled[key] = text
        return self._compiled[key]

    def constraint(self, fmt: ResponseFormat, max_new_tokens: int) -> Constraint:
        """A request's grammar state; a ValueError if no document fits `max_new_tokens`."""
        return Constraint(self, self.grammar(fmt), max_new_tokens)


class Constraint:
    """One request's grammar state (the module docstring lists what the engine calls)."""

    def __init__(self, grammars: Grammars, grammar: str, budget: int) -> None:
        self.g, self.budget = grammars, budget
        self.m = grammars.ll.LLMatcher(grammars.tok, grammar)
        self._words = np.zeros((grammars.vocab_size + 31) // 32, dtype=np.int32)
        self.host_s = 0.0  # time spent in the grammar (masks, checks, closing searches)
        self.closing_mode = False  # a token was refused for the budget: close now
        self.history: list[int] = []  # the consumed tokens (an edit rolls back into them)
        # the closing's estimated growth over the tokens taken since it was last searched (0:
        # `closing` is the search's own; else an estimate)
        self.growth = 0
        self.unclosable = False  # no closing fits any more: the output is cut at the budget
        t0 = time.perf_counter()
        found = grammars.first_closing(self.m, grammar, budget, self._mask)
        self.host_s += time.perf_counter() - t0
        if found is None:
            raise ValueError(
                f"max_new_tokens: {budget} tokens cannot hold any document of this "
                "response_format (raise max_tokens)"
            )
        self.closing = found

    @property
    def done(self) -> bool:
        """Nothing but stop tokens may follow (the grammar stopped, or the budget is spent: the
        document complete, or cut when it could not close)."""
        spent = self.budget == 0 and (self.m.is_accepting() or self.unclosable)
        return self.m.is_stopped() or spent

    def _mask(self) -> Mask:
        """The allowed-set now, packed (its own copy: the search keeps one per node)."""
        self.m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        return Mask(self._words.copy(), self.g.vocab_size)

    def tight(self) -> bool:
        """Every token left is needed to close the document (or the budget refused one)."""
        return self.closing_mode or (self.growth == 0 and len(self.closing) >= self.budget)

    def allowed(self) -> torch.Tensor:
        """[V] bool: what the frontier row may take (only the closing token when tight)."""
        t0 = time.perf_counter()
        ok = self._frontier_np()
        self.host_s += time.perf_counter() - t0
        return torch.from_numpy(ok)

    def _frontier_np(self) -> np.ndarray:
        return self._frontier_mask().unpack()

    def _frontier_mask(self) -> Mask:
        if self.tight() and self.closing:
            return Mask.single(self.closing[0], self.g.vocab_size)
        return self._mask()

    def chain(self, rows: list[int | None], pick: Callable[[int, Mask], int | None]):
        """[(i, allowed)] for the masked rows of a block from the frontier, each conditioned on a
        speculated prefix; `allowed` is packed (`closing.Mask`: the engine unpacks it on the
        device). `rows[i]` is a draft's token (None: a masked row). A masked row gets what the
        grammar allows after the rows left of it, then stands for `pick(i, allowed)` (the
        model's best allowed token; None ends the chain); a draft stands for itself (one the
        grammar rejects ends the chain, as does a stop token). Only the first mask is the
        frontier's own (`allowed`, the budget included); the others hold on the speculated
        prefix only, so the walk still checks every row it consumes. The grammar is left as it
        was."""
        t0, out, taken = time.perf_counter(), [], 0
        try:
            for i, tok in enumerate(rows):
                if tok is None:
                    ok = self._frontier_mask() if i == 0 else self._mask()
                    out.append((i, ok))
                    tok = pick(i, ok)
                if tok is None or tok in self.g.tok.eos_tokens or self.m.is_stopped():
                    break
                if self.m.try_consume_tokens([tok]) != 1:
                    break
                taken += 1
        finally:
            self.m.rollback(taken)
        self.host_s += time.perf_counter() - t0
        return out

    def forced(self) -> list[int]:
        """Tokens that must come next: the closing sequence when tight, else llguidance's
        fast-forward tokens (e.g. `{"answer":`); [] when the model has a choice."""
        if self.done:
            return []
        if self.tight():
            return list(self.closing)
        t0 = time.perf_counter()
        ff = self.m.compute_ff_tokens()
        self.host_s += time.perf_counter() - t0
        return ff

    def take(self, tokens: list[int]) -> int:
        """Consume `tokens` left to right while each keeps the output a valid prefix whose
        document can still close in the budget; the number consumed."""
        t0 = time.perf_counter()
        n = 0
        for t in tokens:
            if not self._take_one(t):
                break
            n += 1
        self.host_s += time.perf_counter() - t0
        return n

    def _take_one(self, t: int) -> bool:
        if self.m.is_stopped() or self.m.try_consume_tokens([t]) != 1:
            return False
        if self.m.is_stopped() and t in self.g.tok.eos_tokens:
            self.closing = []
            self.history.append(t)
            return True
        if self.budget == 0:  # accepting with nothing left: only a stop token may follow
            self.m.rollback(1)
            return False
        self.budget -= 1
        self.history.append(t)
        if self.closing and t == self.closing[0]:
            self.closing = self.closing[1:]
            return True
        if self.unclosable:
            return True
        self.growth += STALE_GROWTH + len(self.m.compute_ff_tokens())
        if self.budget > len(self.closing) + self.growth + SLACK:  # the search waits
            self._give_up(self.budget == 0 and not self.m.is_accepting())  # (never, SLACK >= 0)
            return True
        found = closing(self.m, self.g.order, self._mask, self.budget)
        if found is None:  # the document could not close in time after t: refuse it, close now
            self._rollback(1)
            self.closing_mode = True
            found = closing(self.m, self.g.order, self._mask, self.budget)  # from here: exact
            self.closing, self.growth = found or [], 0
            self._give_up(found is None)
            return False
        self.closing, self.growth = found, 0
        return True

    def _give_up(self, unclosable: bool) -> None:
        """An estimate let through a token after which no closing fits the budget (a token that
        opened more than the estimate): the grammar still holds, the budget no longer can, so
        the output is cut at `max_new_tokens` (finish "length"), as an unconstrained one."""
        if unclosable and not self.unclosable:
            self.unclosable, self.closing_mode = True, False
            log.warning(
                "structured request: the document can no longer close within max_new_tokens "
                "(a token opened more than the closing estimate); it will be cut at the budget"
            )

    def replace(self, k: int, new: list[int]) -> bool:
        """The last `k` consumed tokens rewritten as `new` (len k): accepted, and consumed, only
        if the rewritten prefix is valid and can still close; else the old tokens stay."""
        old, saved = self.history[-k:], (self.budget, list(self.closing), self.closing_mode)
        self._rollback(k)
        n = self.take(new)
        if n == k:
            return True
        self._rollback(n)
        self.m.consume_tokens(old)
        self.history += old
        self.budget, self.closing, self.closing_mode = saved
        return False

    def _rollback(self, n: int) -> None:
        if n:
            self.m.rollback(n)
            self.budget += sum(t not in self.g.tok.eos_tokens for t in self.history[-n:])
            del self.history[-n:]
