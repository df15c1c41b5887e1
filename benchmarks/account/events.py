"""From a profile's events to kernels, each with the label (`dlmrt/account.py` range) it ran in.

A CUDA kernel belongs to the innermost label range open on the CPU when it was launched: kineto
links each device event to the PyTorch op that launched it (`linked_correlation_id` = that op's
`id`; for a Triton launch outside any aten op, the innermost `record_function` range, i.e. a label
itself), and that op's CPU start lies inside the label ranges that enclosed it. Where the link is
missing, the kernel's midpoint on the GPU timeline inside the device-side copies of the ranges
(kineto's `gpu_user_annotation` events, same names) decides, the shortest containing one winning.
On the CPU (no device events) the stand-ins for kernels are the aten ops called directly inside a
label (or outside every label): their own start places them.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from dlmrt.account import PREFIX


@dataclass(frozen=True)
class Span:
    """A label range: the account record `seq`, from `start` to `end` (µs)."""

    seq: int
    start: float
    end: float


@dataclass(frozen=True)
class Kernel:
    """A kernel (or a CPU op standing in for one): its time (µs) on its own timeline, and `host`,
    the CPU time that places it among the label ranges (None: unknown), or `seq` when the
    launching op is itself a label range."""

    name: str
    start: float
    end: float
    host: float | None = None
    seq: int | None = None

    @property
    def us(self) -> float:
        return self.end - self.start


def label_seq(name: str) -> int | None:
    """The record seq of a range named `dlmrt#<seq> <name>`, else None."""
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX) :].split(" ", 1)[0]
    return int(head) if head.isdigit() else None


def _device(e) -> bool:
    return e.device_type.name != "CPU"


def _span(e, seq: int) -> Span:
    return Span(seq, e.time_range.start, e.time_range.end)


def parse(events) -> tuple[list[Kernel], list[Span], list[Span]]:
    """(kernels, CPU label spans, device label spans) of torch.profiler `events()`: device kernels
    when the profile holds any, else the CPU stand-ins (see the module docstring)."""
    cpu_spans, dev_spans, frontend = [], [], {}
    for e in events:
        seq = label_seq(e.name)
        if seq is not None:
            (dev_spans if _device(e) else cpu_spans).append(_span(e, seq))
        if not _device(e) and getattr(e, "linked_correlation_id", 0) == 0:
            frontend[e.id] = e
    kernels = [_device_kernel(e, frontend) for e in events if _is_kernel(e)]
    if not kernels:  # a CPU profile: ops called directly in a label (or in none)
        kernels = [
            Kernel(e.name, e.time_range.start, e.time_range.end, host=e.time_range.start)
            for e in events
            if not _device(e) and _cpu_top(e)
        ]
    kernels.sort(key=lambda k: k.start)
    return kernels, cpu_spans, dev_spans


def _is_kernel(e) -> bool:
    """A device event that is neither a label's device copy nor another user annotation."""
    return _device(e) and not e.name.startswith(PREFIX) and not e.is_user_annotation


def _cpu_top(e) -> bool:
    """A frontend op (not a label, not a runtime call linked to a device event) called directly
    inside a label or outside every one."""
    if e.is_user_annotation or e.name.startswith(PREFIX):
        return False
    if getattr(e, "linked_correlation_id", 0) != 0:
        return False
    parent = e.cpu_parent
    return parent is None or bool(parent.is_user_annotation)


def _device_kernel(e, frontend: dict) -> Kernel:
    link = getattr(e, "linked_correlation_id", 0)
    op = frontend.get(link) if link else None  # 0: no link (never a frontend op's id)
    start, end = e.time_range.start, e.time_range.end
    if op is None:
        return Kernel(e.name, start, end)
    return Kernel(e.name, start, end, op.time_range.start, label_seq(op.name))


def innermost(spans: list[Span], starts: list[float], t: float) -> Span | None:
    """The innermost of properly nested `spans` (sorted by start; `starts` their starts) that
    contains t: the latest-starting one that still ends after t."""
    i = bisect_right(starts, t)
    while i > 0:
        i -= 1
        if spans[i].end >= t:
            return spans[i]
    return None


def shortest(spans: list[Span], t: float) -> Span | None:
    """The shortest span containing t (device spans of two streams need not nest)."""
    inside = [s for s in spans if s.start <= t <= s.end]
    return min(inside, key=lambda s: s.end - s.start, default=None)


def assign(kernels: list[Kernel], cpu: list[Span], device: list[Span]) -> list[int | None]:
    """The label seq of each kernel (None: unlabelled), as the module docstring says."""
    cpu = sorted(cpu, key=lambda s: (s.start, -s.end))
    starts = [s.start for s in cpu]
    out: list[int | None] = []
    for k in kernels:
        if k.seq is not None:
            out.append(k.seq)
            continue
        span = innermost(cpu, starts, k.host) if k.host is not None else None
        if span is None and k.host is None:
            span = shortest(device, (k.start + k.end) / 2)
        out.append(None if span is None else span.seq)
    return out
