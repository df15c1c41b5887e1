"""The dense NVFP4 linear (kernels/linear_nvfp4.py) vs its twin (dequantize, then F.linear).

CPU: the twin is F.linear of the dequantized weight. TRITON_INTERPRET=1 runs the kernel's fp32 cases
on the CPU (block scales passed as fp32: the interpreter's e4m3 casts round wrongly); the device
machine runs them all, bf16 with real e4m3 scales and a captured graph (`pytest -m gpu`).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from dlmrt.ops.nvfp4 import linear_nvfp4
from dlmrt.quant.nvfp4 import Nvfp4Weight, quantize_nvfp4

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if CUDA else "cpu"
kernel_test = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="needs CUDA (or TRITON_INTERPRET=1)"
)


def _weight(n: int, k: int, seed: int, fp32_scales: bool) -> Nvfp4Weight:
    gen = torch.Generator().manual_seed(seed)
    w = quantize_nvfp4(torch.randn(n, k, generator=gen))
    bs = w.block_scale.float() if fp32_scales else w.block_scale
    return Nvfp4Weight(w.packed.to(DEV), bs.to(DEV), w.global_scale.to(DEV))


def _kernel(x, w: Nvfp4Weight, **kw):
    from dlmrt._kernels.linear_nvfp4 import linear_nvfp4 as kernel

    return kernel(x, w.packed, w.block_scale, w.global_scale, **kw)


def test_twin_is_dequantize_then_linear():
    w = _weight(24, 48, 0, fp32_scales=False)
    x = torch.randn(3, 5, 48)
    assert torch.equal(linear_nvfp4(x, w), F.linear(x, w.dequantize(torch.float32)))


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


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 16, 100])
def test_kernel_bf16_e4m3_and_graph_capture(rows):
    w = _weight(136, 272, rows, fp32_scales=False)
    x = torch.randn(rows, 272, device="cuda").to(torch.bfloat16)
    got = linear_nvfp4(x, w)  # the op dispatches to the kernel on CUDA
    want = F.linear(x, w.dequantize(torch.bfloat16))
    torch.testing.assert_close(
        got.float(), want.float(), rtol=2e-2, atol=2e-2 * want.abs().max().item()
    )
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_nvfp4(x, w)
    graph.replay()
    assert torch.equal(out, got)
