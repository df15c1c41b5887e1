"""HumanEval verdicts from a process the candidate cannot reach.

The candidate's code (the prompt with its completion, no tests) runs in the sandbox
(`sandbox.start` with an entry point: `sandbox_wrapper.serve`). The tests run here, in the judge:
the prompt (its helpers, e.g. `poly` for `find_zero`) and the test code are executed in a fresh
namespace and `check(candidate)` is called with a proxy that sends each call's arguments to the
sandbox and gets the return value back as data (`value_codec`: plain built-in values, types
checked exactly). The pass is "check() returned", decided in this process:
- nothing secret lives in the candidate's process, so reading the caller's frames or
  /proc/self/mem finds nothing to forge;
- an object whose `__eq__` is always true (or any non-data object) cannot be sent back, so the
  call fails instead of comparing equal;
- exiting early, printing, or writing to any file descriptor cannot make check() return.
The prompt and tests are the data set's (trusted) code; they run under the wall deadline only at
the candidate's calls. Decoding an answer runs outside the deadline: the codec refuses what would
take more than about linear time in the answer's size (`value_codec`: crafted hash collisions). The global `random` state is restored afterwards (tests may seed it).
The judge trusts no file of the run: the candidate's stderr is read through the judge's own
descriptor on an unnamed file (a bounded tail), no path in the run's directory is ever opened,
and the directory is removed without recursion or following links (run_dir.py).
"""

from __future__ import annotations

import os
import random
import select
import time
from dataclasses import dataclass
from pathlib import Path

from dlmrt.bench import run_dir, sandbox
from dlmrt.bench.value_codec import CodecError, decode, encode


class CandidateError(RuntimeError):
    """The candidate raised, returned something that is not data, or died."""


class CandidateEnded(CandidateError):
    """Its process ended (a syntax error, an exit, a limit): its stderr says why."""


class Deadline(BaseException):
    """The wall deadline passed while waiting for the candidate. A BaseException: the test code
    that calls the candidate (`except Exception:` around a call) cannot swallow it."""


@dataclass
class Channel:
    """Calls into the sandboxed candidate: requests on its stdin, answers on the report pipe."""

    running: sandbox.Running
    deadline: float
    buffer: bytes = b""

    def _line(self) -> tuple[str, str]:
        while b"\n" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.running.report_fd], [], [], left)[0]:
                raise Deadline
            chunk = os.read(self.running.report_fd, 1 << 16)
            if not chunk:
                raise CandidateEnded("the candidate's process ended")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        kind, _, text = line.decode("utf-8", errors="replace").partition(" ")
        return kind, text

    def ready(self) -> None:
        kind, text = self._line()
        if kind != "ready":
            raise CandidateError(f"the candidate's module failed: {text[:300]}")

    def _send(self, data: bytes) -> None:
        """`data` onto the candidate's stdin under the deadline: a candidate that stops reading
        (its pipe shrunk, or full) would block a plain write forever."""
        fd = self.running.proc.stdin.fileno()
        os.set_blocking(fd, False)
        rest = memoryview(data)
        while rest:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise Deadline
            try:
                rest = rest[os.write(fd, rest) :]
            except BlockingIOError:  # room for less than one write's atomic minimum: wait again
                continue
            except OSError as e:  # BrokenPipeError
                raise CandidateEnded("the candidate's process ended") from e

    def call(self, *args: object, **kwargs: object) -> object:
        self._send((encode([list(args), kwargs]) + "\n").encode())
        kind, text = self._line()
        if kind != "ok":
            raise CandidateError(f"the candidate raised {text[:300]}")
        try:
            return decode(text)
        except CodecError as e:
            raise CandidateError(f"the candidate's value: {e}") from None


@dataclass(frozen=True)
class Verdict:
    status: str  # "passed" | "failed" | "timeout"
    returncode: int | None
    elapsed_s: float
    why: str  # the failure's first line, or the candidate's stderr tail


def run_check(
    module: str, prompt: str, test: str, entry_point: str, timeout_s: float, limits: sandbox.Limits
) -> Verdict:
    """`module` (prompt + completion) served from the sandbox; `test`'s check() run here. The
    run's directory is removed afterwards; when that fails the verdict is "failed" (the reason
    says so) and the directory is logged, never an exception out of here."""
    workdir = run_dir.make()
    try:
        verdict = _judge(workdir, module, prompt, test, entry_point, timeout_s, limits)
    finally:
        left = run_dir.discard(workdir)
    if left:
        return Verdict("failed", verdict.returncode, verdict.elapsed_s, left)
    return verdict


def _judge(
    workdir: Path,
    module: str,
    prompt: str,
    test: str,
    entry_point: str,
    timeout_s: float,
    limits: sandbox.Limits,
) -> Verdict:
    (workdir / "program.py").write_text(module, encoding="utf-8")
    mode = sandbox.isolation()
    state = random.getstate()
    with sandbox.start(workdir, mode, limits, entry=entry_point) as running:
        channel = Channel(running, time.monotonic() + timeout_s)
        status, why = "failed", ""
        try:
            channel.ready()
            scope: dict[str, object] = {"__name__": "__judge__"}
            exec(compile(prompt, "<prompt>", "exec"), scope)
            exec(compile(test, "<test>", "exec"), scope)
            scope["check"](channel.call)  # type: ignore[operator]
            status = "passed"
        except Deadline:
            status = "timeout"
        except CandidateEnded:
            pass  # why: its stderr
        except Exception as e:  # noqa: BLE001 (a failed assert, the candidate's error, ...)
            why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        finally:
            random.setstate(state)
        sandbox.finish(running, mode)
        code = running.proc.returncode
        elapsed, cpu = running.usage()
        why = why or running.stderr_tail()
    if status == "failed" and sandbox.out_of_cpu(code, cpu, limits.cpu_s):
        status = "timeout"
    return Verdict(status, code, elapsed, why)
