"""Per-run cgroup v2 limits (dlmrt/bench/sandbox_cgroup.py): the limits a run's cgroup gets, the
base it is made under, and (where this machine has a usable cgroup v2) a run whose processes
together outgrow memory.max."""

from __future__ import annotations

import textwrap

import pytest

from dlmrt.bench import sandbox, sandbox_cgroup
from dlmrt.bench.humaneval_runner import run_program


def test_a_run_cgroup_gets_its_limits(tmp_path):
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    group = sandbox_cgroup.create(memory_mb=512, pids=64, under=tmp_path)
    assert group is not None and group.path.parent == tmp_path
    assert (group.path / "memory.max").read_text() == str(512 << 20)
    assert (group.path / "pids.max").read_text() == "64"


def test_no_base_no_cgroup(tmp_path):
    """A directory that is no cgroup (no cgroup.subtree_control): None, nothing made."""
    assert sandbox_cgroup.create(memory_mb=512, pids=64, under=tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_the_base_is_named_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(sandbox_cgroup.BASE_ENV, str(tmp_path))
    assert sandbox_cgroup.base() == tmp_path


@pytest.mark.skipif(
    sandbox_cgroup.base() is None,
    reason="no cgroup v2 with memory and pids this process may split (set DLMRT_SANDBOX_CGROUP)",
)
def test_the_runs_processes_share_one_memory_bound():
    """Three children of 300 MiB each, every one under RLIMIT_AS (512 MiB), together over the
    run's memory.max (512 MiB): one is killed, the run fails."""
    program = textwrap.dedent("""
        import os
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                block = b"x" * (300 << 20)
                import time; time.sleep(2)
                os._exit(0)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        assert codes == [0, 0, 0], codes
    """)
    if sandbox.isolation() is not sandbox.NAMESPACES:
        pytest.skip("the bound is checked under the namespaces")
    result = run_program(program, timeout_s=20, memory_mb=512)
    assert result.status == "failed", result


def test_a_failing_join_releases_the_cgroup(monkeypatch, tmp_path):
    """The run's cgroup is closed when opening its join descriptor fails (nothing started)."""
    closed = []

    class Group:
        def join_fd(self) -> int:
            raise OSError("cgroup.procs: permission denied")

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(sandbox_cgroup, "create", lambda *a: Group())
    (tmp_path / "program.py").write_text("pass\n")
    with pytest.raises(OSError, match="permission denied"):
        with sandbox.start(tmp_path, sandbox.FALLBACK, sandbox.Limits(2, 256, 16)):
            pytest.fail("started without its cgroup")
    assert closed == [True]
