"""The dense NVFP4 linear (kernels/linear_nvfp4.py) vs its twin (dequantize, then F.linear).

CPU: the twin is F.linear of the dequantized weight. TRITON_INTERPRET=1 runs the kernel's fp32 cases
on the CPU (block scales passed as fp32: the interpreter's e4m3 casts round wrongly); the device
machine runs them all, bf16 with real e4m3 scales and a captured graph (`pytest -m gpu`).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard
from dlmrt.formats.nvfp4 import Nvfp4Weight, cat_rows, quantize_nvfp4
from dlmrt.ops.nvfp4 import fake_quant_act, linear_nvfp4


def _weight(n: int, k: int, seed: int, fp32_scales: bool) -> Nvfp4Weight:
    gen = torch.Generator().manual_seed(seed)
    w = quantize_nvfp4(torch.randn(n, k, generator=gen))
    bs = w.block_scale.float() if fp32_scales else w.block_scale
    return Nvfp4Weight(w.packed.to(DEV), bs.to(DEV), w.global_scale.to(DEV))


def _gate_up(n: int, k: int, seed: int, fp32_scales: bool) -> Nvfp4Weight:
    """gate|up stacked (`cat_rows`), up 100x larger: the halves' global scales differ 100x."""
    gen = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(n, k, generator=gen), torch.randn(n, k, generator=gen) * 100
    w = cat_rows([quantize_nvfp4(gate), quantize_nvfp4(up)])
    bs = w.block_scale.float() if fp32_scales else w.block_scale
    return Nvfp4Weight(w.packed.to(DEV), bs.to(DEV), w.global_scale.to(DEV))


def _row_scaled(n: int, k: int, seed: int, fp32_scales: bool) -> Nvfp4Weight:
    """Every output row its own global scale (0.25 .. 4x the quantized one)."""
    w = _weight(n, k, seed, fp32_scales)
    gen = torch.Generator().manual_seed(seed + 1)
    g = w.global_scale.cpu() * torch.exp2(torch.randint(-2, 3, (n,), generator=gen).float())
    return Nvfp4Weight(w.packed, w.block_scale, (g * (1 + torch.rand(n, generator=gen))).to(DEV))


def _kernel(x, w: Nvfp4Weight, **kw):
    from dlmrt._kernels.linear_nvfp4 import linear_nvfp4 as kernel

    return kernel(x, w.packed, w.block_scale, w.global_scale, **kw)


def test_twin_is_dequantize_then_linear():
    w = _weight(24, 48, 0, fp32_scales=False)
    x = torch.randn(3, 5, 48)
    assert torch.equal(linear_nvfp4(x, w), F.linear(x, w.dequantize(torch.float32)))


def test_per_row_global_scales_dequantize_to_the_concatenated_halves():
    """cat_rows: one weight whose per-row global scale gives each half its own, bit for bit."""
    gen = torch.Generator().manual_seed(4)
    gate = quantize_nvfp4(torch.randn(24, 48, generator=gen))
    up = quantize_nvfp4(torch.randn(40, 48, generator=gen) * 100)
    w = cat_rows([gate, up])
    assert w.per_row and w.global_scale.shape == (64,) and not gate.per_row
    assert w.global_scale[0] != w.global_scale[-1]
    for dtype in (torch.float32, torch.bfloat16):
        want = torch.cat([gate.dequantize(dtype), up.dequantize(dtype)])
        assert torch.equal(w.dequantize(dtype), want)
    half = w.narrow(24, 40)  # a view of the up rows, with their scales
    assert torch.equal(half.dequantize(torch.float32), up.dequantize(torch.float32))
    x = torch.randn(5, 48, generator=gen)
    assert torch.equal(
        linear_nvfp4(x, w),
        F.linear(x, torch.cat([gate.dequantize(x.dtype), up.dequantize(x.dtype)])),
    )
    with_scales = [
        Nvfp4Weight(q.packed, q.block_scale, q.global_scale, torch.tensor(s))
        for q, s in ((gate, 0.003), (up, 0.005))
    ]
    assert cat_rows(with_scales).input_scale == 0.005  # one shared input: the larger scale
    assert cat_rows([with_scales[0], up]).input_scale is None


def test_act_scale_quantizes_the_input_first():
    """W4A4 emulation of a dense linear: fake_quant_act(x), then the W4A16 op."""
    w = _weight(24, 48, 0, fp32_scales=False)
    x = torch.randn(3, 48, generator=torch.Generator().manual_seed(2))
    scale = torch.tensor(0.004)
    got = linear_nvfp4(x, w, act_scale=scale)
    assert torch.equal(got, F.linear(fake_quant_act(x, scale), w.dequantize(torch.float32)))
    assert not torch.equal(got, linear_nvfp4(x, w))


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("make", [_gate_up, _row_scaled])
@pytest.mark.parametrize("rows, n, k, bk", [(1, 40, 96, 128), (7, 36, 128, 64), (33, 20, 272, 32)])
def test_kernel_per_row_global_scale_matches_the_twin_fp32(make, rows, n, k, bk):
    """A global scale per output row ([N], gate|up as one GEMM): each column its own scale; N
    (2n for gate|up) not a multiple of the tile, so a tile straddles the two halves."""
    w = make(n, k, rows, fp32_scales=not CUDA)
    assert w.per_row and w.global_scale.unique().numel() > 1
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).to(DEV)
    got = _kernel(x, w, bk=bk)
    want = F.linear(x, w.dequantize(torch.float32))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    if make is _gate_up:  # each half as its own GEMM: the same numbers
        gate, up = w.narrow(0, n), w.narrow(n, n)
        tol = {"rtol": 1e-5, "atol": 1e-5 * want.abs().max().item()}
        torch.testing.assert_close(got[:, n:], _kernel(x, up, bk=bk), **tol)
        torch.testing.assert_close(got[:, :n], _kernel(x, gate, bk=bk), **tol)


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("rows, n, k, bk", [(1, 40, 96, 128), (7, 64, 128, 64), (33, 24, 272, 32)])
def test_kernel_matches_the_twin_fp32(rows, n, k, bk):
    """Awkward sizes: N not a multiple of the tile, K shorter than a K tile, rows over one tile."""
    w = _weight(n, k, rows, fp32_scales=not CUDA)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).to(DEV)
    got = _kernel(x, w, bk=bk)
    want = F.linear(x, w.dequantize(torch.float32))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_kernel_names_a_weight_that_does_not_fit():
    pytest.importorskip("triton")
    w = _weight(8, 32, 0, fp32_scales=True)
    with pytest.raises(ValueError, match="does not fit packed"):
        _kernel(torch.randn(2, 48), w)
    bad = Nvfp4Weight(w.packed, w.block_scale, torch.ones(3))
    with pytest.raises(ValueError, match=r"global_scale \[3\]: expected one value or one per"):
        _kernel(torch.randn(2, 32), bad)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 16, 100])
@pytest.mark.parametrize("make", [_weight, _gate_up])
def test_kernel_bf16_e4m3_and_graph_capture(rows, make):
    w = make(136, 272, rows, fp32_scales=False)
    x = torch.randn(rows, 272, device="cuda").to(torch.bfloat16)
    got = linear_nvfp4(x, w)  # the op dispatches to the kernel on CUDA
    want = F.linear(x, w.dequantize(torch.bfloat16))
    torch.testing.assert_close(
        got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item()
    )
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        out = linear_nvfp4(x, w)
    graph.replay()
    assert torch.equal(out, got)
