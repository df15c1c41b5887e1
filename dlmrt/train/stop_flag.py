"""StopFlag: SIGINT/SIGTERM ask a training loop to save a checkpoint and return.

Ctrl-C, and `timeout` / a job scheduler's SIGTERM, reach the whole process group: the trainer's
helper processes (data-loader workers, the verifier pool) call `ignore_stop_signals` so they
keep serving the step in flight while the trainer finishes it, saves and stops; they exit when
the trainer shuts them down (or, if it dies, when their pipe to it closes).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger("dlmrt")


class StopFlag:
    """SIGINT/SIGTERM set the flag (the loop saves and returns); a second SIGINT interrupts."""

    def __init__(self) -> None:
        self.set = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.set and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.set = True
        log.warning("signal %d: saving a checkpoint after this step", signum)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def ignore_stop_signals(*_: Any) -> None:
    """In a helper process: leave SIGINT/SIGTERM to the trainer (a pool initializer's signature)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
