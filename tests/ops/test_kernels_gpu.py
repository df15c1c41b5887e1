"""Triton kernels vs their torch twins (`dlmrt.ops.reference`) over awkward sizes. Device machine only."""

from __future__ import annotations

import pytest
import torch

from dlmrt.ops import reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 64), (32, 8, 128), (8, 8, 128)])
@pytest.mark.parametrize(
    "start,rows,block",
    [(0, 1, 1), (96, 7, 8), (1024, 256, 256), (3840, 256, 256), (0, 300, 16), (0, 64, 64)],
)
def test_arena_attention_matches_sdpa(dtype, heads, kv_heads, head_dim, start, rows, block):
    """Row p sees arena rows [0, (p // B + 1) * B): one block (rounds) or many (prefill)."""
    from dlmrt._kernels.arena_attention import arena_attention

    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + start)
    pos = torch.arange(start, start + rows, device="cuda")
    end = int((pos[-1] // block + 1) * block)
    q = torch.randn(heads, rows, head_dim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(kv_heads, 4096 + 64, head_dim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(kv_heads, 4096 + 64, head_dim, device="cuda", dtype=dtype, generator=gen)
    k[:, end:] = float("nan")  # invisible rows must not leak, even as NaN
    v[:, end:] = float("nan")
    out = arena_attention(q, k, v, pos, block, head_dim**-0.5)
    ref = reference.arena_attention(
        q.float(), k[:, :end].float(), v[:, :end].float(), pos, block, head_dim**-0.5
    )
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 256])
@pytest.mark.parametrize("vocab", [111, 4096, 32001, 151936])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_token_stats_matches_twin(dtype, rows, vocab, temperature):
    """argmax (first among ties), confidence, entropy and log_z of softmax(logits / T)."""
    from dlmrt._kernels.token_stats import token_stats

    gen = torch.Generator(device="cuda").manual_seed(vocab + rows)
    logits = (4 * torch.randn(rows, vocab, device="cuda", generator=gen)).to(dtype)
    logits[0, 5 % vocab] = logits[0].max()  # a tie: the first index must win
    got = token_stats(logits, temperature)
    want = reference.token_stats(logits, temperature)
    assert torch.equal(got[0], want[0])
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_token_stats_with_minus_inf_logits():
    """-inf logits (a suppressed vocabulary) give finite entropy, as the twin."""
    from dlmrt._kernels.token_stats import token_stats

    logits = torch.tensor([[float("-inf"), 0.0, 0.0, float("-inf")]], device="cuda")
    token, conf, entropy, log_z = token_stats(logits, 0.0)
    assert int(token) == 1 and abs(float(conf) - 0.5) < 1e-6
    assert abs(float(entropy) - 0.6931472) < 1e-6 and abs(float(log_z) - 0.6931472) < 1e-6


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_engine_tokens_identical_with_either_implementation(tmp_path, impl):
    """The engine with the twins forced gives the tokens of the Triton path (fp32)."""
    from conftest import residual_config, write_checkpoint

    from dlmrt import LLM, ops

    path = write_checkpoint(tmp_path / "m", residual=residual_config())
    outs = {}
    for which in ("triton", impl):
        ops.use(which)
        try:
            llm = LLM(path, device="cuda", dtype="float32", mode="block_graph")
            outs[which] = llm.generate(
                [1, 2, 3, 4, 5],
                max_new_tokens=30,
                ignore_eos=True,
                rule="entropy_budget",
                entropy_budget=4.0,
            ).token_ids
        finally:
            ops.use(None)
    assert outs["triton"] == outs[impl]


BF16 = dict(atol=1e-2, rtol=1.6e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n", [(1, 64), (7, 2560), (256, 2560), (33, 1000)])
def test_rms_norm_and_fused_add_match_twins(dtype, rows, n):
    """w * x / rms(x), and the residual add fused before it (sum returned as the new stream)."""
    from dlmrt._kernels.rms_norm import add_rms_norm, rms_norm

    gen = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    r = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    tol = TOL[torch.float32] if dtype == torch.float32 else BF16
    torch.testing.assert_close(rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6), **tol)
    got, got_sum = add_rms_norm(x, r, w, 1e-6)
    want, want_sum = reference.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(got_sum, want_sum)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 64), (7, 2816), (256, 16, 256), (33, 2, 512), (5, 1000)])
@pytest.mark.parametrize("gain", [True, False])
def test_gemma_rms_norm_matches_twin(dtype, shape, gain):
    """Gemma's roundings (gain in fp32, one cast) over 2-D and per-head 3-D inputs, with and
    without a gain; bf16 within one rounding of the twin, and through `ops` on CUDA."""
    from dlmrt._kernels.rms_norm import gemma_rms_norm

    from dlmrt import ops

    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    x = (3 * torch.randn(*shape, device="cuda", generator=gen)).to(dtype)
    w = (0.1 * torch.randn(shape[-1], device="cuda", generator=gen)).to(dtype) if gain else None
    want = reference.gemma_rms_norm(x, w, 1e-6)
    got = gemma_rms_norm(x, w, 1e-6)
    assert got.shape == x.shape and got.dtype == dtype
    tol = TOL[torch.float32] if dtype == torch.float32 else BF16
    torch.testing.assert_close(got, want, **tol)
    if dtype == torch.bfloat16:  # mostly the same bits: the kernel differs only in sum order
        assert (got == want).float().mean() > 0.98
    torch.testing.assert_close(ops.gemma_rms_norm(x, w, 1e-6), got, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,heads,d", [(1, 2, 64), (256, 8, 128), (13, 32, 128)])
@pytest.mark.parametrize("at_positions", [False, True])
def test_qk_norm_rope_matches_twin(dtype, rows, heads, d, at_positions):
    """Per-head norm + RoPE, head-major output, optionally scattered to arena rows."""
    from dlmrt._kernels.qk_norm_rope import qk_norm_rope

    from dlmrt.models.layers import rope_cos_sin

    gen = torch.Generator(device="cuda").manual_seed(rows * heads)
    fused = torch.randn(rows, heads * d * 3, device="cuda", generator=gen).to(dtype)
    x = fused[:, heads * d : 2 * heads * d].view(rows, heads, d)  # a strided view, as in the model
    w = (1 + 0.1 * torch.randn(d, device="cuda", generator=gen)).to(dtype)
    pos = torch.randperm(4 * rows + 8, device="cuda", generator=gen)[:rows] + 3
    cos, sin = rope_cos_sin(pos, d, 1e6, dtype)
    tol = TOL[torch.float32] if dtype == torch.float32 else BF16
    if at_positions:
        got = torch.zeros(heads, 4 * rows + 16, d, device="cuda", dtype=dtype)
        want = got.clone()
        qk_norm_rope(x, w, cos, sin, 1e-6, got, pos)
        reference.qk_norm_rope(x, w, cos, sin, 1e-6, want, pos)
    else:
        got = qk_norm_rope(x, w, cos, sin, 1e-6)
        want = reference.qk_norm_rope(x, w, cos, sin, 1e-6)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,n", [(1, 96), (256, 9728), (5, 1500)])
def test_silu_mul_matches_twin(dtype, rows, n):
    from dlmrt._kernels.silu_mul import silu_mul

    gu = torch.randn(
        rows, 2 * n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(n)
    ).to(dtype)
    tol = TOL[torch.float32] if dtype == torch.float32 else BF16
    torch.testing.assert_close(silu_mul(gu), reference.silu_mul(gu), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,vocab", [(1, 111), (256, 151936), (7, 32001)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_softmax_probs_matches_twin_and_sums_to_one(dtype, rows, vocab, temperature):
    """p = exp(logits / T - log_z) from the decoder's log_z, in the embedding dtype."""
    from dlmrt._kernels.softmax_probs import softmax_probs

    gen = torch.Generator(device="cuda").manual_seed(rows + vocab)
    logits = (3 * torch.randn(rows, vocab, device="cuda", generator=gen)).to(dtype)
    log_z = reference.token_stats(logits, temperature)[3]
    got = softmax_probs(logits, log_z, temperature, dtype)
    torch.testing.assert_close(
        got, reference.softmax_probs(logits, log_z, temperature, dtype), atol=1e-6, rtol=1e-2
    )
    torch.testing.assert_close(
        got.float().sum(-1), torch.ones(rows, device="cuda"), atol=2e-2, rtol=0
    )
