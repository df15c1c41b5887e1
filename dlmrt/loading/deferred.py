"""Deferred parameters: an NVFP4 checkpoint's weights whose model-dtype parameters are never allocated.

When the load hands the quantized weights to the model's kernels (`placement.installs_quantized`),
every NVFP4 weight that is an FP8/NVFP4 candidate (`policy.py`: routed experts, a stack only when
all its experts are NVFP4; dense MLPs; attention, shared experts and the LM head) keeps its
model-dtype parameter on the meta device from the model's build to the install: `allocate` gives
every other parameter its storage, the reader keeps the packed codes as they stream in
(`Nvfp4Reader.keep`, no dequantization), and the implementation objects are built from those
(W4A16 from the packed codes, or FP8 codes converted from them). A weight the install declines
(NVFP4 attention, shared experts and the LM head always are) is then `materialize`d (allocated
and filled with its dequantized values, as the ordinary path would have held it), and `finish`
gives the emptied (zero-size) parameters the model's device. The load never holds a bf16 copy of
the experts.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.loading.policy import classify


def deferrable(qreader: object) -> set[str]:
    """The parameter names of the reader's NVFP4 weights that are FP8/NVFP4 candidates (a
    stacked parameter's name for per-expert tensors, only when every expert is NVFP4); empty for
    any other reader."""
    from dlmrt.loading.nvfp4_reader import Nvfp4Reader

    if not isinstance(qreader, Nvfp4Reader):
        return set()
    slices = qreader.slices
    params = {slices[n][0] if n in slices else n for n in qreader.aux}
    # a stack with an unquantized expert loads allocated: the reader then names it ("all or none")
    mixed = {param for n, (param, _) in slices.items() if n not in qreader.aux}
    return {p for p in params - mixed if classify(p)[0]}


def allocate(model: nn.Module, device: torch.device, deferred: set[str]) -> nn.Module:
    """`model.to_empty(device)` except for the `deferred` parameters, which stay on meta."""
    keep = {id(model.get_parameter(n)) for n in deferred}
    # what `nn.Module.to_empty` does, less the deferred tensors
    return model._apply(lambda t: t if id(t) in keep else torch.empty_like(t, device=device))


def materialize(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Give each deferred parameter in `values` its storage and value; then re-fuse each module
    whose fused implementation (`fuse_projections`: a `StackedGateUp` / `StackedProjection`)
    was built over the meta weights, as it would have been over the allocated ones. `values` is
    emptied first: the re-fuse copies each weight into the stack and frees the unfused one."""
    parents = _allocate(model, values)
    for parent in parents:
        if hasattr(parent, "fuse") and _fused_over_meta(parent):
            parent.fuse()


def _allocate(model: nn.Module, values: dict[str, torch.Tensor]) -> list[nn.Module]:
    """Each of `values` (emptied) into its deferred parameter; the parameters' parent modules."""
    parents: list[nn.Module] = []
    for name in list(values):
        value = values.pop(name)
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        if not getattr(owner, attr).is_meta:
            raise ValueError(f"materialize: {name} is not a deferred parameter")
        setattr(owner, attr, nn.Parameter(value, requires_grad=False))
        parent = model.get_submodule(owner_name.rpartition(".")[0])
        if all(parent is not p for p in parents):
            parents.append(parent)
    return parents


def _fused_over_meta(module: nn.Module) -> bool:
    """Whether one of the module's implementation objects holds a fused weight on meta."""
    slots = (v for v in vars(module).values() if not isinstance(v, (nn.Module, torch.Tensor)))
    return any(
        isinstance(getattr(v, "weight", None), torch.Tensor) and v.weight.is_meta for v in slots
    )


def finish(model: nn.Module, device: torch.device) -> None:
    """After the install: a deferred parameter an implementation object emptied (zero-size, on
    meta) moves to `device`; one still holding elements on meta is a RuntimeError naming it (the
    install neither installed nor declined it)."""
    for name, param in list(model.named_parameters()):
        if not param.is_meta:
            continue
        if param.numel():
            raise RuntimeError(
                f"{name}: an NVFP4 weight left unallocated after the install (neither installed "
                "nor declined by the model's use_quantized)"
            )
        owner_name, _, attr = name.rpartition(".")
        empty = torch.empty(param.shape, dtype=param.dtype, device=device)
        setattr(model.get_submodule(owner_name), attr, nn.Parameter(empty, requires_grad=False))
