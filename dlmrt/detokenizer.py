"""IncrementalText: committed token ids -> the new text to stream, with stop strings.

The whole token list is decoded each time and only the new suffix is sent, so what is streamed
concatenates to exactly the non-streamed text. Held back until later: a trailing U+FFFD (the
bytes of a character may still be incomplete) and a trailing piece that could start a stop string.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("dlmrt")
REPLACEMENT = "\ufffd"


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str], stop: list[str] | None = None) -> None:
        self._decode = decode
        self._stop = list(stop or [])
        self.sent = ""  # everything returned so far
        self.text = ""  # the decoded text, cut before a stop string (complete after `final`)
        self.stopped = False  # a stop string was found: the text ends before it

    def update(self, token_ids: list[int], final: bool = False) -> str:
        """Return the text to send now (possibly ""). `final` flushes everything held back."""
        if self.stopped:
            return ""
        text = self._decode(token_ids)
        cut = self._first_stop(text)
        if cut is not None:
            text, final, self.stopped = text[:cut], True, True
        self.text = text
        if not final:
            text = text.rstrip(REPLACEMENT)
            text = text[: len(text) - self._stop_prefix_len(text)]
        if not text.startswith(self.sent):
            # The tokenizer re-decoded already-sent text differently; it cannot be taken back.
            log.warning("streamed text diverged from the decoded text; sending the new suffix only")
            if not final:
                return ""
            text = self.sent + text[_common_prefix(text, self.sent) :]
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def tokens_until_stop(self, token_ids: list[int]) -> int:
        """The fewest leading tokens whose text holds a stop string (all of them when none
        does): what a stopped request generated, the tokens decoded past it not counted.
        Binary search: holding a stop string only grows with the prefix."""
        if self._first_stop(self._decode(token_ids)) is None:
            return len(token_ids)
        lo, hi = 1, len(token_ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._first_stop(self._decode(token_ids[:mid])) is None:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _first_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
