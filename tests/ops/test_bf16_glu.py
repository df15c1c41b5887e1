"""kernels/fp8_glu_gemm.py's unscaled form (gate|up + SiLU / gelu_tanh in one GEMM, the model
dtype in and out) vs its twin (`ops.bf16_glu.twin`: the gate|up GEMM rounded, then the fused
activation); the choice's pin and its CPU fallback.

On CUDA (`pytest -m gpu` picks these up too): rows 1 / 7 / 32 / 256 / 512 in bf16 at an awkward
shape and QwenDLM's; without CUDA, TRITON_INTERPRET=1 runs small awkward cases in fp32.
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, kernel_test

from dlmrt.ops import choices
from dlmrt.ops.bf16_glu import glu_bf16, twin
from dlmrt.ops.bf16_glu_choice import glu_configs, use_bf16_glu
from dlmrt.ops.fp8 import GluPlan

ROWS = (1, 7, 32, 256, 512) if CUDA else (1, 7, 33)
# (I, K): I not a multiple of the tile (a gate tile past I reads up rows), K not one of BK
SHAPES = [(136, 264), (9728, 2560)] if CUDA else [(72, 200), (40, 100)]
DTYPE = torch.bfloat16 if CUDA else torch.float32
CONFIG = (64, 64, 64, 3, 4) if CUDA else (32, 32, 32, 2, 4)  # (bm, bn, bk, stages, warps)
CPU = torch.device("cpu")


def _case(rows: int, i: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 7 + i + k)
    x = torch.randn(rows, k, generator=g)
    x[:, : k // 4] *= 4  # uneven magnitudes across K
    w = torch.randn(2 * i, k, generator=g) / k**0.5
    return x.to(DEV, DTYPE), w.to(DEV, DTYPE)


@kernel_test
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("i", "k"), SHAPES)
@pytest.mark.parametrize("gelu", (False, True))
def test_kernel_matches_the_unfused_path(rows, i, k, gelu):
    from dlmrt._kernels.fp8_glu_gemm import glu_gemm

    x, w = _case(rows, i, k)
    config = CONFIG if rows <= 64 or not CUDA else (128, 128, 64, 3, 8)
    y = glu_gemm(x, w, config, gelu)
    want = twin(x, w, gelu)
    assert y.shape == (rows, i) and y.dtype == DTYPE
    if not CUDA:  # fp32: the interpreter's sums differ from torch's only in order
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
        return
    # bf16: the epilogue rounds as the unfused path does, so y differs only where cuBLAS's fp32
    # summation order rounds gate or up to the neighbouring bf16 value (rare): one ulp of gate
    # or up, ~2 ulps of y. A wrong tile or half would be off almost everywhere.
    torch.testing.assert_close(
        y.float(), want.float(), rtol=1.6e-2, atol=1e-2 * want.float().abs().max().item()
    )
    same = (y == want).float().mean().item()
    assert same > 0.97, f"only {same:.3f} of y bit-equal to the unfused path's"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the op takes the kernel on CUDA only")
def test_the_op_runs_the_kernel_only_at_the_plan_rows(monkeypatch):
    """Other row counts (a prefill) take the twin; the plan's rows the kernel, same values (the
    CPU always runs the twin: `test_cpu_runs_the_twin_bit_for_bit`)."""
    import dlmrt._kernels.fp8_glu_gemm as kernel

    calls: list[int] = []
    real = kernel.glu_gemm
    monkeypatch.setattr(kernel, "glu_gemm", lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    x, w = _case(7, 72, 200)
    plan = GluPlan(7, CONFIG)
    want = twin(x, w, False)
    torch.testing.assert_close(glu_bf16(x, w, False, plan), want, rtol=1e-2, atol=1e-2)
    assert torch.equal(glu_bf16(x[:5], w, False, plan), twin(x[:5], w, False))
    assert calls == [7]  # the kernel ran at the plan's rows, not at 5


def test_cpu_runs_the_twin_bit_for_bit():
    x, w = torch.randn(5, 24), torch.randn(2 * 16, 24)
    for gelu in (False, True):
        gate, up = (x @ w.t()).chunk(2, dim=-1)
        act = (
            torch.nn.functional.gelu(gate, approximate="tanh")
            if gelu
            else torch.nn.functional.silu(gate)
        )
        torch.testing.assert_close(twin(x, w, gelu), act * up)
        assert torch.equal(glu_bf16(x, w, gelu, GluPlan(5, CONFIG)), twin(x, w, gelu))


def test_the_pin_is_checked_and_off_by_default(monkeypatch):
    monkeypatch.delenv("DLMRT_BF16_GLU", raising=False)
    ok, why, config = use_bf16_glu(256, 9728, 2560, CPU, torch.bfloat16, False)
    assert (ok, why, config) == (False, "DLMRT_BF16_GLU=off", None)
    choice = choices.get("bfloat16 swiglu 256x2560->2x9728: gate|up + activation")
    assert choice is not None and choice.pick == "separate"
    monkeypatch.setenv("DLMRT_BF16_GLU", "sometimes")
    with pytest.raises(ValueError, match="DLMRT_BF16_GLU='sometimes'"):
        use_bf16_glu(256, 9728, 2560, CPU, torch.bfloat16, False)


def test_cpu_falls_back_unless_pinned_on(monkeypatch):
    """auto: the CPU keeps the separate form (nothing to measure); on: the object is installed
    and its twin runs (no tile config)."""
    monkeypatch.setenv("DLMRT_BF16_GLU", "auto")
    assert use_bf16_glu(256, 3072, 1152, CPU, torch.bfloat16, True) == (False, "CPU", None)
    picked = choices.get("bfloat16 geglu 256x1152->2x3072: gate|up + activation")
    assert picked is not None and (picked.pick, picked.why) == ("separate", "CPU")
    monkeypatch.setenv("DLMRT_BF16_GLU", "ON")
    ok, why, config = use_bf16_glu(256, 3072, 1152, CPU, torch.bfloat16, True)
    assert ok and config is None and why.startswith("DLMRT_BF16_GLU=on; CPU")


def test_configs_use_the_smallest_row_tile_at_few_rows():
    assert {c[0] for c in glu_configs(32)} == {64}
    assert 128 in {c[0] for c in glu_configs(256)}
    assert all(len(c) == 5 and c[2] == 64 for c in glu_configs(256))
