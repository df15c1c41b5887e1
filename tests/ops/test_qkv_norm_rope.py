"""q|k|v norm + RoPE + arena writes in one launch (kernels/qk_norm_rope.py: `qkv_norm_rope`), and
partial rotary (RoPE over the first `rot` dims of a head: LLaDA2) in both kernels, vs their twins.

CPU: the partial-rotary twin equals LLaDA2's former torch lines bit for bit. Kernels: `pytest -m gpu
tests/ops/test_qkv_norm_rope.py` on the device machine (fp32, bf16, an FP8 arena), or without CUDA
under TRITON_INTERPRET=1 (fp32 only: the interpreter's bf16 casts are not the GPU's).
"""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, DTYPES, kernel_test

from dlmrt.models.layers import rope_cos_sin
from dlmrt.ops import reference

EPS = 1e-6
# bf16: the kernel's tree sum of squares differs from torch's in the last fp32 bits, which can move
# a rounding by one bf16 step
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=1e-2)}


def _inputs(rows, heads, kv, d, rot, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (heads + 2 * kv) * d + 8, generator=gen)[:, 8:]  # a strided view
    qkv = qkv.to(DEV, dtype).view(rows, heads + 2 * kv, d)
    qw, kw = ((1 + 0.2 * torch.randn(d, generator=gen)).to(DEV, dtype) for _ in range(2))
    pos = (torch.randperm(4 * rows + 8, generator=gen)[:rows] + 3).to(DEV)
    cos, sin = rope_cos_sin(pos, rot, 1e4, dtype)
    return qkv, qw, kw, pos, cos, sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_partial_twin_is_lladas_former_code(dtype):
    """RoPE over the first rot dims, the rest unchanged: LLaDA2's former norm + cat lines."""
    qkv, qw, _, _, cos, sin = _inputs(5, 4, 2, 16, 8, dtype, 0)
    q = qkv[:, :4]
    normed = reference.rms_norm(q.reshape(-1, 16), qw, EPS).view(5, 4, 16)
    want = torch.cat((reference.rotate(normed[..., :8], cos, sin), normed[..., 8:]), dim=-1)
    got = reference.qk_norm_rope(q, qw, cos, sin, EPS)
    assert torch.equal(got, want.transpose(0, 1))
    assert torch.equal(got[..., 8:], normed[..., 8:].transpose(0, 1))  # passed through
    assert not torch.equal(got[..., :8], normed[..., :8].transpose(0, 1))  # rotated


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,heads,d,rot", [(1, 2, 64, 32), (13, 8, 128, 64), (33, 4, 64, 64)])
@pytest.mark.parametrize("at_positions", [False, True])
def test_partial_qk_norm_rope_kernel(dtype, rows, heads, d, rot, at_positions):
    from dlmrt._kernels.qk_norm_rope import qk_norm_rope

    qkv, w, _, pos, cos, sin = _inputs(rows, heads, 0, d, rot, dtype, rows + rot)
    if at_positions:
        got = torch.zeros(heads, 4 * rows + 16, d, device=DEV, dtype=dtype)
        want = got.clone()
        qk_norm_rope(qkv, w, cos, sin, EPS, got, pos)
        reference.qk_norm_rope(qkv, w, cos, sin, EPS, want, pos)
    else:
        got = qk_norm_rope(qkv, w, cos, sin, EPS)
        want = reference.qk_norm_rope(qkv, w, cos, sin, EPS)
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arena_fp8", [False, True])
@pytest.mark.parametrize(
    "rows,heads,kv,d,rot",
    [(1, 2, 1, 64, 64), (7, 4, 2, 64, 32), (32, 16, 4, 128, 64), (40, 8, 8, 128, 128),
     (256, 8, 4, 64, 32), (512, 16, 8, 64, 64)],  # four / eight heads per program
)  # fmt: skip
def test_qkv_norm_rope_kernel(dtype, arena_fp8, rows, heads, kv, d, rot):
    """q returned head-major; k and v land at their arena rows; no other arena row is touched."""
    if arena_fp8 and not CUDA:
        pytest.skip("an FP8 arena: the interpreter's e4m3 casts are not the GPU's")
    from dlmrt._kernels.qk_norm_rope import qkv_norm_rope

    qkv, qw, kw, pos, cos, sin = _inputs(rows, heads, kv, d, rot, dtype, rows * heads + d)
    arena_dtype = torch.float8_e4m3fn if arena_fp8 else dtype
    length = 4 * rows + 16
    k_got = torch.full((kv, length, d), 0.25, device=DEV).to(arena_dtype)
    v_got = torch.full((kv, length, d), -0.5, device=DEV).to(arena_dtype)
    k_want, v_want = k_got.clone(), v_got.clone()
    q_got = qkv_norm_rope(qkv, qw, kw, cos, sin, EPS, k_got, v_got, pos)
    q_want = reference.qkv_norm_rope(qkv, qw, kw, cos, sin, EPS, k_want, v_want, pos)
    assert q_got.shape == (heads, rows, d)
    torch.testing.assert_close(q_got, q_want, **TOL[dtype])
    # an FP8 arena: a bf16 step between kernel and twin can move an e4m3 rounding by one step,
    # rarely (1/8 relative; 2^-9 near zero, the smallest subnormal: both seen on the H200). Near
    # zero RoPE's sum x*cos + rot*sin cancels, and one bf16 step of a term of size ~1 (2^-8) is then
    # two subnormal steps of the result (7 of 1M keys at 512 rows, H200): atol 2^-7 covers it
    tol = dict(atol=2.0**-7, rtol=0.126) if arena_fp8 else TOL[dtype]
    torch.testing.assert_close(k_got.float(), k_want.float(), **tol)
    if arena_fp8:
        assert (k_got.float() == k_want.float()).float().mean() > 0.99
    assert torch.equal(v_got.float(), v_want.float())  # a copy: exact
    untouched = torch.ones(length, dtype=torch.bool, device=DEV)
    untouched[pos] = False
    assert (k_got[:, untouched].float() == 0.25).all()
    assert (v_got[:, untouched].float() == -0.5).all()


def test_heads_per_program_keeps_groups_whole_and_the_launch_wide():
    pytest.importorskip("triton")  # the kernel module imports it (CI's CPU install has none)
    from dlmrt._kernels.qk_norm_rope import heads_per_program

    assert heads_per_program(256, 48, 32, 8) == 8  # QwenDLM's round: 1,536 programs
    assert heads_per_program(32, 24, 16, 4) == 1  # LLaDA's 32 rows: 768 programs already
    assert heads_per_program(256, 16, 16) == 4  # DiffusionGemma's q: 1,024 programs
    assert heads_per_program(4096, 14, 12, 1) == 1  # one KV head: programs never straddle q / k
    assert heads_per_program(4096, 20, 16, 2) == 2
