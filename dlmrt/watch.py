"""`dlmrt generate --watch`: draw each block filling in round by round, then the final text.

On a terminal the view is redrawn in place with ANSI escapes: the finished blocks' text, then the
active block's draft (masked rows' provisional guesses dimmed, rows accepted this round in bold
green, final rows plain) and a status line. Elsewhere (a pipe, a file) each round is one plain line
on stderr, masked rows shown as `_`, so stdout carries the final text only. The request runs in
`LLM.stream`'s thread: the pause between frames (drafts arrive a block at a time) never slows it.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from typing import TextIO

from dlmrt.drafts import ACCEPTED, MASKED, Draft

STYLE = {MASKED: "\x1b[2m", ACCEPTED: "\x1b[1;32m"}  # dim; bold green. Final rows: plain.
RESET = "\x1b[0m"


class Watch:
    """Draws drafts to `out` (a terminal: `tty`) or one plain line per round to `log`."""

    def __init__(
        self, decode: Callable[[list[int]], str], out: TextIO, log: TextIO, tty: bool, delay: float
    ) -> None:
        self.decode, self.out, self.log, self.tty, self.delay = decode, out, log, tty, delay
        self._rows = 0  # terminal rows the current view takes

    def show(self, draft: Draft) -> None:
        if not self.tty:
            print(
                f"[block {draft.block} round {draft.round}] {self._plain(draft)!r}", file=self.log
            )
            return
        committed = self.decode(list(draft.prefix))
        spans = draft.spans(self.decode)
        styled = "".join(STYLE.get(s, "") + t + RESET if s in STYLE else t for t, s in spans)
        decided = f"{len(draft.accepted_rows)}/{len(draft.states)} rows decided"
        status = f"[block {draft.block} · round {draft.round} · {decided}]"
        plain = committed + "".join(t for t, _ in spans)
        self._redraw(f"{committed}{styled}\n{status}", f"{plain}\n{status}")
        time.sleep(self.delay)

    def finish(self, text: str) -> None:
        """Replace the view by the final text (stdout)."""
        if self.tty:
            self._redraw(text, text)
        else:
            print(text, file=self.out, flush=True)

    def _plain(self, draft: Draft) -> str:
        """The block's draft for a log line: masked rows as one `_` each."""
        return "".join(
            "_" * len(tokens) if state == MASKED else self.decode(tokens)
            for tokens, state in draft.runs()
        )

    def _redraw(self, styled: str, plain: str) -> None:
        if self._rows:
            self.out.write(f"\x1b[{self._rows}F\x1b[J")  # up to the view's first row, clear below
        self.out.write(styled + "\n")
        self.out.flush()
        cols = max(shutil.get_terminal_size().columns, 1)
        self._rows = sum(max(math.ceil(len(line) / cols), 1) for line in plain.split("\n"))
