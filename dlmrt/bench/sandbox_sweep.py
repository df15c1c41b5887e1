"""The fallback's sweep: without a PID namespace, a run's processes are found by their uid and
session (setsid is refused, so none leaves it) or the marker in their environment, and killed."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def kill_stragglers(session: int, tag: bytes, uid: int) -> int:
    """SIGKILL the processes of `uid` in `session` or whose environment holds the entry `tag`;
    how many."""
    killed = 0
    for pid in own_pids(uid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] == "Z":
                continue  # already dead, waiting for its parent to reap it
            sid = int(stat[3])
            marked = tag in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
        if sid == session or marked:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def own_pids(uid: int) -> list[int]:
    """The processes whose real uid is `uid`, this one left out. From /proc/PID/status, not the
    directory's owner: a process that dropped from root is not dumpable, and some kernels show
    such a process's directory as root's."""
    me, pids = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="utf-8") as f:
                real = next(line.split()[1] for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration, IndexError):
            continue  # gone
        if int(real) == uid:
            pids.append(int(entry.name))
    return pids


def user_tasks(uid: int) -> int:
    """Threads of `uid` now: RLIMIT_NPROC outside a user namespace counts all of them."""
    total = 0
    for pid in own_pids(uid) + ([os.getpid()] if uid == os.getuid() else []):
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return total
