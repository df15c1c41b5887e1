"""HumanEval runner: run `prompt + completion + test + check(entry_point)` in a sandboxed subprocess.

Each program runs in a fresh `python -I` in its own temporary directory and session, with resource
limits set before exec (CPU seconds, address space, file size, no core dumps) and an environment
without proxies. Where `unshare` works (root or user namespaces), it also runs in its own network
namespace (no network at all) and PID namespace (everything it starts dies with it, even after
`setsid`); otherwise the `socket` module is patched by a prologue (bypassable) and a log line says
so. A wall-clock timeout kills the whole process group. A program passes only if it exits 0 AND
prints a random token placed after `check(...)`, so exiting early cannot pass. This is best
effort, not a security boundary: the code runs as the current user and can read the file system
(use a container for untrusted code).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[^\n]*\n(.*?)(?:```|\Z)", re.S | re.I)
PROLOGUE = """import socket as _socket
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the dlmrt HumanEval sandbox")
for _name in ("connect", "connect_ex", "bind", "sendto", "sendmsg"):
    setattr(_socket.socket, _name, _no_network)
_socket.create_connection = _socket.getaddrinfo = _no_network
del _socket, _name
"""
OUTPUT_TAIL = 2000  # characters of stderr kept in a result
UNSHARE = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
log = logging.getLogger("dlmrt")


@functools.cache
def _isolation() -> list[str]:
    """The `unshare` prefix when namespaces can be made here, else [] (logged once)."""
    try:
        ok = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        log.warning(
            "HumanEval sandbox: no network/PID namespace (unshare failed); sockets are only "
            "patched and processes that call setsid() may outlive their program"
        )
    return UNSHARE if ok else []


@dataclass(frozen=True)
class ExecResult:
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None
    elapsed_s: float
    stderr_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def extract_code(completion: str, entry_point: str) -> str:
    """The code in a completion: the fenced block defining `entry_point` (else the first fenced
    block), or the whole completion when it has no fence."""
    blocks = FENCE.findall(completion)
    if not blocks:
        return completion
    defining = [
        b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.M)
    ]
    return (defining or blocks)[0]


def build_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """A full function after the prompt redefines it (helpers in the prompt stay defined); any
    other completion continues the prompt's function body."""
    code = extract_code(completion, entry_point)
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        body = prompt + "\n\n" + code  # a docstring-only body is valid Python
    else:
        body = prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\n"


def _with_sentinel(program: str, token: str) -> str:
    # Printed only if the program runs to the end: a completion that calls sys.exit(0) or
    # os._exit(0) before check() finishes exits 0 without it.
    return f"{program}\nprint({token!r}, flush=True)\n"


def run_program(
    program: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: int | None = None,
    memory_mb: int = 2048,
    file_mb: int = 64,
) -> ExecResult:
    """Run `program`; "passed" iff it runs to its end and exits 0 within `timeout_s` (wall) and
    `cpu_s` (CPU)."""
    cpu = cpu_s if cpu_s is not None else int(timeout_s) + 1
    token = "dlmrt-done-" + secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="dlmrt-he-") as tmp:
        root = Path(tmp)
        (root / "program.py").write_text(
            PROLOGUE + _with_sentinel(program, token), encoding="utf-8"
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp}
        env.update(LANG="C.UTF-8", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            cpu0 = _children_cpu()
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [*_isolation(), sys.executable, "-I", "program.py"],
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group, killed as a whole
                preexec_fn=_limits(cpu, memory_mb, file_mb),
            )
            try:
                code: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                _kill_group(proc)
            elapsed = time.perf_counter() - t0
            cpu_used = _children_cpu() - cpu0  # the program's CPU seconds (reaped descendants)
        tail = (root / "stderr").read_text(encoding="utf-8", errors="replace")[-OUTPUT_TAIL:]
        finished = token in (root / "stdout").read_text(encoding="utf-8", errors="replace")
    # Wall or CPU limit: killed by SIGKILL / SIGXCPU, or (under `unshare`, which does not always
    # pass a child's fatal signal on) the CPU seconds used reached the limit.
    killed = code in (-signal.SIGXCPU, -signal.SIGKILL)
    timed_out = code is None or killed or (code != 0 and cpu_used >= cpu - 0.05)
    status = "timeout" if timed_out else "failed"
    if code == 0 and finished:
        status = "passed"
    return ExecResult(status, code, elapsed, tail)


def check_completion(
    prompt: str, completion: str, test: str, entry_point: str, timeout_s: float = 10.0
) -> ExecResult:
    return run_program(build_program(prompt, completion, test, entry_point), timeout_s=timeout_s)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _limits(cpu_s: int, memory_mb: int, file_mb: int):
    def apply() -> None:  # runs in the child between fork and exec: system calls only
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        size = file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (the program and anything it started), then reap the program."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
