"""The device benchmarks' host-side pieces, checked on the CPU (the timings themselves need CUDA)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_moe_floor_counts_the_touched_experts():
    moe = _load("moe_layer")
    shape = moe.Shape("t", hidden=64, experts=16, inter=32, top_k=2, rows=3, activation="silu")
    index = torch.tensor([[0, 1], [1, 2], [2, 0]])  # 3 distinct experts
    floor, touched = moe.floor_ms(shape, index)
    weight_bytes = (3 * 3 * 64 * 32 + 16 * 64) * 2
    flops = 2 * 6 * 3 * 64 * 32 + 2 * 3 * 64 * 16
    assert touched == 3
    assert floor == max(flops / moe.PEAK_FLOPS, weight_bytes / moe.PEAK_BYTES) * 1e3


def test_moe_layer_runs_on_the_twins():
    """Both routings and activations run end to end on the CPU twins at a tiny shape."""
    from dlmrt.ops import reference

    moe = _load("moe_layer")
    for n_group, act in ((4, "silu"), (0, "gelu_tanh")):
        shape = moe.Shape("t", 32, 16, 24, 4, 5, act, n_group=n_group)
        layer, route = moe.make_layer(shape, torch.device("cpu"), torch.float32)
        weights, index = route(reference)
        assert index.shape == (5, 4) and torch.isfinite(weights).all()
        out = layer(reference)
        assert out.shape == (5, 32) and torch.isfinite(out).all() and out.abs().sum() > 0
