"""The tensor-parallel process group: set up from torchrun's env vars, one per process.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `init_from_env` joins
the default group (gloo on the CPU, NCCL on CUDA) with a timeout, so a collective outside a CUDA
graph whose peer died fails after at most `timeout_s` instead of hanging. `active()` is the group
the vocab-parallel math combines over (None: not sharded, every code path is the plain one).

A leaf module: imports nothing from dlmrt (the decoding and model layers read `active()`).
"""

from __future__ import annotations

import atexit
import collections
import datetime
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0
# torch >= 2.13 names it all_gather_single (all_gather_into_tensor deprecated); 2.11 (the GPU
# machine's image) has only all_gather_into_tensor.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class PeerLost(RuntimeError):
    """A collective failed: another rank died, or did not answer within the timeout."""


@dataclass(frozen=True, slots=True)
class TPGroup:
    """One tensor-parallel group: this process's rank among `world` ranks."""

    rank: int
    world: int
    device: torch.device
    timeout_s: float = DEFAULT_TIMEOUT_S
    control: Any = None  # a gloo group for host-side objects (requests, flags); None: the default

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks, in place (every rank gets the same bits)."""
        _guard("all_reduce", self, lambda: dist.all_reduce(x), x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[world, *x.shape]: every rank's x, in rank order."""
        out = torch.empty((self.world * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        src = x.contiguous()
        _guard("all_gather", self, lambda: _ALL_GATHER(out, src), out, src)
        return out.view(self.world, *x.shape)

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (others pass anything), pickled over the control group
        (gloo, CPU tensors, no timeout: followers may wait for the next request for hours)."""
        data = pickle.dumps(obj) if self.is_root else b""
        size = torch.tensor([len(data)], dtype=torch.long)
        _guard("broadcast", self, lambda: dist.broadcast(size, 0, group=self.control), size)
        buf = torch.zeros(int(size), dtype=torch.uint8)
        if self.is_root:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        _guard("broadcast", self, lambda: dist.broadcast(buf, 0, group=self.control), buf)
        return obj if self.is_root else pickle.loads(buf.numpy().tobytes())

    def min_over_ranks(self, value: int) -> int:
        """The least of every rank's `value`, on every rank (over the control group)."""
        x = torch.tensor([value], dtype=torch.long)
        op = dist.ReduceOp.MIN
        _guard("all_reduce", self, lambda: dist.all_reduce(x, op, group=self.control), x)
        return int(x.item())

    def broadcast_flag(self, value: bool) -> bool:
        """Rank 0's `value` on every rank (one byte over the control group)."""
        flag = torch.tensor([int(value)], dtype=torch.uint8)
        _guard("broadcast", self, lambda: dist.broadcast(flag, 0, group=self.control), flag)
        return bool(flag.item())


# The CPU tensors of the last collectives and their use counts before each. A gloo worker thread
# releases a finished collective a moment after `wait` returns, and releasing a tensor that
# Python also holds takes the GIL (the TensorImpl drops its strong reference to its Python
# object); during interpreter teardown that ends the thread inside a noexcept destructor and the
# process aborts ("terminate called without an active exception", rank 0 or 1 at random, after a
# request that succeeded: seen on CI under load, traced with gdb to ~AsyncBroadcastWork in
# ProcessGroupGloo::runLoop). So at exit (`_drain`, before teardown) we wait, GIL released,
# until the workers have let go of them (use counts back), at most DRAIN_S.
_RECENT: collections.deque = collections.deque(maxlen=16)
DRAIN_S = 2.0


def _drain() -> None:
    deadline = time.monotonic() + DRAIN_S
    for tensors, counts in list(_RECENT):
        for t, n in zip(tensors, counts, strict=True):
            while t._use_count() > n and time.monotonic() < deadline:
                time.sleep(0.001)


atexit.register(_drain)


def _guard(op: str, group: TPGroup, fn: Callable[[], Any], *tensors: torch.Tensor) -> None:
    """Run a collective over `tensors`; a failure (a dead peer, a timeout) becomes `PeerLost`
    naming the op. Under CUDA graph capture the collective is only recorded: no error here."""
    if all(t.device.type == "cpu" for t in tensors):  # gloo (NCCL's CUDA tensors: not needed)
        _RECENT.append((tensors, [t._use_count() for t in tensors]))
    try:
        fn()
    except Exception as e:  # gloo / NCCL raise RuntimeError or DistBackendError subclasses
        raise PeerLost(
            f"tensor parallel: {op} failed on rank {group.rank} of {group.world}: another rank "
            f"died or did not answer within {group.timeout_s:.0f} s ({type(e).__name__}: {e})"
        ) from e


_ACTIVE: TPGroup | None = None


def active() -> TPGroup | None:
    """The group sharded models combine over; None when nothing is sharded."""
    return _ACTIVE


def set_active(group: TPGroup | None) -> None:
    global _ACTIVE
    _ACTIVE = group


def launched_world_size() -> int:
    """WORLD_SIZE as torchrun set it (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_from_env(
    size: int | None, device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S
) -> TPGroup | None:
    """Join torchrun's group; None when there is nothing to shard (world 1, size None or 1).

    `size` (tensor_parallel_size) must equal torchrun's world size when given; the device becomes
    cuda:LOCAL_RANK on CUDA. Raises ValueError naming the mismatch."""
    world = launched_world_size()
    if size is not None and size < 1:
        raise ValueError(f"tensor_parallel_size: must be >= 1, got {size}")
    if size is not None and size > 1 and world == 1:
        raise ValueError(
            f"tensor_parallel_size={size}: launch the ranks with torchrun, e.g. "
            f"`torchrun --nproc-per-node {size} -m dlmrt generate ...`"
        )
    if size is not None and world not in (1, size):
        raise ValueError(
            f"tensor_parallel_size={size} but torchrun started WORLD_SIZE={world} ranks"
        )
    if world == 1:
        return None
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=365))
    group = TPGroup(dist.get_rank(), dist.get_world_size(), device, timeout_s, control)
    set_active(group)
    return group
