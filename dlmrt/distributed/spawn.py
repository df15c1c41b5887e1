"""`LLM(DIR, tensor_parallel_size=N)` without torchrun: this process becomes rank 0 and starts ranks
1 .. N-1 itself, as vLLM's single-process API does.

The followers are `python -m dlmrt.tp_follower CONFIG_JSON` processes with torchrun's
variables set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT); each
builds the same `LLM` from the same `EngineConfig` and calls `follow()`, decoding every request
rank 0's `generate` shares (`dlmrt/distributed/requests.py`). This process gets the same variables
as rank 0, then joins the group as under torchrun. At exit rank 0 releases the followers (once,
even if `release_followers()` already did) and waits for them; a follower that died is reported,
not waited on; if rank 0 dies outright (SIGKILL), the followers get SIGTERM (Linux
`PR_SET_PDEATHSIG`). One spawned tensor-parallel `LLM` per process (the process group is global).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import asdict
from typing import Any

log = logging.getLogger("dlmrt")
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
EXIT_WAIT_S = 60.0  # a released follower returns from `follow` and exits within this


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PARENT_VAR = "DLMRT_TP_PARENT"  # rank 0's pid, for the follower's parent-death check


def die_with_parent() -> None:
    """In a follower (Linux): SIGTERM when rank 0 dies, even by SIGKILL, so no follower is left
    waiting for a request that will never come; exits at once if rank 0 is already gone."""
    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(os.environ.get(PARENT_VAR, os.getppid())):
        sys.exit("tensor parallel: rank 0 exited before this follower started")


def spawn_followers(config: Any) -> list[subprocess.Popen]:
    """Start ranks 1 .. N-1 for `config` (an `EngineConfig` with tensor_parallel_size N > 1) and
    make this process rank 0 of the same group (torchrun's variables in `os.environ`)."""
    if os.environ.get("WORLD_SIZE") not in (None, "1"):
        raise RuntimeError("spawn_followers: already inside a launched group")
    size = config.tensor_parallel_size
    common = {"WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    payload = json.dumps(asdict(config))
    procs = []
    for rank in range(1, size):
        env = {
            **os.environ,
            **common,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            PARENT_VAR: str(os.getpid()),
        }
        cmd = [sys.executable, "-m", "dlmrt.tp_follower", payload]
        procs.append(subprocess.Popen(cmd, env=env))
    os.environ.update({**common, "RANK": "0", "LOCAL_RANK": "0"})
    log.info(
        "tensor parallel: started %d follower process(es) on port %s",
        size - 1,
        common["MASTER_PORT"],
    )
    return procs


def release_at_exit(group: Any, procs: list[subprocess.Popen]) -> None:
    """At interpreter exit: release the followers (if all are alive) and wait for them."""
    from dlmrt.distributed import requests

    def release() -> None:
        dead = [p for p in procs if p.poll() is not None]
        if dead:  # a broadcast to a dead rank would wait: end the others instead
            codes = ", ".join(str(p.returncode) for p in dead)
            log.error("tensor parallel: %d follower(s) exited early (codes %s)", len(dead), codes)
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        else:
            requests.stop(group)
        for p in procs:
            try:
                p.wait(timeout=EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()

    atexit.register(release)
