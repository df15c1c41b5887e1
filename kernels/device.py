"""The device facts the kernels size their grids and tiles by, looked up once per device."""

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


HOPPER_SMEM = 232_448  # shared memory per block (opt-in) of an H100 / H200


@functools.cache
def shared_memory(device: torch.device) -> int:
    """Shared memory per block (opt-in bytes); under the interpreter (CPU tensors): Hopper's."""
    if device.type != "cuda":
        return HOPPER_SMEM
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", 49_152)
