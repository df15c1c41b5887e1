"""DiffusionGemma's fused layer ops (kernels/gemma_norms.py, qk_norm_rope.py's Gemma mode, the GeGLU
activation in silu_mul.py) vs their twins in `dlmrt/ops/gemma.py`, which are the model's former
torch code.

CPU: the twins on fp32 / bf16 inputs equal that former code bit for bit (`test_twins_are_the_
former_layer_code`). Kernels: `pytest -m gpu tests/ops/test_gemma_norms.py` on the device machine
(fp32 and bf16), or without CUDA under TRITON_INTERPRET=1 (fp32 only: the interpreter's bf16 casts
are not the GPU's).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_env import CUDA, DEV, DTYPES, kernel_test

from dlmrt.models.layers import proportional_rope_cos_sin
from dlmrt.ops import gemma
from dlmrt.ops.reference import gemma_rms_norm, rotate

EPS = 1e-6


def _tol(dtype: torch.dtype) -> dict:
    # bf16: the kernels' tree sums and exp-based tanh differ from torch's in the last fp32 bits,
    # which can move a rounding by one bf16 step (2^-8 relative)
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)


def _randn(*shape, gen, dtype, scale=1.0):
    return (scale * torch.randn(*shape, generator=gen)).to(DEV, dtype)


def _gains(n: int, gen, dtype, count: int) -> tuple[torch.Tensor, ...]:
    return tuple(_randn(n, gen=gen, dtype=dtype, scale=0.3) + 1 for _ in range(count))


def _kernels():
    from dlmrt._kernels import gemma_norms, qk_norm_rope, silu_mul

    return gemma_norms, qk_norm_rope, silu_mul


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_twins_are_the_former_layer_code(dtype):
    """The twins reproduce the layer's former torch lines exactly (CPU: the model's own path)."""
    gen = torch.Generator().manual_seed(0)
    rows, n = 6, 40
    attn, h, dense, moe = (torch.randn(rows, n, generator=gen).to(dtype) for _ in range(4))
    w = [(1 + 0.3 * torch.randn(n, generator=gen)).to(dtype) for _ in range(7)]
    scale, root = w[6], n**-0.5
    r = h + gemma_rms_norm(attn, w[0], EPS)
    got = gemma.attn_residual(attn, h, (w[0], w[1], w[2]), scale, root, EPS)
    want = (r, gemma_rms_norm(r, w[1], EPS), gemma_rms_norm(r, w[2], EPS))
    want += (gemma_rms_norm(r, None, EPS) * scale * root,)
    for g, x in zip(got, want, strict=True):
        assert torch.equal(g, x)
    is_canvas = torch.tensor([True, False] * 3).unsqueeze(1)
    scalars = (torch.tensor([0.5]).to(dtype), torch.tensor([2.0]).to(dtype))
    out = r + gemma_rms_norm(
        gemma_rms_norm(dense, w[3], EPS) + gemma_rms_norm(moe, w[4], EPS), w[5], EPS
    )
    want_out = out * torch.where(is_canvas, *scalars)
    got_out = gemma.layer_out(dense, moe, r, (w[3], w[4], w[5]), is_canvas, scalars, EPS)
    assert torch.equal(got_out, want_out)
    assert not torch.equal(want_out[0], out[0])  # the scalars did something


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 48), (7, 96), (33, 200)])
def test_attn_residual_and_layer_out_kernels_match_twins(dtype, rows, n):
    kernels, _, _ = _kernels()
    gen = torch.Generator().manual_seed(rows + n)
    attn, h, dense, moe = (_randn(rows, n, gen=gen, dtype=dtype, scale=3) for _ in range(4))
    w = _gains(n, gen, dtype, 7)
    root = n**-0.5
    got = kernels.attn_residual(attn, h, w[:3], w[6], root, EPS)
    want = gemma.attn_residual(attn.cpu(), h.cpu(), [x.cpu() for x in w[:3]], w[6].cpu(), root, EPS)
    for g, x in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), x, **_tol(dtype))
    flags = torch.arange(rows) % 3 == 0
    scalars = (torch.tensor([0.75]).to(DEV, dtype), torch.tensor([1.5]).to(DEV, dtype))
    r = want[0].to(DEV)
    got = kernels.layer_out(dense, moe, r, w[3:6], flags.to(DEV).view(torch.uint8), scalars, EPS)
    want = gemma.layer_out(
        dense.cpu(),
        moe.cpu(),
        r.cpu(),
        [x.cpu() for x in w[3:6]],
        flags.unsqueeze(1),
        [s.cpu() for s in scalars],
        EPS,
    )
    torch.testing.assert_close(got.cpu(), want, **_tol(dtype))


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,heads,d,factor", [(1, 2, 16, 1.0), (5, 3, 64, 0.25), (9, 1, 128, 1.0)]
)
def test_gemma_qk_norm_rope_and_v_norm_kernels_match_twins(dtype, rows, heads, d, factor):
    """Strided [rows, heads, d] views of a fused q|k|v output, partial ("proportional") RoPE."""
    _, kernel, _ = _kernels()
    gen = torch.Generator().manual_seed(rows * d)
    fused = _randn(rows, 3 * heads * d, gen=gen, dtype=dtype, scale=2)
    x = fused[:, heads * d : 2 * heads * d].view(rows, heads, d)
    w = _gains(d, gen, dtype, 1)[0]
    pos = torch.arange(rows, device=DEV) * 37 + 5
    cos, sin = proportional_rope_cos_sin(pos, d, 1e4, factor, dtype)
    got = kernel.qk_norm_rope(x, w, cos, sin, EPS, gemma=True)
    cpu = [t.cpu() for t in (x, w, cos, sin)]
    want = rotate(gemma_rms_norm(cpu[0], cpu[1], EPS), cpu[2], cpu[3]).transpose(0, 1)
    assert got.shape == (heads, rows, d)
    torch.testing.assert_close(got.cpu(), want, **_tol(dtype))
    got_v = kernel.qk_norm_rope(x, None, None, None, EPS, gemma=True)
    torch.testing.assert_close(got_v.cpu(), gemma.v_norm(cpu[0], EPS), **_tol(dtype))


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,heads,d", [(1, 2, 16), (7, 2, 64), (33, 1, 128)])
def test_gemma_k_and_v_norms_written_at_arena_rows(dtype, rows, heads, d):
    """The K / V norms written straight into arena rows equal the twins' values written there;
    no other arena row changes (what `ArenaContext.attend` relies on)."""
    _, kernel, _ = _kernels()
    gen = torch.Generator().manual_seed(rows + d)
    x = _randn(rows, heads, d, gen=gen, dtype=dtype, scale=2)
    w = _gains(d, gen, dtype, 1)[0]
    pos = (torch.randperm(3 * rows + 4, generator=gen)[:rows] + 2).to(DEV)
    cos, sin = proportional_rope_cos_sin(pos, d, 1e4, 1.0, dtype)
    k_arena = torch.full((heads, 3 * rows + 8, d), 7.0, device=DEV, dtype=dtype)
    v_arena = k_arena.clone()
    kernel.qk_norm_rope(x, w, cos, sin, EPS, k_arena, pos, gemma=True)
    kernel.qk_norm_rope(x, None, None, None, EPS, v_arena, pos, gemma=True)
    cpu = [t.cpu() for t in (x, w, cos, sin, pos)]
    k_want = torch.full((heads, 3 * rows + 8, d), 7.0, dtype=dtype)
    v_want = k_want.clone()
    gemma.qk_norm_rope(cpu[0], cpu[1], cpu[2], cpu[3], EPS, k_want, cpu[4])  # the twin path
    gemma.v_norm(cpu[0], EPS, v_want, cpu[4])
    torch.testing.assert_close(k_arena.cpu(), k_want, **_tol(dtype))
    torch.testing.assert_close(v_arena.cpu(), v_want, **_tol(dtype))
    untouched = torch.ones(3 * rows + 8, dtype=torch.bool)
    untouched[cpu[4]] = False
    assert (k_arena.cpu()[:, untouched] == 7.0).all() and (v_arena.cpu()[:, untouched] == 7.0).all()


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 40), (6, 1500)])
def test_gelu_mul_kernel_matches_twin(dtype, rows, n):
    _, _, kernel = _kernels()
    gen = torch.Generator().manual_seed(n)
    gate_up = _randn(rows, 2 * n, gen=gen, dtype=dtype, scale=3)
    gate_up[0, :4] = torch.tensor([-30.0, 30.0, 0.0, -1e-3])  # tails and zero of the tanh
    got = kernel.silu_mul(gate_up, gelu=True)
    gate, up = gate_up.cpu().chunk(2, dim=-1)
    torch.testing.assert_close(got.cpu(), F.gelu(gate, approximate="tanh") * up, **_tol(dtype))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_ops_take_the_kernels_on_cuda_as_the_model_calls_them(dtype):
    """Through `dlmrt.ops.gemma` as the layer calls it (is_canvas a [rows, 1] bool, q from a
    fused projection's view): CUDA results equal the CPU twins' within rounding."""
    gen = torch.Generator().manual_seed(3)
    rows, n, heads, d = 9, 96, 2, 32
    attn, h, dense, moe = (_randn(rows, n, gen=gen, dtype=dtype, scale=3) for _ in range(4))
    w = _gains(n, gen, dtype, 7)
    is_canvas = (torch.arange(rows, device=DEV) >= 4).unsqueeze(1)
    scalars = (torch.tensor([0.75]).to(DEV, dtype), torch.tensor([1.5]).to(DEV, dtype))
    cpu = lambda ts: [t.cpu() for t in ts]  # noqa: E731
    got = gemma.attn_residual(attn, h, w[:3], w[6], n**-0.5, EPS)
    want = gemma.attn_residual(attn.cpu(), h.cpu(), cpu(w[:3]), w[6].cpu(), n**-0.5, EPS)
    for g, x in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), x, **_tol(dtype))
    got = gemma.layer_out(dense, moe, h, w[3:6], is_canvas, scalars, EPS)
    want = gemma.layer_out(*cpu((dense, moe, h)), cpu(w[3:6]), is_canvas.cpu(), cpu(scalars), EPS)
    torch.testing.assert_close(got.cpu(), want, **_tol(dtype))
    qkv = _randn(rows, 3 * heads * d, gen=gen, dtype=dtype)
    q = qkv[:, : heads * d].view(rows, heads, d)
    cos, sin = proportional_rope_cos_sin(torch.arange(rows, device=DEV), d, 1e4, 0.5, dtype)
    got = gemma.qk_norm_rope(q, w[0][:d].contiguous(), cos, sin, EPS)
    want = gemma.qk_norm_rope(*cpu((q, w[0][:d], cos, sin)), EPS)
    torch.testing.assert_close(got.cpu(), want, **_tol(dtype))
    torch.testing.assert_close(
        gemma.v_norm(q, EPS).cpu(), gemma.v_norm(q.cpu(), EPS), **_tol(dtype)
    )
    torch.testing.assert_close(gemma.gelu_mul(qkv).cpu(), gemma.gelu_mul(qkv.cpu()), **_tol(dtype))
