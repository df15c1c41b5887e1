"""kernels/fp8_gemm.py (the split-K W8A8 GEMM) vs its twin: dequantized operands, fp32 matmul.

On CUDA (`pytest -m gpu` picks these up too): rows 1 / 7 / 32 / 256 / 512, awkward K, every split,
bit-identical on a second call and from a CUDA-graph replay, counters left zeroed. Without CUDA,
TRITON_INTERPRET=1 runs small cases on the CPU (its fp8 dot is exact: fp32 out, compared tightly).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard
from dlmrt.formats.fp8 import quantize_per_channel, quantize_rows

ROWS = (1, 7, 32, 256, 512) if CUDA else (1, 7, 33)
SHAPES = [(48, 336), (1040, 2560), (2560, 9728)] if CUDA else [(48, 336), (130, 272)]
SPLITS = (1, 3, 8) if CUDA else (1, 3)


def _case(rows: int, n: int, k: int):
    g = torch.Generator().manual_seed(rows * 7 + n + k)
    x = torch.randn(rows, k, generator=g)
    x[:, : k // 3] *= 8  # rows with a wide range: the row scale matters
    w = quantize_per_channel(
        torch.randn(n, k, generator=g) / k**0.5 * torch.rand(n, 1, generator=g)
    )
    act = quantize_rows(x)
    want = act.dequantize(torch.float32) @ w.dequantize(torch.float32).t()
    on = lambda t: t.to(DEV)  # noqa: E731
    return on(act.q), on(act.scale), on(w.qweight), on(w.scale), want


def _gemm(a, sa, w, sw, config, dtype):
    from dlmrt._kernels.fp8_gemm import fp8_gemm, tiles

    counts = torch.zeros(
        tiles(a.shape[0], w.shape[0], config[0], config[1]), dtype=torch.int32, device=a.device
    )
    out = fp8_gemm(a, sa, w, sw, counts, dtype, config)
    assert not counts.any(), "the counters must be left zeroed for the next call"
    return out, counts


@kernel_test
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("tma", (0, 1))
def test_fp8_gemm_matches_its_twin(rows, n, k, split, tma):
    a, sa, w, sw, want = _case(rows, n, k)
    bm = 64 if rows <= 64 or not CUDA else 128
    config = (bm, 64, 128 if CUDA else 64, split, 3, 4, tma)
    dtype = torch.bfloat16 if CUDA else torch.float32
    got, counts = _gemm(a, sa, w, sw, config, dtype)
    assert got.shape == (rows, n) and got.dtype == dtype
    tol = 1e-2 if CUDA else 1e-5  # bf16 output: one rounding of the fp32 sum
    torch.testing.assert_close(got.float().cpu(), want, rtol=tol, atol=tol * want.abs().max())
    again, _ = _gemm(a, sa, w, sw, config, dtype)
    assert torch.equal(got, again), "split-K sums must not depend on arrival order"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("split", (1, 4))
@pytest.mark.parametrize("tma", (0, 1))
def test_fp8_gemm_replays_from_a_cuda_graph(split, tma):
    from dlmrt._kernels.fp8_gemm import fp8_gemm, tiles

    a, sa, w, sw, _ = _case(256, 2560, 9728)
    config = (128, 128, 128, split, 4, 8, tma)
    counts = torch.zeros(tiles(256, 2560, 128, 128), dtype=torch.int32, device="cuda")
    eager = fp8_gemm(a, sa, w, sw, counts, torch.bfloat16, config)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fp8_gemm(a, sa, w, sw, counts, torch.bfloat16, config)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        out = fp8_gemm(a, sa, w, sw, counts, torch.bfloat16, config)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and not counts.any()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_the_pinned_kernel_is_picked_and_the_linear_runs_its_plan(monkeypatch):
    from dlmrt.impls.fp8_linear import Fp8Linear
    from dlmrt.ops import fp8 as fp8_ops
    from dlmrt.ops import fp8_choice

    monkeypatch.setenv("DLMRT_FP8_GEMM_KERNEL", "triton")
    ok, why, config = fp8_choice.use_fp8_gemm(256, 2560, 9728, torch.device("cuda"))
    assert config is not None and "split-K kernel" in why
    a, sa, w, sw, want = _case(256, 2560, 9728)
    plan = fp8_ops.GemmPlan.new(256, 2560, config, torch.device("cuda"))
    lin = Fp8Linear(fp8_ops.Fp8Weight(w, sw), torch.bfloat16, plan)
    got = lin(fp8_ops.QuantAct(a, sa))
    torch.testing.assert_close(got.float().cpu(), want, rtol=1e-2, atol=1e-2 * want.abs().max())
