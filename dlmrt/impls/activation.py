"""The gated MLPs' activations, by name: each as the separate form (act(gate) * up, from two
projections) and as the fused form (one [rows, 2I] gate|up tensor in, one op)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from dlmrt import ops
from dlmrt.ops import gemma

ACTIVATIONS = ("silu", "gelu_tanh")  # SwiGLU, GeGLU (Gemma's `gelu_pytorch_tanh`)


def _check(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")


def act(activation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation alone (applied to the gate projection's output)."""
    _check(activation)
    if activation == "silu":
        return F.silu
    return lambda g: F.gelu(g, approximate="tanh")


def act_mul(activation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """act(gate) * up of a fused [rows, 2I] gate|up tensor (gate first), one op."""
    _check(activation)
    return ops.silu_mul if activation == "silu" else gemma.gelu_mul
