"""Per-run memory and process limits through cgroup v2, where this process may make a cgroup.

A run's cgroup is a child of a base cgroup whose `cgroup.subtree_control` enables `memory` and
`pids`: the directory named by DLMRT_SANDBOX_CGROUP (one delegated to this user, with those
controllers enabled), else the unified hierarchy's root when this process sits there (a root
harness in a container with its own cgroup namespace). `memory.max` bounds the run's memory as a
whole (every process, its tmpfs and /dev/shm pages included), `pids.max` its processes and
threads, `memory.swap.max` is 0. The wrapper joins the cgroup between fork and exec (before any
drop of privileges); `close` kills what is left in it and removes it.

Where no such base exists (cgroup v1, or a v2 leaf we may not split) `create` returns None and the
run is bounded per process only: RLIMIT_AS each, RLIMIT_NPROC processes (sandbox.py says how).
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("dlmrt")
UNIFIED = Path("/sys/fs/cgroup")
BASE_ENV = "DLMRT_SANDBOX_CGROUP"
CONTROLLERS = {"memory", "pids"}


@dataclass
class RunCgroup:
    path: Path

    def join_fd(self) -> int:
        """A descriptor on its cgroup.procs: writing "0" there moves the writer in."""
        return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def close(self) -> None:
        """Kill every process still in it, then remove it (again: a no-op)."""
        if not self.path.exists():
            return
        kill = self.path / "cgroup.kill"  # Linux 5.14+
        try:
            if kill.exists():
                kill.write_text("1")
            for _ in range(100):
                try:
                    self.path.rmdir()
                    return
                except OSError:  # still populated: its processes are being reaped
                    time.sleep(0.01)
            self.path.rmdir()
        except OSError as e:
            log.warning("HumanEval sandbox: could not remove the cgroup %s: %s", self.path, e)


def base() -> Path | None:
    """The cgroup runs are made under, or None (see the module's docstring)."""
    named = os.environ.get(BASE_ENV)
    if named:
        return Path(named)
    if not (UNIFIED / "cgroup.controllers").exists():
        return None  # cgroup v1, or v2 mounted elsewhere (a hybrid's /sys/fs/cgroup/unified)
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    return UNIFIED if "0::/" in own else None


def create(memory_mb: int, pids: int, under: Path | None = None) -> RunCgroup | None:
    """A new cgroup for one run with its limits written, or None where none can be made."""
    parent = under if under is not None else base()
    if parent is None:
        return None
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if not CONTROLLERS <= enabled:
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
        path = parent / f"dlmrt-sandbox-{secrets.token_hex(6)}"
        path.mkdir()
    except OSError as e:
        log.debug("HumanEval sandbox: no cgroup under %s: %s", parent, e)
        return None
    group = RunCgroup(path)
    try:
        (path / "memory.max").write_text(str(memory_mb << 20))
        (path / "pids.max").write_text(str(pids))
        if (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
    except OSError as e:
        log.warning("HumanEval sandbox: could not limit the cgroup %s: %s", path, e)
        group.close()
        return None
    return group
