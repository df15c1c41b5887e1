"""kernels/canvas_attention.py vs its masked-SDPA twin (`dlmrt/ops/canvas.py`) over awkward sizes.

Device machine: `pytest -m gpu tests/ops/test_canvas_attention_gpu.py`. Without CUDA,
TRITON_INTERPRET=1 runs the fp32 cases on CPU tensors at small head dims (the interpreter's bf16
tl.dot and FP8 casts are wrong, so bf16 / FP8 / capture need CUDA).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, INTERPRET, kernel_test

from dlmrt import capture_guard
from dlmrt.ops import canvas

pytestmark = [pytest.mark.gpu, kernel_test]
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
TOL = {
    torch.float32: dict(atol=2e-4, rtol=2e-4),  # H200 fp32 sums over d = 512: up to 1.1e-4 apart
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}
WINDOW = 24  # small enough that "much longer than the window" stays a small arena
# (heads, kv_heads, head_dim): tiny; DiffusionGemma's sliding (256) and full (512) layers on CUDA
SHAPES = [(4, 2, 32)] + ([(16, 8, 256), (16, 2, 512)] if CUDA else [])


def _case(heads, kv_heads, head_dim, start, rows, dtype, seed):
    """q, and an arena layer whose rows past the pass (never visible) hold NaN."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    max_len = start + rows + 40
    q = torch.randn(heads, rows, head_dim, device=DEV, generator=gen).to(dtype)
    k = torch.randn(kv_heads, max_len, head_dim, device=DEV, generator=gen).to(dtype)
    v = torch.randn(kv_heads, max_len, head_dim, device=DEV, generator=gen).to(dtype)
    k[:, start + rows :] = float("nan")
    v[:, start + rows :] = float("nan")
    return q, k, v, torch.arange(start, start + rows, device=DEV)


def _check(q, k, v, pos, decoder, window, dtype, splits=None):
    from dlmrt._kernels.canvas_attention import canvas_attention

    scale = 1.0
    out = canvas_attention(q, k, v, pos, decoder, window, scale, splits=splits)
    k0, v0 = k.float().nan_to_num(0.0), v.float().nan_to_num(0.0)  # SDPA's 0 * NaN is NaN
    ref = canvas.canvas_attention(q.float(), k0, v0, pos, decoder, window, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("start", [0, 1, WINDOW - 1, WINDOW, 10 * WINDOW + 3])
@pytest.mark.parametrize("rows", [7, 32, 256])
@pytest.mark.parametrize("decoder", [True, False])
@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_twin(shape, start, rows, decoder, window, dtype):
    """Context 0 / 1 / window-1 / window / much longer; a canvas shorter than a tile (7 rows)."""
    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("the Triton interpreter's bf16 tl.dot is wrong")
    if INTERPRET and rows == 256 and start > WINDOW:
        pytest.skip("slow under the interpreter")
    q, k, v, pos = _case(*shape, start, rows, dtype, seed=start * 13 + rows)
    _check(q, k, v, pos, decoder, window, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("start", [0, WINDOW, 10 * WINDOW + 3])
@pytest.mark.parametrize("rows", [7, 70])
@pytest.mark.parametrize("decoder", [True, False])
@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_key_splits_match_twin(shape, start, rows, decoder, window, splits, dtype):
    """Keys split across programs, merged by the second pass: a split may hold no key at all (a
    short range), or only masked edge tiles."""
    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("the Triton interpreter's bf16 tl.dot is wrong")
    q, k, v, pos = _case(*shape, start, rows, dtype, seed=start * 7 + rows + splits)
    _check(q, k, v, pos, decoder, window, dtype, splits)


@needs_cuda
@pytest.mark.parametrize("window", [0, WINDOW])
def test_fp8_arena_reads_dequantized(window):
    """An e4m3 arena layer: the kernel converts in registers what the twin converts up front."""
    from dlmrt._kernels.canvas_attention import canvas_attention

    q, k, v, pos = _case(16, 2, 512, 300, 256, torch.bfloat16, seed=5)
    k8, v8 = (t.nan_to_num(0.0).to(torch.float8_e4m3fn) for t in (k, v))
    out = canvas_attention(q, k8, v8, pos, True, window, 1.0)
    ref = canvas.canvas_attention(q.float(), k8.float(), v8.float(), pos, True, window, 1.0)
    torch.testing.assert_close(out.float(), ref, **TOL[torch.bfloat16])


@needs_cuda
def test_captured_kernel_follows_the_device_start():
    """One captured graph, the pass start moved on the device: each replay == eager at that start."""
    from dlmrt._kernels.canvas_attention import canvas_attention

    q, k, v, _ = _case(16, 8, 256, 600, 256, torch.bfloat16, seed=9)
    pos = torch.arange(256, device=DEV) + 100
    for decoder in (True, False):
        canvas_attention(q, k, v, pos, decoder, WINDOW, 1.0)  # autotune outside the capture
        graph = torch.cuda.CUDAGraph()
        with capture_guard.graph(graph):
            out = canvas_attention(q, k, v, pos, decoder, WINDOW, 1.0)
        for start in (0, 37, 344):
            pos.copy_(torch.arange(start, start + 256, device=DEV))
            graph.replay()
            assert torch.equal(out, canvas_attention(q, k, v, pos, decoder, WINDOW, 1.0))
