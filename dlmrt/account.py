"""Op labels for a per-round kernel account (`benchmarks/account/`): which op each kernel belongs to.

    with account.label("attention", q, layer_k, layer_v, positions):
        out = ops.arena_attention(...)

A label is a no-op (one global read, the shared null context back) unless an account is being
taken (`taking`), and never under CUDA graph capture (dlmrt captures only through
`capture_guard.graph`; a capture records no profiler ranges: the account runs the round eager). While taking, each label opens a `torch.profiler.record_function`
range named `dlmrt#<seq> <name>` and keeps a `Record`: the name, the operands the floor is computed
from (tensors the op reads, then `writes`), and the enclosing record (a module's range, opened by
the account's module hooks, or an outer label), so a kernel maps to its innermost label and the
label to the layer it ran in.

Labels sit where a round's ops are implemented once for every family: the implementation objects
(`dlmrt/impls/`), the shared attention and round code; modules need none (the account hooks every
submodule while it runs, by module path).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from dlmrt import capture_guard

PREFIX = "dlmrt#"  # every range an account opens is named PREFIX + "<seq> <name>"


@dataclass
class Record:
    """One opened range: `name` (a label's, or a module's path), what it read and wrote."""

    seq: int
    name: str
    parent: int | None  # the enclosing record's seq (None: outermost)
    reads: tuple = ()
    writes: tuple = ()
    module: torch.nn.Module | None = None  # set for a module's range (the account's hooks)
    children: int = 0  # ranges opened directly inside this one


class _Account:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.stack: list[tuple[int, contextlib.AbstractContextManager]] = []

    def open(self, name: str, reads: tuple, writes: tuple, module=None) -> None:
        parent = self.stack[-1][0] if self.stack else None
        seq = len(self.records)
        if parent is not None:
            self.records[parent].children += 1
        self.records.append(Record(seq, name, parent, reads, writes, module))
        rf = torch.profiler.record_function(f"{PREFIX}{seq} {name}")
        rf.__enter__()
        self.stack.append((seq, rf))

    def close(self) -> Record:
        seq, rf = self.stack.pop()
        rf.__exit__(None, None, None)
        return self.records[seq]


_ACTIVE: _Account | None = None
_OFF = contextlib.nullcontext()


class _Range:
    __slots__ = ("account", "args")

    def __init__(self, account: _Account, *args) -> None:
        self.account, self.args = account, args

    def __enter__(self) -> None:
        self.account.open(*self.args)

    def __exit__(self, *exc) -> None:
        self.account.close()


def label(name: str, *reads: object, writes: tuple = ()) -> contextlib.AbstractContextManager:
    """A range naming the op inside it (see the module docstring); `reads`/`writes`: the tensors
    (or modules, objects holding tensors, ints) its floor is computed from."""
    if _ACTIVE is None or capture_guard.capturing():
        return _OFF
    return _Range(_ACTIVE, name, reads, writes)


def active() -> _Account | None:
    """The account being taken, or None (what the account's module hooks open ranges on)."""
    return _ACTIVE


@contextlib.contextmanager
def taking() -> Iterator[list[Record]]:
    """Turn labels on for the block (one account at a time); yields the records as they fill."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("account.taking: an account is already being taken")
    if capture_guard.capturing():
        raise RuntimeError("account.taking: not under CUDA graph capture (run the round eager)")
    _ACTIVE = _Account()
    try:
        yield _ACTIVE.records
    finally:
        while _ACTIVE.stack:  # an exception inside a range: close what it left open
            _ACTIVE.close()
        _ACTIVE = None
