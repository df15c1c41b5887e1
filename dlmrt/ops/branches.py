"""Two independent branches of a forward on two CUDA streams: fork, run both, join.

    dense, moe = branches.fork_join(lambda: mlp(x), lambda: experts(y, *router(z)), x)

`main` runs on the current stream, `side` on a second stream of the same device; the caller gets
both results ordered after both branches, as if they had run one after the other. Both branches
must be independent: neither reads what the other writes. Where it pays: a latency-bound branch
(small GEMMs that fill a few SMs) hidden under a bandwidth-bound one (DiffusionGemma's dense MLP
under its routed experts).

When two streams are used (`enabled`): CUDA tensors, autograd off (inference: the engines run
under `torch.inference_mode`; a backward would replay on the forward's streams and training gains
nothing), no tensor parallelism (either branch may end in an all-reduce, e.g. on a row-parallel
linear: two collectives of one communicator issued from two streams are left out until measured
on several GPUs), and DLMRT_BRANCH_STREAMS not "0" (`envs.branch_streams`: the before/after
switch). Otherwise `main()` then `side()` on the current stream: exactly the sequential code.

Ordering. Fork: the side stream waits for an event recorded on the current stream after
everything issued so far (so `side` sees its inputs). Join: the current stream waits for an
event recorded on the side stream after `side`'s work. Inside CUDA graph capture the same two
event waits are how a second stream joins the capture and rejoins it (the captured graph gets
two parallel chains that meet at the join); the side stream must rejoin before the capture ends,
which the join (in a `finally`) guarantees.

Memory across streams (PyTorch's caching allocator ties every block to the stream it was made
on and reuses a freed block for that stream's later allocations, ordered only on that stream):

- `side`'s inputs, made on the current stream before the fork: if one were freed before the
  join, the current stream could hand its block to `main`'s allocations while `side` still reads
  it, in eager mode and inside a capture alike (the graph pool orders reuse by stream only). The
  caller keeps them referenced until `fork_join` returns (a closure over the caller's locals
  does: `fork_join` holds `side` until after the join); after the join every later use of the
  block on the current stream is ordered after `side`'s reads.
- `side`'s temporaries: made and freed on the side stream, used only there: stream-ordered.
- `side`'s results: made on the side stream, then read (and freed) on the current stream. Eager:
  each result tensor is `record_stream`ed on the current stream, so its block is not handed to a
  side-stream allocation before the current stream's work queued up to the free is done.
  Capture: not recorded (the allocator would hold every recorded block until the capture ends:
  a layer's result per layer in the graph pool); the next reuse of such a block is a side-stream
  allocation inside a later fork, and that fork waits for the current stream past the point
  where the block was freed, so the graph orders the reuse after every read. This holds as long
  as a result is dropped before the next `fork_join` on its device (a layer's local: it is).
- `main`'s tensors live on the current stream throughout.

The side stream is one per device, drawn from PyTorch's stream pool (default priority, as the
capture streams; a graph instantiated without node priorities runs its branches as equals).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from dlmrt import envs
from dlmrt.ops import choices
from dlmrt.parallel import group as tp

A = TypeVar("A")
B = TypeVar("B")
_SIDE: dict[torch.device, torch.cuda.Stream] = {}


def enabled(like: torch.Tensor) -> bool:
    """Whether `fork_join` runs its branches on two streams for work on `like`'s device. For
    CUDA inference the decision is recorded (`choices`: "branch_streams", in the benchmarks'
    reports beside the kernels' choices)."""
    if like.device.type != "cuda" or torch.is_grad_enabled():
        return False
    if tp.active() is not None:
        return _record(False, "tensor parallel")
    if not envs.branch_streams():
        return _record(False, "DLMRT_BRANCH_STREAMS=0")
    return _record(True, "CUDA inference")


def _record(two: bool, why: str) -> bool:
    choices.record("branch_streams", "two streams" if two else "one stream", why)
    return two


def side_stream(device: torch.device, current: torch.cuda.Stream) -> torch.cuda.Stream:
    """The second stream of `device`, never `current`: drawn from PyTorch's stream pool on first
    use, and drawn again should the pool (round-robin) have handed `current` out since (a later
    runner's capture stream). Drawing a pool stream makes no CUDA call once the pool exists."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    while device not in _SIDE or _SIDE[device] == current:  # the pool holds 32 streams
        _SIDE[device] = torch.cuda.Stream(device)
    return _SIDE[device]


def fork_join(main: Callable[[], A], side: Callable[[], B], like: torch.Tensor) -> tuple[A, B]:
    """(main(), side()), `side` on the device's second stream when `enabled(like)`; the results
    are ready on the current stream when this returns (see the module docstring's contract)."""
    if not enabled(like):
        return main(), side()
    here = torch.cuda.current_stream(like.device)
    other = side_stream(like.device, here)
    other.wait_stream(here)  # fork: side's inputs are made
    try:
        with torch.cuda.stream(other):  # issued first: the long branch starts first
            b = side()
        a = main()
    finally:
        here.wait_stream(other)  # join (also on an error: a capture must not end forked)
    if not torch.cuda.is_current_stream_capturing():
        for t in _tensors(b):
            t.record_stream(here)
    return a, b


def _tensors(value: object) -> list[torch.Tensor]:
    """The CUDA tensors in a branch's result (a tensor, or a tuple / list of them, nested)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_cuda else []
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    return []
