"""A sandboxed run's directory on the host: made private, removed whatever the program left in it.

The program controls what is below the directory (in the fallback mode; in the namespace mode it
wrote to a tmpfs the host never sees). `remove` therefore walks iteratively (a tree thousands of
directories deep neither recurses nor builds a path longer than one name), only through
descriptors (a link is removed, never followed), and makes a directory the program locked
(mode 000) writable before emptying it. A directory that moved under the walk is an error, not a
place to continue in.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("dlmrt")
DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make(prefix: str = "dlmrt-he-") -> Path:
    """A new private (mode 700) directory under the system's temporary directory."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def remove(path: Path) -> None:
    """Remove `path` and everything below it; OSError when that fails (what is left stays)."""
    fd = _open(path, None)
    seen = [_identity(fd)]  # the directories from `path` down to the current one
    names: list[str] = []  # the names walked down through
    try:
        while True:
            sub = _empty_but_one(fd)
            if sub is not None:
                child = _open(sub, fd)
                os.close(fd)
                fd = child
                seen.append(_identity(fd))
                names.append(sub)
                continue
            if not names:
                break
            parent = os.open("..", DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _identity(fd) != seen[-2]:
                raise OSError(f"{path}: a directory below it moved while it was removed")
            seen.pop()
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def discard(path: Path) -> str:
    """`remove(path)`, an error turned into its reason ("" when none), logged with the path."""
    try:
        remove(path)
    except OSError as e:
        log.warning("HumanEval sandbox: could not remove the run directory %s: %s", path, e)
        return f"the run directory could not be removed: {e}"[:300]
    return ""


def _open(name: str | Path, dir_fd: int | None) -> int:
    """A descriptor on directory `name` (relative to `dir_fd`), made writable by us first."""
    try:
        fd = os.open(name, DIRECTORY, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory (never a link: scandir said so)
        fd = os.open(name, DIRECTORY, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o700)  # entries of a read-only directory cannot be unlinked
    except PermissionError:
        pass  # not ours (root removes anyway)
    return fd


def _empty_but_one(fd: int) -> str | None:
    """Unlink every entry of directory `fd` that is not a directory; one subdirectory's name,
    or None when none is left."""
    sub = None
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                sub = sub or entry.name
            else:
                os.unlink(entry.name, dir_fd=fd)
    return sub


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino
