"""How a dense FP8 linear picks its GEMM (`dlmrt/ops/fp8_choice.py`): the candidate configs of
kernels/fp8_gemm.py, the policies, and the plan an Fp8Linear carries (ignored by the CPU twin)."""

from __future__ import annotations

import pytest
import torch

from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.impls.fp8_linear import Fp8Linear
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops import fp8_choice

CUDA = torch.device("cuda")


def test_candidates_fit_the_rows_and_split_only_deep_k():
    small = fp8_choice.candidates(32, 2560, 9728, 132)
    assert {c[0] for c in small} == {64}  # 64-row tiles at 32 rows: the smallest wgmma
    assert any(c[3] > 1 for c in small)  # 40 tiles: K is split
    wide = fp8_choice.candidates(256, 2560, 9728, 132)
    assert {c[0] for c in wide} == {128, 256}
    assert all(c[6] == 1 for c in wide if c[0] == 256 or c[1] == 256)  # big tiles: TMA only
    for bm, bn, _, split, _, _, _ in wide:
        tiles = -(-256 // bm) * -(-2560 // bn)
        assert split == 1 or (9728 // split >= 256 and tiles * split <= 4 * 132)
    wide_n = fp8_choice.candidates(256, 19456, 2560, 132)  # 128 x 64 tiles: 608, never split
    assert {c[3] for c in wide_n if c[:2] == (128, 64)} == {1}
    assert {c[3] for c in wide_n if c[:2] == (256, 128)} == {1, 2, 3}  # 152 tiles


@pytest.mark.parametrize(
    ("policy", "times", "want"),
    [
        ("measured", (20.0, 12.0, (128, 64, 128, 3, 4, 4, 1)), True),
        ("measured", (10.0, 12.0, None), False),
        ("all", (10.0, 12.0, None), True),
        ("none", None, False),
    ],
)
def test_use_fp8_gemm_follows_the_policy_and_returns_the_config(monkeypatch, policy, times, want):
    monkeypatch.setenv("DLMRT_FP8_GEMMS", policy)
    monkeypatch.setattr(fp8_choice, "measure", lambda *a: times or pytest.fail("measured"))
    ok, why, config = fp8_choice.use_fp8_gemm(256, 2560, 9728, CUDA)
    assert ok == want
    if times:
        assert config == times[2] and f"fp8 {times[1]:.1f} us" in why
        assert ("split-K kernel 128x64, K in 3, TMA" if times[2] else "cuBLAS") in why


def test_odd_shapes_and_the_cpu_never_measure(monkeypatch):
    monkeypatch.setattr(fp8_choice, "measure", lambda *a: pytest.fail("measured"))
    assert fp8_choice.use_fp8_gemm(256, 2560, 100, CUDA)[0] is False  # K % 16
    assert fp8_choice.use_fp8_gemm(256, 2560, 96, torch.device("cpu")) == (True, "CPU", None)


def test_the_pinned_gemm_kernel_is_validated(monkeypatch):
    from dlmrt import envs

    monkeypatch.setenv("DLMRT_FP8_GEMM_KERNEL", "cutlass")
    with pytest.raises(ValueError, match="DLMRT_FP8_GEMM_KERNEL='cutlass'"):
        envs.fp8_gemm_kernel()


def test_a_plan_sizes_its_counters_and_the_cpu_twin_ignores_it():
    plan = fp8_ops.GemmPlan.new(256, 2560, (128, 64, 128, 3, 4, 4, 0), torch.device("cpu"))
    assert plan.counts.shape == (2 * 40,) and not plan.counts.any()
    w = quantize_per_channel(torch.randn(48, 64))
    x = torch.randn(256, 64)
    planned, plain = Fp8Linear(w, torch.float32, plan), Fp8Linear(w, torch.float32)
    assert torch.equal(planned(x), plain(x))
    assert "kernel (128, 64, 128, 3, 4, 4, 0) at 256 rows" in repr(planned)


def test_the_plan_moves_with_its_linear():
    plan = fp8_ops.GemmPlan.new(64, 48, (64, 64, 128, 1, 4, 4, 0), torch.device("cpu"))
    lin = Fp8Linear(quantize_per_channel(torch.randn(48, 64)), torch.float32, plan)
    assert "gemm_counts" not in lin.state_dict()  # scratch, not a weight
    lin.to(torch.float64)  # any _apply: the plan's counters stay the module's buffer
    assert lin.plan.counts is lin.gemm_counts and lin.gemm_counts.dtype == torch.int32


def test_measure_times_bf16_cublas_and_every_config_and_skips_one_that_fails(monkeypatch):
    """The start-up choice's bookkeeping (the timer faked; the calls run the CPU twin): the
    fastest FP8 GEMM wins, a config that raises is recorded by its error and never picked."""
    from types import SimpleNamespace

    props = SimpleNamespace(multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(fp8_choice, "COPIES", 2)
    calls = []

    def fake_time(fn, weights):
        fn(weights[0])  # the call itself runs (the CPU twin ignores the plan)
        calls.append(len(calls))
        if len(calls) == 4:
            raise RuntimeError("out of shared memory")
        return 100.0 - len(calls)  # later calls faster: the last config wins

    monkeypatch.setattr(fp8_choice, "cold_time_us", fake_time)
    monkeypatch.setattr(fp8_choice, "_MEASURED", {})
    device = torch.device("cpu")
    configs = fp8_choice.candidates(32, 48, 512, 132)
    bf16, fp8, best = fp8_choice.measure(32, 48, 512, device, fused_input=True)
    assert len(calls) == 2 + len(configs)  # bf16, cuBLAS, then every config
    assert (bf16, fp8, best) == (99.0, 100.0 - len(calls), configs[-1])
    ws, wqs = fp8_choice.cold_weights(48, 512, device)
    times = fp8_choice.kernel_times(32, 48, 512, torch.randn(32, 512), wqs, device)
    assert len(ws) == 2 and set(times) == set(configs)
