"""Take an account: run a round once under the profiler with labels on and module ranges hooked."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from dlmrt import account


def _enter(path: str, module: nn.Module, args: tuple) -> None:
    acc = account.active()
    if acc is not None:
        acc.open(path, tuple(args), (), module)


def _exit(module: nn.Module, args: tuple, output: object) -> None:
    acc = account.active()
    if acc is not None:
        acc.close().writes = (output,)


def hook_modules(model: nn.Module) -> list:
    """A range named by its path (`model.layers.3.self_attn.o_proj`) around every submodule call
    while an account is taken; returns the hooks' handles (`remove()` each when done)."""
    handles = []
    for path, module in model.named_modules():
        if path:  # the root's own kernels stay unlabelled: labels name what the forward runs
            handles.append(module.register_forward_pre_hook(partial(_enter, path)))
            handles.append(module.register_forward_hook(_exit))
    return handles


def take(model: nn.Module, round_fn: Callable[[], None]) -> tuple[list[account.Record], list]:
    """(records, profiler events) of one call of `round_fn` (eager: no graph replay), profiled on
    the CPU and, for a CUDA model, the GPU."""
    cuda = any(p.is_cuda for p in model.parameters())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    handles = hook_modules(model)
    try:
        with account.taking() as records, profile(activities=activities) as prof:
            round_fn()
            if cuda:
                torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    return records, list(prof.events())
