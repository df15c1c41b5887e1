"""Split-KV arena attention (kernels/arena_attention_split.py) vs `reference.arena_attention`.

Device machine: `pytest -m gpu tests/ops/test_arena_split_gpu.py`. Without CUDA, TRITON_INTERPRET=1
runs the fp32 cases on CPU tensors (small shapes; bf16 and capture need CUDA).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, INTERPRET, kernel_test

from dlmrt import capture_guard
from dlmrt.ops import reference

pytestmark = [pytest.mark.gpu, kernel_test]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
SHAPES = [(4, 2, 32)] + ([(32, 8, 128), (16, 4, 128)] if CUDA else [])


def _case(heads, kv_heads, head_dim, start, rows, block, dtype, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    pos = torch.arange(start, start + rows, device=DEV)
    end = int((pos[-1] // block + 1) * block)
    arena = end + 48
    q = torch.randn(heads, rows, head_dim, device=DEV, generator=gen).to(dtype)
    k = torch.randn(kv_heads, arena, head_dim, device=DEV, generator=gen).to(dtype)
    v = torch.randn(kv_heads, arena, head_dim, device=DEV, generator=gen).to(dtype)
    k[:, end:] = float("nan")  # invisible rows must not leak, even as NaN
    v[:, end:] = float("nan")
    return q, k, v, pos, end


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "start,rows,block",
    [(0, 7, 8), (1, 7, 8), (96, 32, 32), (1000, 32, 32), (0, 256, 256), (768, 256, 256)],
)
@pytest.mark.parametrize("splits", [2, 3, 16])  # 16: more splits than key tiles at short contexts
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_matches_twin(shape, start, rows, block, splits, dtype):
    if dtype == torch.bfloat16 and not CUDA:
        pytest.skip("the Triton interpreter's bf16 tl.dot is wrong")
    if INTERPRET and start * rows > 30_000:
        pytest.skip("slow under the interpreter")
    from dlmrt._kernels.arena_attention_split import arena_attention_split

    q, k, v, pos, end = _case(*shape, start, rows, block, dtype, seed=start + rows + splits)
    scale = shape[2] ** -0.5
    out = arena_attention_split(q, k, v, pos, block, scale, splits)
    ref = reference.arena_attention(
        q.float(), k[:, :end].float(), v[:, :end].float(), pos, block, scale
    )
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


def test_pick_splits_only_for_few_rows_over_long_arenas():
    import dlmrt._kernels.arena_attention_split as split
    from dlmrt._kernels.arena_attention_split import pick_splits

    assert (split.SPLIT_MIN_ROWS, split.SPLIT_MAX_ROWS) == (17, 32)  # on for rounds of 17-32 rows
    assert pick_splits(33, 16, 4096, 132) == 1  # a wider round (or a 2 x 32-row joint pass)
    assert pick_splits(16, 16, 4096, 132) == 1  # a 16-row tile: captures failed (see the kernel)
    assert pick_splits(32, 16, 4096, 132) == 8  # LLaDA's round: 512 arena rows per split at most
    assert pick_splits(256, 32, 16384, 132) == 1  # QwenDLM's 256 rows: one pass (measured faster)
    assert pick_splits(256, 32, 512, 132) == 1  # a short arena: one pass
    assert pick_splits(32, 16, 1024, 132) == 1  # one arena quantum (the demo's joint passes)
    assert pick_splits(32, 16, 2048, 132) == 4  # LLaDA's round at a 1k-token context
    assert pick_splits(1024, 32, 16384, 132) == 1  # prefill: enough row tiles already


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rows,heads,kv_heads", [(32, 16, 4), (256, 32, 8)])
def test_captured_split_follows_the_device_positions(rows, heads, kv_heads):
    """The op's pick (split) inside one captured graph, positions moved on the device."""
    from dlmrt._kernels.arena_attention import arena_attention

    q, k, v, _, _ = _case(heads, kv_heads, 128, 4096 - rows, rows, rows, torch.bfloat16, seed=3)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    pos = torch.arange(rows, device=DEV)
    arena_attention(q, k, v, pos, rows, 0.1)  # autotune outside the capture
    graph = torch.cuda.CUDAGraph()
    with capture_guard.graph(graph):
        out = arena_attention(q, k, v, pos, rows, 0.1)
    for start in (0, 1024, 4096 - rows):
        pos.copy_(torch.arange(start, start + rows, device=DEV))
        graph.replay()
        want = reference.arena_attention(q.float(), k.float(), v.float(), pos, rows, 0.1)
        torch.testing.assert_close(out.float(), want, **TOL[torch.bfloat16])
        assert torch.equal(out, arena_attention(q, k, v, pos, rows, 0.1))
