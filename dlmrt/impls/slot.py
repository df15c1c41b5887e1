"""Putting an implementation object into a layer's slot (`dlmrt/impls/__init__.py`)."""

from __future__ import annotations

from torch import nn


def set_slot(module: nn.Module, name: str, impl: object) -> None:
    """module.name = impl, whether impl is a module (registered, as a quantized one is) or a plain
    implementation object replacing one (`dense.py`): either may replace the other."""
    module._modules.pop(name, None)
    module.__dict__.pop(name, None)
    setattr(module, name, impl)
