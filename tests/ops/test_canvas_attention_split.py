"""kernels/canvas_attention_split.py: the key-split canvas attention vs its masked-SDPA twin and
the whole kernel, its split count, and the DLMRT_CANVAS_ATTN choice (`dlmrt/ops/canvas_launch.py`).

The kernel tests run on a CUDA device (`pytest -m gpu`) or under TRITON_INTERPRET=1 on the CPU
(fp32 at head dims 16 / 32 there; bf16, DiffusionGemma's shapes and capture need CUDA).
Tolerance: fp32 2e-4 against the twin (the whole kernel's), 1e-5 against the whole kernel (the
same products, only the order of the fp32 additions differs); bf16 2e-2.
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, kernel_test

from dlmrt import capture_guard, ops
from dlmrt.ops import canvas, canvas_launch, choices

needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")
TWIN_TOL = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
WHOLE_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
WINDOW = 24
BLOCK_N_CPU = 16  # the interpreter's key tile (kernels/canvas_attention.py)


def _case(heads, kv_heads, head_dim, start, rows, dtype, seed):
    """q, and an arena layer whose rows past the pass (never visible) hold NaN."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    arena = start + rows + 40
    q = torch.randn(heads, rows, head_dim, device=DEV, generator=gen).to(dtype)
    k = torch.randn(kv_heads, arena, head_dim, device=DEV, generator=gen).to(dtype)
    v = torch.randn(kv_heads, arena, head_dim, device=DEV, generator=gen).to(dtype)
    k[:, start + rows :] = float("nan")
    v[:, start + rows :] = float("nan")
    return q, k, v, torch.arange(start, start + rows, device=DEV)


def _check(q, k, v, pos, decoder, window, splits):
    from dlmrt._kernels import canvas_attention as whole
    from dlmrt._kernels import canvas_attention_split as split

    out = split.canvas_attention(q, k, v, pos, decoder, window, 1.0, splits)
    k0, v0 = k.float().nan_to_num(0.0), v.float().nan_to_num(0.0)  # SDPA's 0 * NaN is NaN
    ref = canvas.canvas_attention(q.float(), k0, v0, pos, decoder, window, 1.0)
    assert out.shape == q.shape and out.dtype == q.dtype and not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, **TWIN_TOL[q.dtype])
    one = whole.canvas_attention(q, k, v, pos, decoder, window, 1.0)
    torch.testing.assert_close(out, one, **WHOLE_TOL[q.dtype])


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _empty_splits(start, rows, window, splits, block_n) -> int:
    """How many of the splits of one row tile's keys hold no key tile, by `_split_ranges`'
    arithmetic on the host (canvas and context pass alike: [start - window + 1, start + rows))."""
    lo, hi = (max(0, start - window + 1) if window else 0), start + rows
    first = lo // block_n * block_n
    chunk = _cdiv(_cdiv(hi - first, splits), block_n) * block_n
    return sum(first + s * chunk >= hi for s in range(splits))


@kernel_test
@pytest.mark.parametrize("head_dim", [16, 32])
@pytest.mark.parametrize("start", [0, WINDOW, 5 * WINDOW + 3])
@pytest.mark.parametrize("decoder", [True, False])
@pytest.mark.parametrize("window", [0, WINDOW])
@pytest.mark.parametrize("splits", [1, 2, 3, 8])
def test_split_matches_twin_and_whole(head_dim, start, decoder, window, splits):
    """fp32, 4 heads over 2 KV heads, 20 rows (a padded row tile): full and sliding, canvas and
    context pass, 1 to 8 splits (8 over a short range: several splits hold no key)."""
    q, k, v, pos = _case(4, 2, head_dim, start, 20, torch.float32, seed=start + splits)
    _check(q, k, v, pos, decoder, window, splits)


@kernel_test
@pytest.mark.parametrize("decoder", [True, False])
def test_a_split_with_no_valid_key(decoder):
    """A 7-row pass at the arena's start: one 16-key tile, 4 splits, three of them empty."""
    assert _empty_splits(0, 7, WINDOW, 4, BLOCK_N_CPU) == 3
    q, k, v, pos = _case(4, 2, 16, 0, 7, torch.float32, seed=3)
    _check(q, k, v, pos, decoder, WINDOW, 4)


@pytest.mark.parametrize(("head_dim", "kind"), [(256, "sliding"), (512, "full")])
def test_diffusion_gemma_shapes_fill_two_waves(head_dim, kind):
    """DiffusionGemma-26B's canvas (256 rows, 16 heads) at a 1k context on an H100's 132 SMs:
    at least 2 x 132 programs, each split over >= 2 key tiles (the shipped tiles)."""
    pytest.importorskip("triton")  # the kernels' modules (the CPU wheel has no Triton)
    from dlmrt._kernels import canvas_attention as whole
    from dlmrt._kernels import canvas_attention_split as split

    tiles = whole.launch_tile(head_dim, False)
    window = 1024 if kind == "sliding" else 0
    keys = split.key_span(1024 + 256 + 64, 256, window)
    n = split.pick_splits(256, 16, head_dim, keys, 132, tiles)
    programs = 256 // tiles[0] * 16 * (head_dim // tiles[3]) * n
    assert programs >= 2 * 132 and programs < 4 * 132
    assert keys // n >= split.MIN_TILES * tiles[1]
    assert n > tiles[6]  # more splits than the whole kernel's


def test_pick_splits_bounds():
    pytest.importorskip("triton")  # the kernel's module (the CPU wheel has no Triton)
    from dlmrt._kernels import canvas_attention_split as split

    tiles = (64, 32, 128, 128, 4, 3, 1)
    assert split.pick_splits(256, 16, 256, 100, 132, tiles) == 1  # too few keys to split
    assert split.pick_splits(8, 1, 256, 1 << 20, 132, tiles) == split.MAX_SPLITS
    assert split.pick_splits(256, 16, 384, 4096, 132, tiles) == 1  # not a power of two
    assert split.key_span(5000, 256, 1024) == 1279 and split.key_span(5000, 256, 0) == 5000
    with pytest.raises(ValueError, match="sms 0"):
        split.pick_splits(256, 16, 256, 4096, 0, tiles)


@pytest.fixture
def _fresh():
    canvas_launch.forget()
    yield
    canvas_launch.forget()


def test_whole_by_default_a_pin_and_a_bad_value(monkeypatch, _fresh):
    monkeypatch.delenv("DLMRT_CANVAS_ATTN", raising=False)
    assert canvas_launch.kernel() == "whole"
    assert choices.get(canvas_launch.KERNEL_KEY).why.startswith("DLMRT_CANVAS_ATTN=whole")
    monkeypatch.setenv("DLMRT_CANVAS_ATTN", "Split")
    assert canvas_launch.kernel() == "whole"  # decided once
    ops.use(None)  # re-resolves from the environment
    assert canvas_launch.kernel() == "split"
    canvas_launch.forget()
    monkeypatch.setenv("DLMRT_CANVAS_ATTN", "maybe")
    with pytest.raises(ValueError, match="DLMRT_CANVAS_ATTN='maybe'"):
        canvas_launch.kernel()


@kernel_test
def test_the_split_pin_runs_the_split_kernel(monkeypatch, _fresh):
    """DLMRT_CANVAS_ATTN=split: `canvas_launch.attention` records a split count for the shape and
    runs it (the twin's output)."""
    monkeypatch.setenv("DLMRT_CANVAS_ATTN", "split")
    q, k, v, pos = _case(4, 2, 32, 200, 20, torch.float32, seed=11)  # a 260-row arena
    out = canvas_launch.attention(q, k, v, pos, True, 0, 1.0)
    ref = canvas.canvas_attention(q, k.nan_to_num(0.0), v.nan_to_num(0.0), pos, True, 0, 1.0)
    torch.testing.assert_close(out, ref, **TWIN_TOL[torch.float32])
    (launch,) = choices.recorded("canvas attention launch")
    n = canvas_launch.splits(q, k, 0)
    assert n == 4 and launch.pick == "4 key splits"  # 260 keys // (2 x 32-key tiles)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(("kv_heads", "head_dim", "window"), [(8, 256, 1024), (2, 512, 0)])
@pytest.mark.parametrize("decoder", [True, False])
def test_diffusion_gemma_shape_bf16(kv_heads, head_dim, window, decoder):
    """DiffusionGemma's layers, 256 rows at a 1k context, bf16, the default split count."""
    q, k, v, pos = _case(16, kv_heads, head_dim, 1000, 256, torch.bfloat16, seed=head_dim)
    _check(q, k, v, pos, decoder, window, None)


@needs_cuda
@pytest.mark.gpu
def test_captured_split_follows_the_device_start():
    """One captured graph, the pass start moved on the device: each replay == eager at that start."""
    from dlmrt._kernels.canvas_attention_split import canvas_attention

    q, k, v, _ = _case(16, 2, 512, 600, 256, torch.bfloat16, seed=9)
    pos = torch.arange(256, device=DEV) + 100
    for window in (0, WINDOW):
        canvas_attention(q, k, v, pos, True, window, 1.0)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with capture_guard.graph(graph):
            out = canvas_attention(q, k, v, pos, True, window, 1.0)
        for start in (0, 37, 344):
            pos.copy_(torch.arange(start, start + 256, device=DEV))
            graph.replay()
            assert torch.equal(out, canvas_attention(q, k, v, pos, True, window, 1.0))


def test_benchmark_step_totals_weigh_the_layer_counts():
    """The benchmark's step sum: DiffusionGemma-26B's 25 sliding and 5 full layers."""
    from benchmark_modules import benchmark

    bench = benchmark("kernels.canvas_attention_split")
    rows = [
        {"context": 1024, "kind": "sliding_attention", "floor_us": 1.0, "paths": [{"us": 10}, {"us": 5}]},
        {"context": 1024, "kind": "full_attention", "floor_us": 2.0, "paths": [{"us": 20}, {"us": 8}]},
    ]  # fmt: skip
    assert bench.step_totals(rows) == {"1024": {"whole": 350.0, "split": 165.0, "floor": 35.0}}
