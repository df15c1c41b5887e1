"""Sliced loading: each rank reads only its slices of the safetensors files.

`sliced_loader(group)` is the `shard` hook of `dlmrt.loading.checkpoint.load_checkpoint`: it shards the
model while it is still on the meta device (shapes only; the loader's strict check has taken the
full shapes before), recording every cut `shard.py` makes, and returns the reader the loader then
uses: each tensor is read with `safe_open(...).get_slice(name)[...]` over the rank's contiguous
ranges only (a fused q|k|v or gate|up tensor: one range per part), never as a full copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dlmrt.distributed.shard import shard_model
from dlmrt.parallel.group import TPGroup
from dlmrt.parallel.linear import recording

Cut = tuple[int, list[tuple[int, int]], tuple[int, ...]]  # dim, [start, stop) ranges, full shape


def ranges(index: torch.Tensor | slice, size: int) -> list[tuple[int, int]]:
    """The kept indices as sorted contiguous [start, stop) ranges."""
    if isinstance(index, slice):
        start, stop, _ = index.indices(size)
        return [(start, stop)]
    out: list[tuple[int, int]] = []
    for i in index.tolist():
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


class SliceReader:
    """Reads of a meta-sharded model's tensors: only the slices this rank keeps."""

    def __init__(self, model: nn.Module, cuts: dict[str, Cut]) -> None:
        self.cuts = cuts
        self.stacked = model.checkpoint_slices() if hasattr(model, "checkpoint_slices") else {}

    def read(self, st, stored: str, name: str) -> torch.Tensor:
        """Tensor `stored` of the open file `st`, only the rows (or columns) this rank keeps;
        `name` is the model's name (a stacked expert's: dims shift by one)."""
        shift, cut = 0, self.cuts.get(name)
        if name in self.stacked:
            shift, cut = 1, self.cuts.get(self.stacked[name][0])
        if cut is None:
            return st.get_tensor(stored)
        dim, spans, _ = cut
        part = st.get_slice(stored)
        lead = (slice(None),) * (dim - shift)
        pieces = [part[(*lead, slice(a, b))] for a, b in spans]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim - shift)


def sliced_loader(group: TPGroup) -> Callable[[nn.Module], SliceReader]:
    """The loader hook: shard the meta model over `group`, return its `SliceReader`."""

    def prepare(model: nn.Module) -> SliceReader:
        with recording() as record:
            shard_model(model, group, fuse=False)
        by_id = {id(t): n for n, t in model.state_dict(keep_vars=True).items()}
        cuts = {}
        for key, (dim, index, full) in record.items():
            if key in by_id:
                cuts[by_id[key]] = (dim, ranges(index, full[dim]), full)
        return SliceReader(model, cuts)

    return prepare
