"""The device facts the split kernels size their grids by, looked up once per device."""

from __future__ import annotations

import functools

import torch


@functools.cache
def sm_count(device: torch.device) -> int:
    """The device's SM count; under the interpreter (CPU tensors) 4, so that a few splits run and
    the kernels' combine and merge passes are exercised."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
