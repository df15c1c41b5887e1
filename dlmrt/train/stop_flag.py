"""StopFlag: SIGINT/SIGTERM ask a training loop to save a checkpoint and return.

Ctrl-C, and `timeout` / a job scheduler's SIGTERM, reach the whole process group: the trainer's
helper processes (data-loader workers, the verifier pool) call `ignore_stop_signals` so they
keep serving the step in flight while the trainer finishes it, saves and stops; they exit when
the trainer shuts them down. If the trainer dies without shutting them down (`kill -9`, an OOM
kill), nothing closes a verifier worker's queue: `die_with_parent` has the kernel kill it
(Linux `PR_SET_PDEATHSIG`); data-loader workers have torch's own parent watchdog.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
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


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """In a helper process: SIGKILL it when its parent dies (SIGKILL: it ignores SIGTERM). Linux
    only (elsewhere a no-op). A parent that died before this ran already left it orphaned: exit."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d)", ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(1)


def helper_init(parent_pid: int) -> None:
    """A pool initializer (initargs=(os.getpid(),)): leave the stop signals to the trainer and
    die with it."""
    ignore_stop_signals()
    die_with_parent(parent_pid)
