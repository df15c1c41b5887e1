"""HumanEval runner: a completion's verdict, and plain programs in the sandbox.

`check_completion`: the candidate's module (prompt + completion) runs sandboxed and serves its
function; the tests run in the judge (`judge.py`) on the values it returns, so nothing the
candidate does in its own process (early exits, reading frames or memory, always-equal objects)
can make it pass. `run_program`: any program, in a fresh `python -I` in its own temporary
directory and session under the sandbox of sandbox.py (namespaces where `unshare` works, else an
audit-hook fallback; resource limits and the socket filter always); it passes only if it exits 0
AND the trusted wrapper reports a secret that is never in the program's text, files or
environment. Best effort, not a security boundary against adversarial code (use a container).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from dlmrt.bench import judge, run_dir, sandbox

MEMORY_MB, FILE_MB = 2048, 64  # the run's address space and largest file
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[^\n]*\n(.*?)(?:```|\Z)", re.S | re.I)


def _isolation() -> list[str]:
    """The namespace prefix the sandbox uses here, or [] in the fallback."""
    return list(sandbox.isolation().prefix)


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


def candidate_module(prompt: str, completion: str, entry_point: str) -> str:
    """The prompt with the completion: a full function after the prompt redefines it (helpers in
    the prompt stay defined); any other completion continues the prompt's function body."""
    code = extract_code(completion, entry_point)
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        return prompt + "\n\n" + code  # a docstring-only body is valid Python
    return prompt + code


def build_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """One program: the candidate's module, the tests, `check(entry_point)`."""
    return (
        f"{candidate_module(prompt, completion, entry_point)}\n\n{test}\n\ncheck({entry_point})\n"
    )


def run_program(
    program: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: int | None = None,
    memory_mb: int = MEMORY_MB,
    file_mb: int = FILE_MB,
) -> ExecResult:
    """Run `program`; "passed" iff it runs to its end and exits 0 within `timeout_s` (wall) and
    `cpu_s` (CPU)."""
    cpu = cpu_s if cpu_s is not None else int(timeout_s) + 1
    workdir = run_dir.make()
    try:
        (workdir / "program.py").write_text(program, encoding="utf-8")
        limits = sandbox.Limits(cpu, memory_mb, file_mb)
        out = sandbox.run(workdir, sandbox.isolation(), timeout_s, limits)
    finally:
        left = run_dir.discard(workdir)
    code = out.returncode
    # wall limit (still running, or killed), or the CPU limit
    timed_out = code in (None, -signal.SIGKILL) or sandbox.out_of_cpu(code, out.cpu_s, cpu)
    status = "timeout" if timed_out else "failed"
    if code == 0 and out.reported:
        status = "passed"
    if left:  # a run that leaves what cannot be removed does not pass
        return ExecResult("failed", code, out.elapsed_s, left)
    return ExecResult(status, code, out.elapsed_s, out.stderr_tail)


def check_completion(
    prompt: str, completion: str, test: str, entry_point: str, timeout_s: float = 10.0
) -> ExecResult:
    """ "passed" iff `test`'s check() returns in the judge, calling the sandboxed completion."""
    limits = sandbox.Limits(int(timeout_s) + 1, MEMORY_MB, FILE_MB)
    module = candidate_module(prompt, completion, entry_point)
    v = judge.run_check(module, prompt, test, entry_point, timeout_s, limits)
    return ExecResult(v.status, v.returncode, v.elapsed_s, v.why)
