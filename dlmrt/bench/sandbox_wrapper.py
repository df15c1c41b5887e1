"""The trusted wrapper the HumanEval sandbox runs (`python -I sandbox_wrapper.py ...`).

Standard library only, no dlmrt import: it runs in a fresh interpreter inside the sandbox.

    sandbox_wrapper.py MODE REPORT_FD NPROC WORKDIR PROGRAM [ENTRY]

1. Reads the pass secret from stdin (a pipe the harness writes and closes), then points fd 0 at
   /dev/null: the secret is never in the program's text, a file, the environment or argv.
2. MODE "namespaces" (inside `unshare --user --mount ...`): makes every mount read-only except
   WORKDIR (a private bind mount) and /proc, then moves into a nested user + mount namespace:
   mounts that reach a less privileged mount namespace have their read-only flag locked, so the
   program, root with every capability in that namespace, still cannot remount them writable
   (mount_namespaces(7)); /proc stays writable because the nested namespace's uid map is written
   there, and /proc grants nothing a capability in a user namespace could use. MODE "fallback":
   installs an audit hook refusing sockets (the `socket` and raw `_socket` modules alike) and
   ctypes.
3. Both modes: a seccomp filter makes `socket()` fail with EACCES for every address family, in
   this process and everything it starts (`socketpair()` stays: it reaches nothing). Unix-domain
   sockets on the file system (`connect` to /run/..., `curl --unix-socket`) and, in the fallback,
   the network from a child process, are therefore out of reach too. The same filter refuses
   `setsid()` (EPERM): every process the program starts stays in the run's session. The fallback
   also drops every capability (`drop_capabilities`).
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

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 21, 1 << 24
MS_NOSYMFOLLOW = 256
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
# Per-mount flags a user namespace locks: a remount must repeat them or it is refused.
LOCKED = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "nosymfollow": MS_NOSYMFOLLOW,
}
PSEUDO = ("/sys",)  # kernel file systems: a refused remount there is tolerated
WRITABLE = ("/proc",)  # left as mounted: the nested namespace's maps are written there
BLOCKED_EVENTS = ("socket.", "ctypes.dlopen")
NO_NETWORK = "network access is disabled in the dlmrt HumanEval sandbox"
SETUP_FAILED = 3  # exit status: the sandbox could not be set up (the program never ran)
# seccomp: the native audit arch, socket()'s and setsid()'s numbers (a foreign arch, e.g. a 32-bit
# program, gets EPERM for every system call; x86-64's x32 numbers are refused the same way)
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 112), "aarch64": (0xC00000B7, 198, 157)}
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


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, its locked flags) from /proc/self/mountinfo, parents first, deduplicated."""
    seen: dict[str, int] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # "\040" is a space
            opts = fields[5].split(",")
            flags = sum(v for k, v in LOCKED.items() if k in opts)
            if not flags & (MS_NOATIME | MS_RELATIME):
                flags |= MS_STRICTATIME
            seen[point] = flags  # a later (upper) mount at the same point wins
    return sorted(seen.items(), key=lambda item: item[0].count("/"))


def read_only_view(workdir: str) -> None:
    """Every mount read-only, `workdir` a writable bind mount of itself (private mount namespace)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source: str | None, target: str, flags: int) -> int:
        src = None if source is None else source.encode()
        if libc.mount(src, target.encode(), None, flags, None) == 0:
            return 0
        return ctypes.get_errno()

    if err := mount(workdir, workdir, MS_BIND | MS_REC):
        raise OSError(err, f"bind mount of {workdir}: {os.strerror(err)}")
    for point, flags in _mount_points():
        inside = (workdir, *WRITABLE)
        if any(point == d or point.startswith(d + "/") for d in inside):
            continue
        err = mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        if err and not point.startswith(PSEUDO):
            raise OSError(err, f"read-only remount of {point}: {os.strerror(err)}")
    os.chdir(workdir)  # the old cwd is the directory under the bind mount: read-only now
    if os.access("/", os.W_OK) or not os.access(".", os.W_OK):
        raise OSError(f"read-only view not in effect (/ writable or {workdir} not)")
    _lock(libc, ctypes)


def _lock(libc, ctypes) -> None:
    """Enter a nested user + mount namespace (uid / gid 0 mapped to ours): every mount arrives
    there locked, read-only ones staying read-only whatever the program's capabilities."""
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"nested user namespace: {os.strerror(err)}")
    for name, text in (("setgroups", "deny"), ("uid_map", "0 0 1"), ("gid_map", "0 0 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
            f.write(text)


def _seccomp_program() -> bytes:
    """Classic BPF over seccomp_data (nr at 0, arch at 4): socket() -> EACCES, setsid() -> EPERM
    (every process stays in the run's session, so the fallback's session sweep finds a daemon
    whatever its environment), all else allowed."""
    arch, nr_socket, nr_setsid = SECCOMP_ARCH[platform.machine()]
    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    code = [
        (ld, 0, 0, 4),  # A = arch
        (jeq, 1, 0, arch),  # native: skip the next
        (ret, 0, 0, RET_ERRNO | EPERM),
        (ld, 0, 0, 0),  # A = syscall number
        (0x35, 4, 0, 0x40000000),  # BPF_JGE: x32 numbers -> EPERM (4 ahead)
        (jeq, 0, 1, nr_socket),
        (ret, 0, 0, RET_ERRNO | EACCES),
        (jeq, 1, 0, nr_setsid),  # setsid -> EPERM (1 ahead)
        (ret, 0, 0, RET_ALLOW),
        (ret, 0, 0, RET_ERRNO | EPERM),
    ]
    return b"".join(struct.pack("HBBI", *insn) for insn in code)


def no_sockets() -> None:
    """Install the seccomp filter (no_new_privs first: allowed without any capability)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    program = ctypes.create_string_buffer(_seccomp_program())

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(program.raw) // 8, ctypes.addressof(program))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {os.strerror(err)}")


def drop_capabilities() -> None:
    """Fallback: no capability left (bounding set, ambient, effective / permitted / inheritable),
    so a program run as root cannot read the harness's /proc files (the harness is non-dumpable:
    sandbox.py) nor regain capabilities through exec. Without CAP_SETPCAP (not root) the
    bounding-set drops fail: such a process has nothing to drop there."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def _audit(event: str, args: tuple) -> None:
    if event.startswith(BLOCKED_EVENTS):
        raise OSError(NO_NETWORK + f" ({event})")


def setup(mode: str, nproc: int, workdir: str) -> None:
    if mode not in ("namespaces", "fallback"):
        raise ValueError(f"mode: expected 'namespaces' or 'fallback', got {mode!r}")
    if mode == "namespaces":
        read_only_view(workdir)
    else:
        drop_capabilities()
    no_sockets()  # before the audit hook, which refuses the ctypes it needs
    if mode == "fallback":
        sys.addaudithook(_audit)  # cannot be removed; raw `_socket` raises the same events
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _load_codec():
    """dlmrt/bench/value_codec.py by path (`-I` puts no directory of ours on sys.path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "value_codec.py")
    spec = importlib.util.spec_from_file_location("dlmrt_value_codec", path)
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
    mode, report_fd, nproc, workdir, program, *entry = argv
    secret = read_secret() if not entry else b""
    codec = _load_codec() if entry else None
    try:
        setup(mode, int(nproc), workdir)
        with open(program, encoding="utf-8") as f:
            code = compile(f.read(), program, "exec")
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
