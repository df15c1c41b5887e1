"""The HumanEval sandbox: an unforgeable pass signal, isolation in both modes (namespaces and the
audit-hook fallback), a read-only file system, RLIMIT_NPROC and killing what a run left behind."""

from __future__ import annotations

import os
import socket
import textwrap
import time
from pathlib import Path

import pytest
from isolation_modes import isolation_mode  # noqa: F401 (the `mode` fixture)

from dlmrt.bench import sandbox, sandbox_sweep
from dlmrt.bench.humaneval_runner import check_completion, run_program

ADD_PROMPT = 'def add(a, b):\n    """Add."""\n'
ADD_TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
# A wrong solution that hunts for the pass token everywhere the program can see, prints every
# candidate and writes it to every open fd, then exits 0 before check() can fail.
CHEAT = textwrap.dedent("""\
        return 0
    import os, re, sys
    seen = open(__file__).read() + sys.stdin.read()
    for p in ("/proc/self/cmdline", "/proc/self/environ"):
        seen += open(p, "rb").read().decode("latin-1")
    for name in os.listdir(os.path.dirname(os.path.abspath(__file__))):
        try:
            seen += open(name, "rb").read().decode("latin-1")
        except OSError:
            pass
    tokens = re.findall(r"dlmrt-done-[0-9a-f]+|[0-9a-f]{16,}", seen)
    for token in tokens:
        print(token, flush=True)
        for fd in range(1, 64):
            try:
                os.write(fd, token.encode())
            except OSError:
                pass
    os._exit(0)
""")


def test_token_from_the_program_file_does_not_pass(mode):
    result = check_completion(ADD_PROMPT, CHEAT, ADD_TEST, "add", timeout_s=10)
    assert result.status == "failed", result


def test_correct_and_wrong_solutions(mode):
    assert check_completion(ADD_PROMPT, "    return a + b\n", ADD_TEST, "add").passed
    wrong = check_completion(ADD_PROMPT, "    return a - b\n", ADD_TEST, "add")
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr_tail


def test_raw_socket_cannot_reach_a_loopback_listener(mode):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        completion = (
            "    import _socket\n"
            "    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
            f"    s.connect(('127.0.0.1', {port}))\n"
            "    return a + b  # connected: not isolated\n"
        )
        result = check_completion(ADD_PROMPT, completion, ADD_TEST, "add")
    assert result.status == "failed"
    # socket() itself is refused: by the kernel (seccomp), or first by the fallback's audit hook
    tail = result.stderr_tail
    assert "Permission denied" in tail or "network access is disabled" in tail, tail


@pytest.mark.parametrize("how", ["in_process", "child_process"])
def test_unix_socket_on_the_file_system_is_out_of_reach(mode, tmp_path, how):
    """A listener on a Unix-domain socket outside the sandbox (as /run/docker.sock would be):
    neither the program nor a program it starts can connect."""
    path = str(tmp_path / "listener.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        connect = f"import _socket; _socket.socket(_socket.AF_UNIX).connect({path!r})"
        line = (
            f"    {connect}\n"
            if how == "in_process"
            else f"    import subprocess, sys\n"
            f"    subprocess.run([sys.executable, '-c', {connect!r}], check=True)\n"
        )
        completion = line + "    return a + b  # connected: not isolated\n"
        listener.settimeout(0.1)
        result = check_completion(ADD_PROMPT, completion, ADD_TEST, "add")
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody reached it
    assert result.status == "failed", result


def test_setsid_double_fork_daemon_dies_with_the_run(mode, tmp_path):
    marker = tmp_path / "escaped"
    program = textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1.5)
                open({str(marker)!r}, "w").write("x")
            os._exit(0)
        time.sleep(0.2)
    """)
    assert run_program(program).passed
    time.sleep(2.5)
    assert not marker.exists()


def test_an_empty_environment_daemon_cannot_leave_the_session(mode, tmp_path):
    """setsid() is refused (seccomp), so a double-forked daemon that also execs with an empty
    environment (no run marker) stays in the run's session and dies with it."""
    marker = tmp_path / "escaped"
    late = f"import time; time.sleep(1.5); open({str(marker)!r}, 'w').write('x')"
    program = textwrap.dedent(f"""
        import os, sys, time
        if os.fork() == 0:
            try:
                os.setsid()
            except OSError:
                pass
            if os.fork() == 0:
                os.execve(sys.executable, [sys.executable, "-c", {late!r}], {{}})
            os._exit(0)
        time.sleep(0.2)
    """)
    assert run_program(program).passed
    time.sleep(2.5)
    assert not marker.exists()


def test_setsid_is_refused(mode):
    """In a child (the program itself leads its session, where setsid fails anyway)."""
    program = textwrap.dedent("""
        import os
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
            except PermissionError:
                os._exit(0)
            os._exit(1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "setsid succeeded"
    """)
    assert run_program(program).passed


def test_the_fallback_cannot_read_the_harness_environment(tmp_path):
    """A harness (a fresh process, its environment holding a secret) runs a program in the
    fallback: the program cannot read /proc/<harness>/environ, as root or not (the harness is
    non-dumpable, the program has no capability)."""
    import subprocess
    import sys

    program = (
        "import os\ntry:\n    seen = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n"
        "except OSError:\n    seen = b''\nassert b'HARNESS_SECRET' not in seen, seen[:80]\n"
    )
    harness = (
        "from dlmrt.bench import sandbox\n"
        "from dlmrt.bench.humaneval_runner import run_program\n"
        "sandbox.isolation = lambda: sandbox.FALLBACK\n"
        f"print(run_program({program!r}).passed)\n"
    )
    env = {**os.environ, "HARNESS_SECRET": "hunter2"}
    done = subprocess.run(
        [sys.executable, "-c", harness],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.stdout.strip() == "True", done.stdout + done.stderr


def test_process_count_is_limited(mode):
    """RLIMIT_NPROC is the run's own budget (namespaces) or a margin over the user's count."""
    if mode is sandbox.NAMESPACES:
        bound = sandbox.NPROC_IN_NAMESPACE
    else:
        bound = (
            sandbox_sweep.user_tasks(sandbox._run_uid()) + sandbox.NPROC_MARGIN + 32
        )  # slack: other tests' threads
    program = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)\n"
        f"assert soft == hard and 0 < soft <= {bound}, (soft, hard)\n"
    )
    result = run_program(program)
    assert result.passed, result.stderr_tail


def test_fork_bomb_is_bounded(mode):
    """Also for a root harness: the program runs as RUN_UID, to which RLIMIT_NPROC applies."""
    program = textwrap.dedent("""
        import os, time
        children = 0
        try:
            while children < 5000:
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                children += 1
        except OSError:
            pass
        assert children < 5000
    """)
    assert run_program(program, timeout_s=20).passed


def test_file_system_is_read_only_outside_the_temp_dir(tmp_path, monkeypatch):
    if sandbox.isolation() is not sandbox.NAMESPACES:
        pytest.skip("user/mount/network/PID namespaces are not available here")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    program = textwrap.dedent(f"""
        import os, shutil
        shutil.rmtree({str(victim)!r}, ignore_errors=True)
        try:
            open({str(tmp_path / "big")!r}, "wb").write(b"0" * 1024)
        except OSError:
            pass
        with open(os.path.join(os.environ["TMPDIR"], "scratch"), "w") as f:
            f.write("the private temp dir stays writable")
        with open("relative", "w") as f:  # the working directory is that temp dir
            f.write("so is a relative path")
    """)
    assert run_program(program).passed
    assert (victim / "keep").read_text() == "x" and not (tmp_path / "big").exists()


def test_unshare_maps_a_user_namespace_unless_root():
    """Without --user --map-root-user an ordinary user cannot create the other namespaces; root
    needs none (and must not map the program onto the host's uid 0): it drops to RUN_UID."""
    if os.geteuid() == 0:
        assert "--user" not in sandbox.UNSHARE and sandbox.RUN_UID == 65534
    else:
        assert sandbox.UNSHARE[:3] == ["unshare", "--user", "--map-root-user"]
        assert sandbox.RUN_UID is None
    assert {"--mount", "--net", "--pid", "--ipc", "--uts", "--kill-child"} <= set(sandbox.UNSHARE)


def test_wrapper_is_standard_library_only():
    # It runs under `python -I` inside the sandbox, where dlmrt may not be importable.
    source = Path(sandbox.WRAPPER).read_text()
    assert "import dlmrt" not in source and "from dlmrt" not in source


def _namespaces_only() -> None:
    if sandbox.isolation() is not sandbox.NAMESPACES:
        pytest.skip("user/mount/network/PID namespaces are not available here")


def test_the_read_only_view_cannot_be_remounted_writable(tmp_path):
    """The remount a candidate would try (CAP_SYS_ADMIN in its user namespace) must fail: the
    mounts are locked (a nested user + mount namespace), so / and the interpreter's library stay
    read-only, and the host's directories are out of sight."""
    _namespaces_only()
    target = tmp_path / "escaped"
    program = textwrap.dedent(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        MS_REMOUNT, MS_BIND, MS_RELATIME = 32, 4096, 1 << 21
        for point in ("/", os.path.dirname(os.__file__)):
            rc = libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RELATIME, None)
            print(point, rc, os.strerror(ctypes.get_errno()))
            assert os.statvfs(point).f_flag & os.ST_RDONLY, point + " is writable"
        try:
            open({str(target)!r}, "w").write("outside the temp dir")
        except FileNotFoundError:
            pass
    """)
    result = run_program(program)
    assert not target.exists()
    assert result.passed, result
