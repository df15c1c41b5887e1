"""The file system the namespace mode's candidate sees: a fresh root, built inside the sandbox.

Standard library only, no dlmrt import: the wrapper (sandbox_wrapper.py) loads this file by path,
inside `unshare --mount ...`, while it still holds the mount namespace's capabilities. `build()`:

- the new root is an empty tmpfs; into it, read-only, only what Python needs: /usr, /bin, /sbin,
  /lib*, /etc and the interpreter's prefix. Everything else of the host (home directories,
  /root, /work, /tmp, data sets, the virtual environment with its packages) does not exist inside;
  the interpreter's own site-packages directories are covered by an empty read-only tmpfs;
- /dev is a small tmpfs holding binds of null, zero, full, random and urandom, plus /dev/shm (a
  tmpfs of SHM_MB);
- /proc is the run's PID namespace's proc; /proc/sys and /proc/sysrq-trigger are read-only binds;
- the run directory (the host's path, so `__file__` reads the same) is a tmpfs of `disk_mb` MiB and
  INODES inodes, owned by the candidate: the disk bound of the run; it vanishes with the mount
  namespace, so the host never walks what the candidate left there;
- after pivot_root every mount but the run directory, /dev/shm and /proc is remounted read-only.
`lock()` then moves into a nested user + mount namespace, where every mount arrives locked: a
candidate with every capability there can neither remount one writable nor unmount a mask
(mount_namespaces(7)).
"""

from __future__ import annotations

import ctypes
import os
import platform
import site
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
MS_NOSYMFOLLOW, MNT_DETACH = 256, 2
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
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
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SHM_MB, INODES = 64, 16384  # /dev/shm's size; the run directory's inodes
PSEUDO = ("/sys",)  # kernel file systems: a refused remount there is tolerated


class Mounts:
    """mount(2), umount2(2) and pivot_root(2) through libc, raising OSError with the target."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data=None):
        args = [None if s is None else s.encode() for s in (source, target, fstype, data)]
        self._check(self.libc.mount(args[0], args[1], args[2], flags, args[3]), f"mount {target}")

    def try_mount(self, source: str | None, target: str, flags: int) -> int:
        src = None if source is None else source.encode()
        if self.libc.mount(src, target.encode(), None, flags, None) == 0:
            return 0
        return ctypes.get_errno()

    def pivot_here(self) -> None:
        """The current directory becomes / and the old root is detached (pivot_root(".", "."))."""
        nr = SYS_PIVOT_ROOT[platform.machine()]
        self._check(self.libc.syscall(nr, b".", b"."), "pivot_root")
        self._check(self.libc.umount2(b".", MNT_DETACH), "detach the old root")


def _bind(m: Mounts, source: str, target: str, *, tree: bool = True) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    m.mount(source, target, None, MS_BIND | (MS_REC if tree else 0))


def _system(m: Mounts, new: str, prefixes: list[str]) -> None:
    """Bind the system directories and the interpreter's prefixes (a merged-/usr link as a link)."""
    done: list[str] = []
    for path in sorted({*SYSTEM, *prefixes}):
        if not os.path.lexists(path) or any(path.startswith(d + "/") for d in done):
            continue
        if os.path.islink(path) and os.path.dirname(path) == "/":
            os.symlink(os.readlink(path), new + path)
            continue
        _bind(m, os.path.realpath(path), new + path)
        done.append(path)
    for hidden in site.getsitepackages():  # the interpreter's packages (not on `-S`'s sys.path)
        if os.path.isdir(new + hidden):
            m.mount("tmpfs", new + hidden, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")


def _dev_and_proc(m: Mounts, new: str) -> None:
    os.makedirs(new + "/dev")
    m.mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=755")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):  # containers may lack some (full, say)
            _bind(m, "/dev/" + name, f"{new}/dev/{name}", tree=False)
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{new}/dev/{link}")
    os.symlink("/proc/self/fd/1", f"{new}/dev/stdout")
    os.symlink("/proc/self/fd/2", f"{new}/dev/stderr")
    os.makedirs(new + "/dev/shm")
    m.mount("tmpfs", new + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={SHM_MB}m,mode=1777")
    _bind(m, "/proc", new + "/proc")
    for masked in ("/proc/sys", "/proc/sysrq-trigger"):  # own mounts: remounted read-only below
        if os.path.lexists(new + masked):  # a kernel without magic SysRq has no trigger
            m.mount(new + masked, new + masked, None, MS_BIND | MS_REC)


def build(workdir: str, program: str, disk_mb: int, owner: tuple[int, int]) -> None:
    """Pivot into the fresh root; `program` written to `workdir`/program.py there, `workdir` a
    tmpfs of `disk_mb` MiB owned by `owner` (uid, gid as this namespace sees them)."""
    m = Mounts()
    m.mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing of ours reaches the host's mounts
    new = workdir  # the host's run directory is ours: the new root's tmpfs covers it
    m.mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    prefixes = [os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)]
    _system(m, new, prefixes)
    _dev_and_proc(m, new)
    os.makedirs(new + workdir)
    options = f"size={disk_mb}m,nr_inodes={INODES},mode=700,uid={owner[0]},gid={owner[1]}"
    m.mount("tmpfs", new + workdir, "tmpfs", MS_NOSUID | MS_NODEV, options)
    with open(new + workdir + "/program.py", "w", encoding="utf-8") as f:
        f.write(program)
    os.chdir(new)
    m.pivot_here()
    os.chdir("/")
    _read_only(m, writable=(workdir, "/dev/shm", "/proc"))
    os.chdir(workdir)


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


def _read_only(m: Mounts, writable: tuple[str, ...]) -> None:
    """Every mount read-only but exactly the `writable` points (a mount below one is remounted)."""
    for point, flags in _mount_points():
        if point in writable:
            continue
        err = m.try_mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        if err and not point.startswith(PSEUDO):
            raise OSError(err, f"read-only remount of {point}: {os.strerror(err)}")


def lock() -> None:
    """Enter a nested user + mount namespace, uid / gid 0 there mapped to ours: every mount
    arrives locked, read-only ones staying read-only whatever the program's capabilities."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"nested user namespace: {os.strerror(err)}")
    # A process that dropped from root is not dumpable, so its /proc files belong to the host's
    # root, out of reach in the new namespace: dumpable only while the maps are written.
    dumpable = libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
            f.write(text)
    libc.prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0)
