"""The model dtype's dense projections on DeepGEMM where it measures faster (`ops/deepgemm.py`).

After the load's other installs (`loading/checkpoint.py`), each layer's dense projections left in
bf16 are offered to DeepGEMM at the block rows: the stacked q|k|v and gate|up (`dense.py`:
their GEMM becomes a `BlockRowsGemm`) and o_proj / down_proj (`nn.Linear`s replaced by a
`DeepGemmLinear` holding the same parameter; LLaDA2's `query_key_value` and `dense` too, so the state dict keeps its names). A projection is
switched only where `deepgemm.chosen` picks DeepGEMM at the block rows, timed once per shape at
load (or every fitting shape under DLMRT_DEEPGEMM=on), and only those rows run on it: other row
counts (a prefill's) keep cuBLAS, so no request times or JIT-compiles a GEMM mid-flight. Without the library (the CPU
install, DLMRT_DEEPGEMM=off, no SM90 / SM100 device) nothing is looked at: the load is as before.
Quantized projections, adapters, shared and routed experts keep theirs.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt.impls.dense import StackedGateUp, StackedProjection
from dlmrt.impls.glu_install import block_rows
from dlmrt.impls.slot import carry_hooks, set_slot
from dlmrt.ops import deepgemm

log = logging.getLogger("dlmrt")
# (parent, slot) of a layer: QwenDLM / DiffusionGemma, then LLaDA2's attention
LINEARS = (
    ("self_attn", "o_proj"),
    ("mlp", "down_proj"),
    ("attention", "query_key_value"),
    ("attention", "dense"),
)
STACKED = (("self_attn", "qkv"), ("mlp", "gate_up"))


class BlockRowsGemm:
    """x @ w^T: DeepGEMM at `rows` rows (where it was chosen at load), F.linear at any other."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.numel() == self.rows * x.shape[-1] and deepgemm.fits(x, w):
            return deepgemm.gemm(x, w)
        return F.linear(x, w)


class DeepGemmLinear(nn.Module):
    """A bias-free bf16 linear whose GEMM is a `BlockRowsGemm`."""

    def __init__(self, weight: nn.Parameter, rows: int) -> None:
        super().__init__()
        self.weight, self.gemm = weight, BlockRowsGemm(rows)
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, self.weight)


def _wins(rows: int, weight: torch.Tensor) -> bool:
    """DeepGEMM is chosen for [rows, K] @ weight^T (measured once per shape)."""
    x = torch.zeros(rows, weight.shape[1], device=weight.device, dtype=weight.dtype)
    return deepgemm.chosen(x, weight)


def _plain(module: object) -> bool:
    return type(module) is nn.Linear and module.bias is None


def install_deepgemm(model: nn.Module, rows: int | None = None) -> int:
    """Offer each layer's bf16 projections (`model.model.layers[i]`) to DeepGEMM at `rows`
    (default: the block rows); returns how many now run through it."""
    if deepgemm.library() is None:
        return 0
    rows, done = rows or block_rows(model), 0
    for i, layer in enumerate(getattr(getattr(model, "model", None), "layers", ())):
        for parent_name, name in LINEARS + STACKED:
            parent = getattr(layer, parent_name, None)
            slot = getattr(parent, name, None)
            weight = getattr(slot, "weight", None)
            if not (_plain(slot) or type(slot) in (StackedProjection, StackedGateUp)):
                continue  # quantized, fused or absent
            if weight.dtype != torch.bfloat16 or not _wins(rows, weight):
                continue
            if _plain(slot):
                new = DeepGemmLinear(slot.weight, rows)
                carry_hooks(slot, new)  # a row-parallel linear's all-reduce
                set_slot(parent, name, new)
            else:
                slot.gemm = BlockRowsGemm(rows)
            log.debug("layer %d %s.%s: DeepGEMM at %d rows", i, parent_name, name, rows)
            done += 1
    return done
