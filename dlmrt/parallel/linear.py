"""Parallel layers, applied to built modules: column / row slices, the all-reduce, vocab shards.

column-parallel  a Linear keeps a slice of its output rows (weight[rows]); no communication
row-parallel     a Linear keeps a slice of its input columns (weight[:, cols]); its output is a
                 partial sum, completed by `all_reduce_output` on the module whose output is the
                 first thing used un-sharded (o_proj, down_proj, a whole MoE block)
vocab-parallel   the embedding keeps rows [r * n, (r + 1) * n) of the table: ids outside the
                 shard look up 0 and one all-reduce sums the shards; the LM head keeps the same
                 rows, so its logits are this rank's shard (`vocab.py` combines the statistics)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt.parallel.group import TPGroup


class ShardError(ValueError):
    """A dimension does not split evenly over the ranks; the message names it."""


def split(size: int, world: int, what: str) -> int:
    """size / world, or ShardError naming `what`."""
    if size % world:
        raise ShardError(
            f"tensor parallel: {what} = {size} is not divisible by the world size {world}"
        )
    return size // world


# id(kept parameter) -> (dim, index, full shape) while `recording` (sliced loading: loading.py)
_RECORD: dict[int, tuple[int, torch.Tensor | slice, tuple[int, ...]]] | None = None


@contextmanager
def recording() -> Iterator[dict[int, tuple[int, torch.Tensor | slice, tuple[int, ...]]]]:
    """Record every `keep_rows` cut made inside the block (what a rank must read of a tensor)."""
    global _RECORD
    _RECORD = {}
    try:
        yield _RECORD
    finally:
        _RECORD = None


def keep_rows(weight: torch.Tensor, index: torch.Tensor | slice, dim: int = 0) -> nn.Parameter:
    """A fresh contiguous parameter holding the kept slice (the full tensor can be freed)."""
    w = weight.detach()
    if isinstance(index, slice):
        kept = w[(slice(None),) * dim + (index,)]
    else:
        kept = w.index_select(dim, index.to(w.device))  # index: a CPU tensor (recorded)
    out = nn.Parameter(kept.contiguous().clone(), requires_grad=False)
    if _RECORD is not None:
        _RECORD[id(out)] = (dim, index, tuple(weight.shape))
    return out


def column(linear: nn.Linear, index: torch.Tensor | slice) -> None:
    """Keep the output rows `index` of `linear`."""
    linear.weight = keep_rows(linear.weight, index, 0)
    linear.out_features = linear.weight.shape[0]


def row(linear: nn.Linear, index: torch.Tensor | slice) -> None:
    """Keep the input columns `index` of `linear` (its output becomes a partial sum)."""
    linear.weight = keep_rows(linear.weight, index, 1)
    linear.in_features = linear.weight.shape[1]


def all_reduce_output(module: nn.Module, group: TPGroup) -> None:
    """Sum `module`'s output over the ranks after every forward (a forward hook, as gpt-fast)."""

    def hook(_mod, _args, out: torch.Tensor) -> torch.Tensor:
        return group.all_reduce(out)

    module.register_forward_hook(hook)


def heads_slice(head_dim: int, start: int, count: int) -> slice:
    """The rows (or columns) of heads [start, start + count) in a [heads * head_dim] projection."""
    return slice(start * head_dim, (start + count) * head_dim)


class VocabParallelEmbedding(nn.Embedding):
    """An embedding over vocabulary rows [offset, offset + n): other ids give 0, then one
    all-reduce. `weight` is the shard (the tied LM head and z = p^T E use the same rows)."""

    def __init__(self, full: nn.Embedding, group: TPGroup) -> None:
        vocab, dim = full.weight.shape
        n = split(vocab, group.world, "vocab_size")
        super().__init__(n, dim, device="meta")
        self.weight = keep_rows(full.weight, slice(group.rank * n, (group.rank + 1) * n))
        self.offset, self.group, self.full_vocab = group.rank * n, group, vocab

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.offset
        inside = (local >= 0) & (local < self.num_embeddings)
        out = F.embedding(torch.where(inside, local, 0), self.weight)
        out = out * inside.unsqueeze(-1).to(out.dtype)
        return self.group.all_reduce(out)
