"""Custom ops, each resolved ONCE to its Triton kernel or its torch twin (`ops.reference`), logged.

Triton is used on CUDA tensors when `triton` imports and DLMRT_OPS is not "torch"; the CPU always
runs the twins. Tests force either implementation with `use(impl)`.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import torch

from dlmrt import envs
from dlmrt.ops import reference

log = logging.getLogger("dlmrt")
_IMPL: dict[str, str] = {}
OPS = ("arena_attention", "token_stats")


def _triton_ok() -> tuple[bool, str]:
    if envs.ops_impl() == "torch":
        return False, "DLMRT_OPS=torch"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    return True, "triton available"


def _resolve(name: str) -> Callable:
    if name not in _IMPL:
        ok, why = _triton_ok()
        _IMPL[name] = "triton" if ok else "torch"
        log.info("op %s -> %s (%s)", name, _IMPL[name], why)
    if _IMPL[name] == "triton":
        module = importlib.import_module(f"dlmrt._kernels.{name}")
        return getattr(module, name)
    return getattr(reference, name)


def use(impl: str | None) -> None:
    """Force every op to 'triton' or 'torch' (tests, benchmarks); None re-resolves from the environment."""
    _IMPL.clear()
    if impl is not None:
        for name in OPS:
            _IMPL[name] = impl


def arena_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_end: torch.Tensor, scale: float
) -> torch.Tensor:
    """Rows of one block attend to arena rows [0, kv_end) (device scalar). See kernels/arena_attention.py."""
    fn = _resolve("arena_attention") if q.is_cuda else reference.arena_attention
    return fn(q, k, v, kv_end, scale)


def token_stats(
    logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """argmax, confidence, entropy, log_z of softmax(logits / T), one pass. See kernels/token_stats.py."""
    fn = _resolve("token_stats") if logits.is_cuda else reference.token_stats
    return fn(logits, temperature)
