"""The third audit's attacks on the HumanEval sandbox, each in every isolation mode where it
applies: host root through /proc/sys, SysV shared memory across runs, a candidate-made `stderr`
(FIFO, /dev/zero, a canary), a 3000-deep tree, killing the judge, reading the host's files, and
filling the disk. Nothing here changes the host: /proc files are opened for append and never
written, a canary file stands in for /etc/shadow, and a leaked segment is removed again."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from isolation_modes import isolation_mode  # noqa: F401 (the `mode` fixture)

import dlmrt
from dlmrt.bench import run_dir, sandbox
from dlmrt.bench.humaneval_runner import check_completion, run_program

ADD_PROMPT = 'def add(a, b):\n    """Add."""\n'
ADD_TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
SEGMENT_BYTES = 151675  # an unusual size: the segment these tests make is found by it


def _module_code(body: str) -> str:
    """A completion: a correct `add`, then `body` run at the module's import."""
    return f"```python\ndef add(a, b):\n    return a + b\n\n{body}\n```\n"


def _harness(mode: sandbox.Mode, body: str, timeout_s: float = 60) -> str:
    """Run `body` in a fresh Python (1 GiB address space, soft) with the sandbox in `mode`; its
    stdout. A hang, a crash or exhausted memory there fails the test, not this process."""
    code = (
        "import resource\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, hard))\n"
        "from dlmrt.bench import sandbox\n"
        f"sandbox.isolation = lambda: sandbox.{mode.name.upper()}\n"
    ) + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        start_new_session=True,  # a candidate that kills the judge's group kills only that
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_proc_sys_cannot_be_opened_for_writing(mode):
    """core_pattern (a root harness: the kernel would run the candidate's script as root),
    kernel.domainname and sysrq-trigger: opened for append only, nothing ever written."""
    program = textwrap.dedent("""
        import os
        opened = []
        for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/domainname",
                     "/proc/sysrq-trigger"):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            except OSError:
                continue
            os.close(fd)
            opened.append(path)
        assert not opened, f"opened for writing: {opened}"
    """)
    if mode is sandbox.NAMESPACES:
        program += "assert os.statvfs('/proc/sys').f_flag & os.ST_RDONLY, '/proc/sys writable'\n"
    result = run_program(program)
    assert result.passed, result.stderr_tail


@pytest.mark.skipif(os.geteuid() != 0, reason="the harness is not root: its program cannot be")
def test_the_program_is_not_the_hosts_root(mode):
    """The program's uid as the parent user namespace sees it (in the namespaces: the host's,
    the nested namespace's parent being the initial one once the wrapper has dropped)."""
    program = textwrap.dedent("""
        import os
        uid = os.getuid()
        for line in open("/proc/self/uid_map"):
            inside, outside, count = map(int, line.split())
            if inside <= uid < inside + count:
                outer = outside + uid - inside
        assert outer == 65534, f"the program runs as uid {outer} outside its namespace"
    """)
    result = run_program(program)
    assert result.passed, result.stderr_tail


def _host_segments() -> list[str]:
    with open("/proc/sysvipc/shm", encoding="ascii") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return [row[1] for row in rows if row[3] == str(SEGMENT_BYTES)]


def test_sysv_shared_memory_does_not_outlive_the_run(mode):
    """Run 1 makes a segment and leaves it; neither the host nor run 2 may find it (an IPC
    namespace, or in the fallback shmget refused)."""
    if not os.path.exists("/usr/bin/ipcmk") or not os.path.exists("/proc/sysvipc/shm"):
        pytest.skip("no ipcmk (util-linux) or /proc/sysvipc here")
    before = set(_host_segments())
    make = f"import subprocess\nsubprocess.run(['ipcmk', '-M', '{SEGMENT_BYTES}', '-p', '0666'])\n"
    run_program(make)
    leaked = sorted(set(_host_segments()) - before)
    for shmid in leaked:
        subprocess.run(["ipcrm", "-m", shmid], check=False)
    look = (
        "rows = open('/proc/sysvipc/shm').read().split(chr(10))[1:]\n"
        f"assert not [r for r in rows if r.split()[3:4] == ['{SEGMENT_BYTES}']], rows\n"
    )
    second = run_program(look)
    assert not leaked, f"a run's segment outlived it on the host: {leaked}"
    assert second.passed, second.stderr_tail


def test_the_run_has_its_own_ipc_and_uts_namespaces():
    if sandbox.isolation() is not sandbox.NAMESPACES:
        pytest.skip("user/mount/network/PID namespaces are not available here")
    program = (
        "import os, sys\n"
        "print(os.readlink('/proc/self/ns/ipc'), os.readlink('/proc/self/ns/uts'), file=sys.stderr)"
    )
    result = run_program(program)
    assert result.passed, result.stderr_tail
    ipc, uts = result.stderr_tail.split()
    assert ipc != os.readlink("/proc/self/ns/ipc") and uts != os.readlink("/proc/self/ns/uts")


@pytest.mark.parametrize("attack", ["fifo", "dev_zero", "canary"])
def test_a_replaced_stderr_neither_hangs_nor_leaks(mode, tmp_path, attack):
    """The candidate replaces `stderr` in its directory, then exits at import (so the verdict
    shows its stderr): the judge reads its own descriptor, never that path."""
    canary = tmp_path / "canary"
    canary.write_text("canary-7f3a91 the host's secret\n")
    canary.chmod(0o600)
    make = {
        "fifo": "os.mkfifo('stderr')",
        "dev_zero": "os.symlink('/dev/zero', 'stderr')",
        "canary": f"os.symlink({str(canary)!r}, 'stderr')",
    }[attack]
    body = f"import os\nif os.path.lexists('stderr'):\n    os.remove('stderr')\n{make}\nos._exit(1)"
    out = _harness(
        mode,
        f"""
        from dlmrt.bench.humaneval_runner import check_completion
        r = check_completion({ADD_PROMPT!r}, {_module_code(body)!r}, {ADD_TEST!r}, "add")
        print("VERDICT", r.status, repr(r.stderr_tail))
        """,
    )
    assert "VERDICT failed" in out and "canary-7f3a91" not in out, out


def test_a_3000_deep_tree_is_removed_and_the_verdict_stands(mode, monkeypatch):
    runs = Path(tempfile.mkdtemp(prefix="dlmrt-test-runs-"))
    runs.chmod(0o755)  # the fallback's program (uid 65534 under root) enters its run directory
    monkeypatch.setattr(tempfile, "tempdir", str(runs))
    body = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')"
    try:
        result = check_completion(ADD_PROMPT, _module_code(body), ADD_TEST, "add")
        assert result.passed, result
        assert list(runs.iterdir()) == []
    finally:
        monkeypatch.undo()
        run_dir.remove(runs)


def test_run_dir_removal_is_iterative_and_follows_no_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    top = tmp_path / "run"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # by descriptor: the path would outgrow PATH_MAX
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    os.mkfifo(top / "fifo")
    (top / "link").symlink_to(outside)
    (top / "d" / "d" / "locked").mkdir()
    (top / "d" / "d" / "locked").chmod(0)
    run_dir.remove(top)
    assert not top.exists() and (outside / "keep").read_text() == "x"


def test_a_cleanup_error_is_a_failed_verdict(monkeypatch):
    def refuse(path: Path) -> None:
        raise OSError(f"{path}: refused")

    monkeypatch.setattr(run_dir, "remove", refuse)
    try:
        result = check_completion(ADD_PROMPT, "    return a + b\n", ADD_TEST, "add")
    finally:
        monkeypatch.undo()
    assert result.status == "failed" and "could not be removed" in result.stderr_tail, result


def test_the_fallback_program_cannot_signal_the_judge():
    """No PID namespace there: kill() of the judge (and of its process group) is refused, for a
    non-root harness by the seccomp filter, for a root one also by the uid drop."""
    body = (
        "import os, signal\n"
        "for target in (os.getppid(), -os.getpgid(os.getppid())):\n"
        "    try:\n"
        "        os.kill(target, signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass"
    )
    out = _harness(
        sandbox.FALLBACK,
        f"""
        from dlmrt.bench.humaneval_runner import check_completion
        r = check_completion({ADD_PROMPT!r}, {_module_code(body)!r}, {ADD_TEST!r}, "add")
        print("ALIVE", r.status)
        """,
    )
    assert "ALIVE passed" in out, out


def test_host_files_are_out_of_sight(tmp_path):
    """A data set on disk, the virtual environment's packages, the project's code and the
    interpreter's own site-packages: absent from the namespaces' view."""
    if sandbox.isolation() is not sandbox.NAMESPACES:
        pytest.skip("user/mount/network/PID namespaces are not available here")
    data = tmp_path / "HumanEval.jsonl"
    data.write_text('{"task_id": "HumanEval/0"}\n')
    data.chmod(0o644)
    hidden = [str(data), sysconfig.get_paths()["purelib"], os.path.dirname(dlmrt.__file__)]
    program = textwrap.dedent(f"""
        import os, site
        seen = [p for p in {hidden!r} if os.path.exists(p)]
        seen += [p for p in site.getsitepackages() if os.path.isdir(p) and os.listdir(p)]
        assert not seen, f"visible: {{seen}}"
    """)
    result = run_program(program)
    assert result.passed, result.stderr_tail


def test_the_run_directory_is_bounded_in_total():
    """Many files, each under the file limit, stop at the run's disk bound (its tmpfs)."""
    if sandbox.isolation() is not sandbox.NAMESPACES:
        pytest.skip("user/mount/network/PID namespaces are not available here")
    program = textwrap.dedent("""
        written = 0
        try:
            for i in range(12):  # 48 MiB asked for, 4 MiB a file
                with open(f"f{i}", "wb") as f:
                    f.write(b"0" * (4 << 20))
                written += 4 << 20
        except OSError:
            pass
        assert written <= 16 << 20, written
    """)
    workdir = run_dir.make()
    try:
        (workdir / "program.py").write_text(program)
        limits = sandbox.Limits(cpu_s=10, memory_mb=2048, file_mb=64, disk_mb=16)
        out = sandbox.run(workdir, sandbox.NAMESPACES, 30.0, limits)
    finally:
        run_dir.remove(workdir)
    assert out.returncode == 0 and out.reported, out.stderr_tail


def test_the_fallback_sweep_finds_a_process_in_another_group():
    """A child that left the run's process group (setpgid, same session) dies with the run, also
    when it runs as RUN_UID without being dumpable (its /proc directory shows as root's)."""
    program = textwrap.dedent("""
        import os, sys, time
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            time.sleep(30)
            os._exit(0)
        print("CHILD", pid, file=sys.stderr, flush=True)
        time.sleep(0.2)
    """)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox, "isolation", lambda: sandbox.FALLBACK)
        result = run_program(program)
    assert result.passed, result.stderr_tail
    pid = int(result.stderr_tail.split()[1])
    for _ in range(40):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the child outlived the run"
