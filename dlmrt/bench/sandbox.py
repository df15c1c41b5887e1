"""The HumanEval sandbox, host side: pick the isolation, spawn the wrapper, collect the outcome.

Two modes, picked once per process by running a probe program (`isolation()`, which logs it):
- "namespaces" (`unshare [--user --map-root-user] --mount --net --pid --ipc --uts ...`): no
  network, its own PID (everything it starts dies with it, even after `setsid`), IPC (SysV
  memory dies with the run) and UTS namespaces, and a fresh root (sandbox_root.py): the system
  directories and the interpreter read-only, the host's other files absent, the run directory a
  size-limited tmpfs, /proc/sys read-only. A root harness builds that view as root, then the
  wrapper drops to RUN_UID (65534): the program never runs as the host's uid 0.
- "fallback" (no usable `unshare`): an audit hook refuses sockets and ctypes, seccomp refuses
  setsid, SysV IPC and signals, the program has no capability left (and runs as RUN_UID under a
  root harness), this process is non-dumpable (its environment is unreadable to the program),
  and every process of the run's session or carrying the run's environment marker is killed at
  the end.
Always: its own session, RLIMIT_CPU / AS / FSIZE / CORE / NPROC, a cgroup v2 with memory.max and
pids.max per run where one can be made (sandbox_cgroup.py), a clean environment, a wall timeout,
stdout to /dev/null and stderr to an unnamed file read through our own descriptor. The pass
secret travels over the wrapper's stdin and comes back over a pipe (sandbox_wrapper.py says what
that does and does not protect).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dlmrt.bench import sandbox_cgroup, sandbox_sweep

log = logging.getLogger("dlmrt")
WRAPPER = Path(__file__).with_name("sandbox_wrapper.py")
# The run's own namespaces; `--user --map-root-user` only where the harness is not root (root
# needs no user namespace to mount, and the wrapper drops to RUN_UID once the view is built).
NAMESPACE_FLAGS = ["--mount", "--net", "--pid", "--ipc", "--uts"]
NAMESPACE_FLAGS += ["--fork", "--kill-child", "--mount-proc"]
AS_ROOT = os.geteuid() == 0
UNSHARE = ["unshare", *([] if AS_ROOT else ["--user", "--map-root-user"]), *NAMESPACE_FLAGS]
RUN_UID = 65534 if AS_ROOT else None  # "nobody": the program never runs as the host's root
NPROC_IN_NAMESPACE = 64  # counts only the run's own processes (a fresh user namespace)
NPROC_MARGIN = 64  # fallback: processes the run may add to the user's current count
MARKER = "DLMRT_SANDBOX_RUN"
OUTPUT_TAIL = 2000  # characters of stderr kept
PR_SET_DUMPABLE = 4


@dataclass(frozen=True)
class Mode:
    name: str  # "namespaces" | "fallback"
    prefix: tuple[str, ...]  # the command the wrapper runs under


NAMESPACES, FALLBACK = Mode("namespaces", tuple(UNSHARE)), Mode("fallback", ())


@dataclass(frozen=True)
class Limits:
    cpu_s: int
    memory_mb: int  # each process's address space (and the run's total under a cgroup)
    file_mb: int  # the largest file
    disk_mb: int = 128  # the run directory (namespaces: its tmpfs)


@dataclass(frozen=True)
class Outcome:
    returncode: int | None  # None: killed at the wall timeout
    elapsed_s: float
    cpu_s: float  # CPU seconds the run used (reaped descendants)
    reported: bool  # the wrapper sent the secret back: the program ran to its end
    stderr_tail: str


@functools.cache
def isolation() -> Mode:
    """NAMESPACES when a probe runs under them here (its fresh root included), else FALLBACK;
    logged once, with what bounds a run's memory and processes."""
    with tempfile.TemporaryDirectory(prefix="dlmrt-he-probe-") as tmp:
        (Path(tmp) / "program.py").write_text("pass\n")
        try:
            outcome = run(Path(tmp), NAMESPACES, 10.0, Limits(5, 2048, 1))
            ok, why = outcome.reported, outcome.stderr_tail.strip()[-300:]
        except OSError as e:  # no unshare binary
            ok, why = False, str(e)
    group = sandbox_cgroup.base()
    bounds = (
        f"memory and processes per run by cgroup v2 under {group}"
        if group is not None
        else "memory per process (RLIMIT_AS) and processes (RLIMIT_NPROC) only: no cgroup v2"
    )
    user = f"uid {RUN_UID}" if RUN_UID is not None else "the harness's user"
    if ok:
        log.info("HumanEval sandbox: namespaces (built-in, unshare), as %s; %s", user, bounds)
        return NAMESPACES
    log.warning(
        "HumanEval sandbox: user/mount/network/PID namespaces are unavailable (%s): fallback "
        "mode, as %s; sockets and ctypes are refused by an audit hook only, signals and SysV "
        "IPC by seccomp, the file system is readable and its writable places writable; %s",
        why or "unshare failed",
        user,
        bounds,
    )
    return FALLBACK


@dataclass
class Running:
    """A started wrapper: `proc` (stdin: a pipe to it), `report_fd` (the read end of its report
    pipe), and the clock and children's CPU at its start."""

    proc: subprocess.Popen
    report_fd: int
    t0: float
    cpu0: float
    marker: str
    stderr: IO[bytes]  # the program's stderr: an unnamed file only this descriptor reaches
    cgroup: sandbox_cgroup.RunCgroup | None = None  # the run's memory and process limits

    def usage(self) -> tuple[float, float]:
        """(wall seconds, CPU seconds of reaped children) since the start."""
        return time.perf_counter() - self.t0, _children_cpu() - self.cpu0

    def stderr_tail(self) -> str:
        """The last OUTPUT_TAIL characters of its stderr, read through our own descriptor (never
        a path the program could have replaced), at most 4 * OUTPUT_TAIL bytes."""
        fd = self.stderr.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, 4 * OUTPUT_TAIL, max(0, size - 4 * OUTPUT_TAIL))
        return data.decode("utf-8", errors="replace")[-OUTPUT_TAIL:]


@contextlib.contextmanager
def start(workdir: Path, mode: Mode, limits: Limits, entry: str | None = None) -> Iterator[Running]:
    """Start the wrapper on `workdir/program.py` under `mode` (stdout to /dev/null, stderr to an
    unnamed file); `entry`: serve that function to a judge (sandbox_wrapper.py) instead of
    running to the end. Leaving the block kills everything the run started."""
    if mode is FALLBACK:
        _not_dumpable()
        if RUN_UID is not None:  # the program's working directory, as the user it runs as
            os.chown(workdir, RUN_UID, RUN_UID)
    marker = secrets.token_hex(8)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir)}
    env.update(TMPDIR=str(workdir), LANG="C.UTF-8", OMP_NUM_THREADS="1")
    env.update(PYTHONDONTWRITEBYTECODE="1", **{MARKER: marker})
    nproc = (
        NPROC_IN_NAMESPACE
        if mode is NAMESPACES
        else sandbox_sweep.user_tasks(_run_uid()) + NPROC_MARGIN
    )
    argv = [*mode.prefix, _interpreter(), "-I", "-S", str(WRAPPER), mode.name]
    read_end, write_end = os.pipe()
    argv += [str(write_end), str(nproc), str(limits.disk_mb), str(RUN_UID or "-")]
    argv += [str(workdir), str(workdir / "program.py"), *([entry] if entry else [])]
    group, join_fd = None, -1
    try:  # from the cgroup on: a failure anywhere below releases what was made
        group = sandbox_cgroup.create(limits.memory_mb, NPROC_IN_NAMESPACE)
        join_fd = group.join_fd() if group is not None else -1
        with tempfile.TemporaryFile() as err:
            cpu0, t0 = _children_cpu(), time.perf_counter()
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
                pass_fds=(write_end,),
                start_new_session=True,  # its own session and process group, killed as a whole
                preexec_fn=_limits(limits, join_fd),
            )
            os.close(write_end)
            write_end = -1
            running = Running(proc, read_end, t0, cpu0, marker, err, group)
            try:
                yield running
            finally:
                finish(running, mode)
    finally:
        os.close(read_end)
        for fd in (write_end, join_fd):
            if fd >= 0:
                os.close(fd)
        if group is not None:
            group.close()


def _interpreter() -> str:
    """The base interpreter (not a virtual environment's link: its packages stay outside)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def _not_dumpable() -> None:
    """Fallback: this process becomes non-dumpable, so its /proc files (its environment, with
    whatever tokens and keys it holds) belong to root and a program without CAP_SYS_PTRACE (the
    wrapper drops every capability) cannot read them. Also off from then on: core dumps of this
    process and ptrace by the same user (gdb, py-spy)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def finish(running: Running, mode: Mode) -> None:
    """Kill and reap everything the run started (again: a no-op)."""
    _kill_run(running.proc, running.marker if mode is FALLBACK else None)
    if running.cgroup is not None:
        running.cgroup.close()


def out_of_cpu(code: int | None, cpu_s: float, limit_s: float) -> bool:
    """The CPU limit ended the run: SIGXCPU, or (under `unshare`, which does not always pass a
    child's fatal signal on) a failing run whose CPU seconds reached the limit."""
    return code == -signal.SIGXCPU or (code != 0 and cpu_s >= limit_s - 0.05)


def run(workdir: Path, mode: Mode, timeout_s: float, limits: Limits) -> Outcome:
    """Run `workdir/program.py` through the wrapper under `mode` to its end; stdout/stderr go to
    files. `reported`: the wrapper sent back the secret it was given (the program returned)."""
    secret = secrets.token_hex(16).encode()
    with start(workdir, mode, limits) as running:
        _send_secret(running.proc, secret)
        try:
            code: int | None = running.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finish(running, mode)
        elapsed, cpu = running.usage()
        report = _read_report(running.report_fd)
        tail = running.stderr_tail()
    return Outcome(code, elapsed, cpu, report == secret, tail)


def _send_secret(proc: subprocess.Popen, secret: bytes) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(secret)
        proc.stdin.close()
    except BrokenPipeError:  # it died before reading: it cannot report either
        pass


def _read_report(fd: int) -> bytes:
    # Every writer is dead by now, but a process that escaped could hold the pipe open: never block.
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 256)
    except BlockingIOError:
        return b""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _limits(limits: Limits, join_fd: int):
    def apply() -> None:  # runs in the child between fork and exec: system calls only
        if join_fd >= 0:
            os.write(join_fd, b"0")  # into the run's cgroup (as the harness's user still)
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        memory = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        size = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _kill_run(proc: subprocess.Popen, marker: str | None) -> None:
    """SIGKILL the run's process group, then (fallback) its session and marked processes; reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if marker is not None:
        for _ in range(20):  # a process may fork while we kill: repeat until none is left
            tag = f"{MARKER}={marker}".encode()
            if not sandbox_sweep.kill_stragglers(proc.pid, tag, _run_uid()):
                break
            time.sleep(0.01)


def _run_uid() -> int:
    return RUN_UID if RUN_UID is not None else os.getuid()
