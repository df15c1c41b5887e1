"""A one-rank process group in this process, and LLMs whose model runs the sharded code path on it
(vocab-parallel head and statistics, all-reduce hooks, shared requests), for tests."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from dlmrt import LLM
from dlmrt.distributed.loading import sliced_loader
from dlmrt.loading.checkpoint import load_checkpoint
from dlmrt.parallel.group import TPGroup, set_active
from dlmrt.tokenizer import Tokenizer


def one_rank_group(device: torch.device) -> TPGroup:
    """The default group of one rank (gloo for CPU tensors, NCCL for CUDA ones when present)."""
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return TPGroup(0, 1, device, 30.0, None)


def sharded_llm(path: Path, group: TPGroup, dtype: torch.dtype, mode: str = "eager") -> LLM:
    """An LLM over the checkpoint sharded over `group` (which must be active when it decodes)."""
    ckpt = load_checkpoint(path, dtype, group.device, shard=sliced_loader(group))
    llm = LLM.from_model(ckpt.model, Tokenizer(path), path=path, mode=mode)
    llm.group = group  # requests go through the rank-0 broadcast too
    return llm


def generate_sharded(llm: LLM, group: TPGroup, *args, **kwargs):
    set_active(group)
    try:
        return llm.generate(*args, **kwargs)
    finally:
        set_active(None)
