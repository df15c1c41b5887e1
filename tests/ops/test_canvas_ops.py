"""DiffusionGemma's arena attention twin (`dlmrt/ops/canvas.py`) against the visibility it states.

Each query row is recomputed alone in fp64 over exactly the arena rows the module docstring of
`kernels/canvas_attention.py` says it sees; the twin's masks and gather must give the same."""

from __future__ import annotations

import pytest
import torch

from dlmrt import ops
from dlmrt.ops import canvas

WINDOW = 6


def _visible(p: int, start: int, rows: int, decoder: bool, window: int) -> range:
    hi = start + rows if decoder else p + 1
    lo = 0 if window == 0 else max(0, (start if decoder else p) - window + 1)
    return range(lo, hi)


def _arena(heads: int, kv_heads: int, dim: int, max_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, 1, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(kv_heads, max_len, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(kv_heads, max_len, dim, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("start", [0, 1, WINDOW - 1, WINDOW, 40])
@pytest.mark.parametrize("rows", [1, 7, 9])
@pytest.mark.parametrize("decoder", [True, False])
@pytest.mark.parametrize("window", [0, WINDOW])
def test_twin_sees_the_stated_ranges(start, rows, decoder, window):
    heads, kv_heads, dim, max_len = 4, 2, 8, 64
    q1, k, v = _arena(heads, kv_heads, dim, max_len, start * 31 + rows)
    q = q1.expand(heads, rows, dim) * torch.linspace(0.5, 2.0, rows, dtype=torch.float64)[:, None]
    pos = torch.arange(start, start + rows)
    got = canvas.canvas_attention(q, k, v, pos, decoder, window, 0.3)
    assert got.shape == (heads, rows, dim)
    for r in range(rows):
        keys = torch.tensor(list(_visible(start + r, start, rows, decoder, window)))
        kk = k[:, keys].repeat_interleave(heads // kv_heads, 0)
        vv = v[:, keys].repeat_interleave(heads // kv_heads, 0)
        w = torch.softmax(q[:, r : r + 1] @ kk.transpose(1, 2) * 0.3, dim=-1)
        torch.testing.assert_close(got[:, r : r + 1], w @ vv, atol=1e-12, rtol=1e-12)


def test_op_runs_the_twin_on_the_cpu():
    """The op on CPU tensors is the twin, bit for bit (the model's CPU tokens do not move)."""
    heads, dim, rows = 4, 16, 5
    q, k, v = (
        torch.randn(s, dtype=torch.bfloat16)
        for s in ((heads, rows, dim), (2, 32, dim), (2, 32, dim))
    )
    pos = torch.arange(9, 9 + rows)
    for decoder, window in ((True, 0), (True, 4), (False, 0), (False, 4)):
        want = canvas.canvas_attention(q, k, v, pos, decoder, window, 1.0)
        assert torch.equal(ops.canvas_attention(q, k, v, pos, decoder, window, 1.0), want)


def test_fp8_arena_is_read_dequantized():
    """An FP8 arena layer gives what its bf16 dequantization gives."""
    q = torch.randn(2, 3, 16, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 20, 16).to(torch.float8_e4m3fn) for _ in range(2))
    pos = torch.arange(4, 7)
    got = canvas.canvas_attention(q, k, v, pos, True, 3, 1.0)
    want = canvas.canvas_attention(q, k.to(torch.bfloat16), v.to(torch.bfloat16), pos, True, 3, 1.0)
    assert torch.equal(got, want)


def test_kernel_fits_the_model_head_dims_only():
    """The op sends to the kernel only head dims its tiles take; the rest (tiny test models'
    head_dim 8) run the twin on CUDA too."""
    assert [
        d for d in (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512) if canvas.kernel_fits(d)
    ] == [16, 32, 64, 128, 256, 384, 512]


def test_key_splits_refuse_a_head_dim_the_merge_pass_cannot_take():
    """Key splits merge in a pass over a power-of-two column range: head 384 (a multiple of 128
    the one-pass kernel takes) with splits is refused before any launch, by name."""
    pytest.importorskip("triton")
    from dlmrt._kernels.canvas_attention import canvas_attention

    q, k, v = (torch.zeros(shape) for shape in ((2, 5, 384), (1, 20, 384), (1, 20, 384)))
    with pytest.raises(ValueError, match="power-of-two head_dim, not 384"):
        canvas_attention(q, k, v, torch.arange(3, 8), True, 0, 1.0, splits=2)
