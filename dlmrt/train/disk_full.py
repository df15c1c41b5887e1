"""DiskFull: a run's write that failed for want of space, said as such and naming the file.

The writers lose both facts: `torch.save` to a path reports a failed write as an internal error
("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), and even when it
writes to a Python file whose write raised it swallows that OSError; safetensors reports a
`SafetensorError` with no path. So `save_torch` writes through a Python file that records the
OSError its write raised, and `writing(path)` turns a no-space error (errno ENOSPC or EDQUOT, on
the error, its cause or context, or the record; or "No space left on device" in a message from
Rust) into `DiskFull` naming `path`; any other error passes unchanged.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded", "StorageFull")


class DiskFull(OSError):
    """No space left to write `filename` (errno ENOSPC)."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(errno.ENOSPC, f"disk full: no space left to write {path}", str(path))

    def __str__(self) -> str:
        return self.strerror


def no_space(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from or during, says the disk is full."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            return True
        if any(text in str(exc) for text in NO_SPACE_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Run a write of `path`; a no-space error becomes `DiskFull(path)`."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if no_space(e):
            raise DiskFull(path) from e
        raise


class _Recorded:
    """A binary file whose write errors are kept (torch replaces them with its own)."""

    def __init__(self, file: Any) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def save_torch(obj: Any, path: Path) -> None:
    """`torch.save(obj, path)`; a full disk raises `DiskFull` (also from the flush at close)."""
    with writing(path), open(path, "wb") as f:
        out = _Recorded(f)
        try:
            torch.save(obj, out)
        except RuntimeError as e:
            if out.error is not None:  # the write's own error, not torch's "unexpected pos"
                raise out.error from e
            raise
