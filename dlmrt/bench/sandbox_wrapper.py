"""The trusted wrapper the HumanEval sandbox runs (`python -I sandbox_wrapper.py ...`).

Standard library only, no dlmrt import: it runs in a fresh interpreter inside the sandbox.

    sandbox_wrapper.py MODE REPORT_FD NPROC DISK_MB UID WORKDIR PROGRAM [ENTRY]

1. Reads the pass secret from stdin (a pipe the harness writes and closes), then points fd 0 at
   /dev/null: the secret is never in the program's text, a file, the environment or argv. Reads
   PROGRAM's text (the host's file is out of sight once step 2 has run).
2. MODE "namespaces" (inside `unshare [--user --map-root-user] --mount --ipc --uts ...`):
   pivots into a fresh root (sandbox_root.py: the system directories and the interpreter
   read-only, WORKDIR a tmpfs of DISK_MB MiB, /proc/sys read-only), drops to UID (a number: the
   harness is root; "-": keep the user), then moves into a nested user + mount namespace where
   every mount is locked. MODE "fallback": empties the capability bounding set, drops to UID,
   keeps the interpreter's library importable through descriptors opened before the drop, and
   installs an audit hook refusing sockets (the `socket` and raw `_socket` modules alike) and
   ctypes.
3. Both modes: a seccomp filter makes `socket()` fail with EACCES for every address family, in
   this process and everything it starts (`socketpair()` stays: it reaches nothing). Unix-domain
   sockets on the file system (`connect` to /run/..., `curl --unix-socket`) and, in the fallback,
   the network from a child process, are therefore out of reach too. The same filter refuses
   `setsid()` (EPERM): every process the program starts stays in the run's session. In the
   fallback it also refuses SysV IPC and every signal but 0 (the judge shares the PID space).
4. Sets RLIMIT_NPROC to NPROC (inside a user namespace it counts that namespace's processes only).
5. Runs PROGRAM as `__main__`; only when it returns normally does it write the secret to
   REPORT_FD and `os._exit(0)`. An early `sys.exit`, `os._exit` or exception never reports.
   With ENTRY (a HumanEval judge, `dlmrt/bench/judge.py`): no secret; PROGRAM (the candidate's
   module, no tests) is run, then the function ENTRY is served: each line on stdin is a call
   (arguments as `value_codec` data), each answer one line on REPORT_FD ("ok " + the value, or
   "error " + the exception). The tests run in the judge, on values; nothing here decides a pass.

Residual risk (without ENTRY): the program runs in this process, so code that digs through the interpreter's own
memory (frames, gc, ctypes where allowed, /proc/self/mem) can still find the secret; the harness
treats a pass as "ran to the end", not as proof against an adversary. Use a container for that.
"""

from __future__ import annotations

import os
import platform
import resource
import struct
import sys

BLOCKED_EVENTS = ("socket.", "ctypes.dlopen")
NO_NETWORK = "network access is disabled in the dlmrt HumanEval sandbox"
SETUP_FAILED = 3  # exit status: the sandbox could not be set up (the program never ran)
# seccomp: the native audit arch and system call numbers (a foreign arch, e.g. a 32-bit program,
# gets EPERM for every system call; x86-64's x32 numbers are refused the same way)
SYSCALLS = {
    "x86_64": (0xC000003E, dict(socket=41, setsid=112, shmget=29, semget=64, msgget=68)),
    "aarch64": (0xC00000B7, dict(socket=198, setsid=157, shmget=194, semget=190, msgget=186)),
}
# the signal-sending calls and the index of their signal argument (the fallback's filter)
SIGNALS = {
    "x86_64": {62: 1, 200: 1, 234: 2, 129: 1, 297: 2, 424: 1},
    "aarch64": {129: 1, 130: 1, 131: 2, 138: 1, 240: 2, 424: 1},
}
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
CAP_VERSION_3 = 0x20080522
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EACCES, EPERM = 13, 1


def read_secret() -> bytes:
    chunks = []
    while chunk := os.read(0, 4096):
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the program reads an empty stdin, not the (drained) secret pipe
    os.close(null)
    return b"".join(chunks)


def _seccomp_program(fallback: bool) -> bytes:
    """Classic BPF over seccomp_data (nr at 0, arch at 4, argument i's low word at 16 + 8 i):
    socket() -> EACCES, setsid() -> EPERM (every process stays in the run's session, so the
    fallback's session sweep finds a daemon whatever its environment). The fallback also refuses
    SysV IPC (shmget, semget, msgget: no IPC namespace there) and every signal but 0 sent by
    kill, tkill, tgkill, rt_(tg)sigqueueinfo or pidfd_send_signal (no PID namespace: the judge
    would be in reach). All else allowed."""
    arch, nr = SYSCALLS[platform.machine()]
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    code = [
        (ld, 0, 0, 4),  # A = arch
        (jeq, 1, 0, arch),  # native: skip the next
        (ret, 0, 0, RET_ERRNO | EPERM),
        (ld, 0, 0, 0),  # A = syscall number
        (0x35, 0, 1, 0x40000000),  # BPF_JGE: x32 numbers -> EPERM
        (ret, 0, 0, RET_ERRNO | EPERM),
    ]
    refused = {nr["socket"]: EACCES, nr["setsid"]: EPERM}
    if fallback:
        refused.update({nr[name]: EPERM for name in ("shmget", "semget", "msgget")})
    for number, errno in refused.items():
        code += [(jeq, 0, 1, number), (ret, 0, 0, RET_ERRNO | errno)]
    for number, index in (SIGNALS[platform.machine()] if fallback else {}).items():
        code += [
            (jeq, 0, 4, number),
            (ld, 0, 0, 16 + 8 * index),  # A = the signal (the int's low word)
            (jeq, 0, 1, 0),  # signal 0 (does it exist?) is allowed
            (ret, 0, 0, RET_ALLOW),
            (ret, 0, 0, RET_ERRNO | EPERM),
        ]
    code.append((ret, 0, 0, RET_ALLOW))
    return b"".join(struct.pack("HBBI", *insn) for insn in code)


def install_filter(fallback: bool) -> None:
    """Install the seccomp filter (no_new_privs first: allowed without any capability)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    program = ctypes.create_string_buffer(_seccomp_program(fallback))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(program.raw) // 8, ctypes.addressof(program))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {os.strerror(err)}")


def drop_user(uid: int | None) -> None:
    """Become `uid` (group `uid`, no supplementary groups) when one is given: the harness is root
    and the program must not be. A uid change from 0 clears every capability."""
    if uid is None:
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise OSError(f"could not drop to uid {uid}")


def drop_capabilities(uid: int | None) -> None:
    """Fallback: the bounding and ambient sets emptied (while CAP_SETPCAP lasts), the user
    dropped to `uid` (root only), then no capability left at all, so a program run by root
    cannot read the harness's /proc files (the harness is non-dumpable: sandbox.py) nor regain
    capabilities through exec. Not root: the bounding-set drops fail, nothing to drop there."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    drop_user(uid)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def _imports_by_descriptor() -> dict[str, int]:
    """A descriptor on each directory of sys.path, opened while this process can still reach it
    (root, before the fallback's drop: the interpreter may live under /root)."""
    fds = {}
    for entry in sys.path:
        try:
            fds[entry] = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            pass  # a missing zip, say
    return fds


def _reach_imports(fds: dict[str, int]) -> None:
    """sys.path entries the dropped user cannot reach are read through their descriptors
    (/proc/self/fd/N resolves without walking the path's parents)."""
    for i, entry in enumerate(sys.path):
        if entry in fds and not os.access(entry, os.R_OK | os.X_OK):
            sys.path[i] = f"/proc/self/fd/{fds[entry]}"


def _audit(event: str, args: tuple) -> None:
    if event.startswith(BLOCKED_EVENTS):
        raise OSError(NO_NETWORK + f" ({event})")


def setup(mode: str, nproc: int, disk_mb: int, uid: int | None, workdir: str, text: str) -> None:
    """The isolation of `mode`, then RLIMIT_NPROC; the program runs as `uid` (None: as is)."""
    if mode not in ("namespaces", "fallback"):
        raise ValueError(f"mode: expected 'namespaces' or 'fallback', got {mode!r}")
    if mode == "namespaces":
        view = _load("sandbox_root.py", "dlmrt_sandbox_root")
        owner = (uid, uid) if uid is not None else (0, 0)
        view.build(workdir, text, disk_mb, owner)
        drop_user(uid)
        view.lock()
        if os.access("/", os.W_OK) or not os.access(".", os.W_OK):
            raise OSError(f"read-only view not in effect (/ writable or {workdir} not)")
    else:
        fds = _imports_by_descriptor() if uid is not None else {}
        drop_capabilities(uid)
        _reach_imports(fds)
    install_filter(fallback=mode == "fallback")  # before the audit hook (it refuses ctypes)
    if mode == "fallback":
        sys.addaudithook(_audit)  # cannot be removed; raw `_socket` raises the same events
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _load(file: str, name: str):
    """A module of dlmrt/bench by path (`-I` puts no directory of ours on sys.path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), file)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lines(fd: int):
    """Lines read from fd with os.read (the program may replace sys.stdin), until EOF."""
    buf = b""
    while chunk := os.read(fd, 1 << 16):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line


def serve(code, namespace: dict, entry: str, report_fd: int, codec) -> None:
    """Run the candidate's module, then answer calls of `entry` until stdin closes."""

    def answer(kind: str, text: str) -> None:
        os.write(report_fd, f"{kind} {text}\n".encode())

    requests = os.dup(0)  # the program reads an empty stdin, not the judge's calls
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        exec(code, namespace)
        fn = namespace[entry]
        if not callable(fn):
            raise TypeError(f"{entry} is not callable")
    except BaseException as e:  # noqa: BLE001 (SystemExit too: the module never became ready)
        answer("error", repr(f"{type(e).__name__}: {e}"))
        os._exit(1)
    answer("ready", "")
    for line in _lines(requests):
        try:
            args, kwargs = codec.decode(line)
            answer("ok", codec.encode(fn(*args, **kwargs)))
        except BaseException as e:  # noqa: BLE001 (the judge decides what an error means)
            answer("error", repr(f"{type(e).__name__}: {str(e)[:200]}"))
    os._exit(0)


def main(argv: list[str]) -> None:
    mode, report_fd, nproc, disk_mb, uid, workdir, program, *entry = argv
    secret = read_secret() if not entry else b""
    codec = _load("value_codec.py", "dlmrt_value_codec") if entry else None
    try:
        with open(program, encoding="utf-8") as f:
            text = f.read()  # before setup: in the namespaces the host's file is out of sight
        setup(mode, int(nproc), int(disk_mb), None if uid == "-" else int(uid), workdir, text)
        code = compile(text, program, "exec")
    except (OSError, ValueError, SyntaxError) as e:
        print(f"dlmrt sandbox: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(SETUP_FAILED if not isinstance(e, SyntaxError) else 1)
    namespace = {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__}
    if entry:
        serve(code, namespace, entry[0], int(report_fd), codec)
    exec(code, namespace)  # an exception or SystemExit leaves without reporting
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # the program may have closed or replaced it
            pass
    os.write(int(report_fd), secret)
    os._exit(0)  # no atexit handlers or lingering threads of the program after the report


if __name__ == "__main__":
    main(sys.argv[1:])
