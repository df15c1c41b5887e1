"""What to say when a round's logits come back non-finite (`errors.NonFiniteError`).

Detection costs nothing extra at run time: each block's report carries a flag computed on the
device from the last round's per-row entropies (a NaN or infinite logit makes its row's softmax,
hence its entropy, NaN), read with the block's one read-back (`engine/block/block_io.py`); the
canvas engine reads it with its step count. A healthy model never sets it. Only then, on the error
path, the model is scanned once for the cause: the first parameter or buffer holding NaN / inf is
named; otherwise the activations overflowed (weights or inputs too large for the dtype).
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrt.errors import NonFiniteError


def flag(values: torch.Tensor) -> torch.Tensor:
    """Device side (capturable): [] int64, 1 when any of `values` is NaN or infinite."""
    return (~torch.isfinite(values).all()).long()


def diagnose(model: nn.Module) -> str:
    """The first non-finite parameter or buffer of `model` by name, else the likely cause."""
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            return (
                f"the weight '{name}' holds NaN or inf values (a corrupt or mis-scaled checkpoint)"
            )
    dtype = next(model.parameters()).dtype
    return (
        f"no weight is non-finite: the activations overflowed {dtype} (weights or inputs too "
        "large, or a config value such as rms_norm_eps or rope_theta out of range)"
    )


def error(model: nn.Module, where: str) -> NonFiniteError:
    """The error to raise for non-finite logits in `where` (e.g. "block 3")."""
    return NonFiniteError(f"non-finite logits (NaN or inf) in {where}: {diagnose(model)}")
