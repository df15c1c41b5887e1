"""The ORL trainer's verifier workers die with it: a `kill -9` of the process that owns the
`VerifierPool` leaves no worker behind (they ignore SIGTERM, so nothing else would end them;
`dlmrt/train/stop_flag.py: die_with_parent`). CPU, Linux."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")

OWNER = """
import os, sys, time
from dlmrt.train.orl.rollout import VerifierPool
pool = VerifierPool("arithmetic", None, 2)
for f in [pool.pool.submit(time.sleep, 0.3) for _ in range(4)]:  # both workers started
    f.result()
pids = set(pool.pool._processes)
print(" ".join(map(str, sorted(pids))), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_9_of_the_owner_leaves_no_verifier_worker():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "a verifier worker outlived its trainer"
    finally:
        if owner.poll() is None:
            owner.kill()
