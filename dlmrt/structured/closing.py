"""The closing search: a short token sequence that completes the document from a matcher's state.

`closing(matcher, ...)` returns tokens that take the matcher to an accepting state (the document
may end there), at most `limit` of them, or None if none was found. It is a depth-first search
over single-byte tokens in `order` (closers first: `} ] "`, then digits, letters, punctuation),
each step trying only the tokens the grammar allows there (then a few other allowed tokens: a
forced key may admit only its canonical multi-byte token), backtracking from dead ends, bounded
by `max_nodes` consumed tokens. The matcher is left as it was.

The result is an upper bound on the shortest completion (a multi-byte token could close in fewer
tokens), so reserving it for `max_tokens` is safe but can be conservative by a few tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

# What the search tries first: what closes structures, then words (a literal tail such as
# `The answer is` before another `\d+ ... ` step), then digits and other punctuation.
PREFERENCE = "}]\") .\nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789,:-+_{[(/*=<>!?#$%&^|~@;`'"
MAX_NODES = 4096
FALLBACK = 8


def byte_tokens(tokenize: Callable[[bytes], list[int]]) -> list[int]:
    """The token ids of the `PREFERENCE` characters that are single tokens, in that order."""
    ids = []
    for ch in PREFERENCE:
        toks = tokenize(ch.encode())
        if len(toks) == 1 and toks[0] not in ids:
            ids.append(toks[0])
    return ids


class Mask:
    """A grammar's allowed-set as llguidance computes it: packed bits, token t at bit t % 32 of
    word t // 32 (`size` tokens). The search reads a few dozen bits of each and compares whole
    sets, so it never unpacks one to a [vocab] array (at 152k tokens that was most of its time)."""

    __slots__ = ("words", "size", "_key")

    def __init__(self, words: np.ndarray, size: int) -> None:
        self.words, self.size = words.view(np.uint32), size
        self._key: bytes | None = None

    def key(self) -> bytes:
        """The set as bytes (computed once: the search compares a child's set with its parent's,
        then keys the child's own node by it)."""
        if self._key is None:
            self._key = self.words.tobytes()
        return self._key

    @classmethod
    def single(cls, token: int, size: int) -> Mask:
        """The set holding only `token`."""
        words = np.zeros((size + 31) // 32, dtype=np.uint32)
        words[token >> 5] = np.uint32(1 << (token & 31))
        return cls(words, size)

    def unpack(self) -> np.ndarray:
        """[size] bool (host work the engines avoid: they unpack on the device)."""
        bits = np.unpackbits(self.words.view(np.uint8), bitorder="little")
        return bits[: self.size].astype(bool)

    def count(self) -> int:
        """How many tokens the set holds."""
        return int(np.unpackbits(self.words.view(np.uint8)).sum())

    def allows(self, ids: np.ndarray) -> np.ndarray:
        """[len(ids)] bool: which of the token ids `ids` (int64) the set holds."""
        return ((self.words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)

    def first(self, count: int) -> list[int]:
        """The `count` smallest token ids the set holds (from its first non-zero words)."""
        out: list[int] = []
        for w in np.flatnonzero(self.words):
            bits, base = int(self.words[w]), int(w) * 32
            while bits and len(out) < count:
                low = bits & -bits
                t = base + low.bit_length() - 1
                if t >= self.size:
                    return out
                out.append(t)
                bits ^= low
            if len(out) >= count:
                break
        return out


def closing(
    matcher,
    order: list[int],
    allowed: Callable[[], Mask | None],
    limit: int,
    max_nodes: int = MAX_NODES,
) -> list[int] | None:
    """Tokens (at most `limit`) from the matcher's state to an accepting one; None if not found.

    `matcher` has llguidance's `is_accepting`, `try_consume_tokens`, `rollback`; `allowed()` the
    `Mask` of what the grammar allows now (None: every token of `order`). Iterative deepening (depth 4, 8, ...,
    `limit`), so a short completion is found before a long one (a repetition such as `(step )*`
    is left, not unrolled); within a depth, a node whose allowed-set already found nothing at the
    same or a shallower depth (as many tokens left, or more) is not searched again, and of the candidates that leave the allowed-set as it was
    (another character of a string, another digit) only the first is followed, after the others
    (leaving a repetition is preferred): allowed-sets stand
    in for grammar states, which llguidance does not expose. If that finds nothing, one plain depth-first pass follows."""
    depth = 4
    while True:
        found = _search(matcher, order, allowed, min(depth, limit), max_nodes, memo=True)
        if found is not None or depth >= limit:
            break
        depth *= 2
    if found is None:
        found = _search(matcher, order, allowed, limit, max_nodes, memo=False)
    return found


def _search(matcher, order, allowed, limit: int, max_nodes: int, memo: bool):
    order_ids = np.asarray(order, dtype=np.int64)
    path: list[int] = []
    dead: dict[bytes | None, int] = {}  # allowed-set -> the shallowest depth it found nothing at
    nodes = [max_nodes]

    def _follow(t: int, child) -> bool:
        """Descend through the consumed token t; undo it if nothing was found below."""
        path.append(t)
        if dfs(child):
            return True
        path.pop()
        matcher.rollback(1)
        return False

    def dfs(ok) -> bool:
        if matcher.is_accepting():
            return True
        if len(path) >= limit:
            return False
        sig = None if ok is None else ok.key()
        if memo and dead.get(sig, limit) <= len(path):  # deeper: fewer tokens left, nothing either
            return False
        stay = None  # the first candidate that leaves the allowed-set as it was: tried last
        for t in _candidates(order, order_ids, ok):
            if nodes[0] <= 0:
                break
            nodes[0] -= 1
            if matcher.try_consume_tokens([t]) != 1:
                continue
            child = allowed()
            if memo and (None if child is None else child.key()) == sig:  # a string char, a digit
                matcher.rollback(1)
                stay = t if stay is None else stay
                continue
            if _follow(t, child):
                return True
        if stay is not None and matcher.try_consume_tokens([stay]) == 1:
            if _follow(stay, allowed()):
                return True
        if memo:
            dead[sig] = min(dead.get(sig, limit), len(path))
        return False

    found = dfs(allowed())
    if found and path:
        matcher.rollback(len(path))
    return list(path) if found else None


def _candidates(order: list[int], order_ids: np.ndarray, ok: Mask | None) -> Iterator[int]:
    """The allowed tokens of `order`, then (a grammar may allow only a multi-byte token, e.g.
    the canonical first token of a forced key) the first `FALLBACK` other allowed ids: those
    are looked up only if the search gets to them."""
    if ok is None:
        yield from order
        return
    first = [order[i] for i in np.flatnonzero(ok.allows(order_ids))]
    yield from first
    seen = set(first)
    rest = [int(t) for t in ok.first(FALLBACK + len(first)) if int(t) not in seen]
    yield from rest[:FALLBACK]
