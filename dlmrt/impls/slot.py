"""Putting an implementation object into a layer's slot (`dlmrt/impls/__init__.py`)."""

from __future__ import annotations

from torch import nn


def set_slot(module: nn.Module, name: str, impl: object) -> None:
    """module.name = impl, whether impl is a module (registered, as a quantized one is) or a plain
    implementation object replacing one (`dense.py`): either may replace the other."""
    module._modules.pop(name, None)
    module.__dict__.pop(name, None)
    setattr(module, name, impl)


def carry_hooks(old: nn.Module, new: nn.Module) -> None:
    """Give `new` the forward hooks of the module it replaces: tensor parallelism hangs its
    all-reduce on the row-parallel linears (distributed/shard.py)."""
    for hook in old._forward_pre_hooks.values():
        new.register_forward_pre_hook(hook)
    for hook in old._forward_hooks.values():
        new.register_forward_hook(hook)
