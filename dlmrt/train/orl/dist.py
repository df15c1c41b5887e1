"""Data parallelism under torchrun (gloo on the CPU, NCCL on CUDA), or one process.

Each rank rolls out its share of the step's prompts (prompt j on rank j mod world, all of its
rollouts there); the replay documents are then assigned to ranks largest-cost-first
(`balance.py`); loss denominators and gradients are summed across ranks (the same as DDP's
all-reduce, done once per step because ranks run different numbers of packed rows), so W
processes take the same step as one process on the same prompts.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init(device: torch.device) -> tuple[int, int]:
    """(rank, world): starts the process group under torchrun (WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_device(device: torch.device) -> torch.device:
    """cuda -> cuda:LOCAL_RANK under torchrun."""
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def all_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def sum_gradients(model: torch.nn.Module) -> None:
    """Sum every parameter's gradient across ranks (missing gradients count as zero)."""
    if not dist.is_initialized():
        return
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
