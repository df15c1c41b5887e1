"""DiffusionGemma's vocabulary pass: the twin (`dlmrt/ops/vocab.py`) is the model's, the step's
and the soft embedding's former torch code (CPU); the kernel (kernels/canvas_vocab.py) against the
twin (`-m gpu`; fp32 also under TRITON_INTERPRET=1 on CPU tensors, where it runs 64-wide blocks so
small vocabularies span many)."""

from __future__ import annotations

import pytest
import torch
from kernel_env import CUDA, DEV, INTERPRET, kernel_test

from dlmrt.decoding import entropy_bound_canvas as ebc
from dlmrt.ops import vocab

CAP = 30.0


def _inputs(rows: int, v: int, seed: int, dtype=torch.float32, raw_dtype=torch.float32):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    raw = 3 * torch.randn(rows, v, device=DEV, generator=gen)  # the LM head's output
    raw[0, v // 3] = raw[0].max() + 0  # a tie with the first maximum's later copy
    raw[0, v - 1] = raw[0, v // 3]
    raw[-1, 1] = -1e-6  # tanh's sign and the small-|a| branch of the kernel's form
    u = torch.rand(rows, device=DEV, generator=gen)
    u[-1] = 0.9999999  # the clamp at V - 1 in reach
    sc = torch.empty(rows, v, device=DEV, dtype=dtype)
    return raw.to(raw_dtype), torch.tensor(0.7, device=DEV), u, sc


@pytest.mark.parametrize("cap", [CAP, None])
def test_twin_is_the_former_model_and_step_code(cap):
    """Bit for bit what the model's logits, canvas_step and the soft embedding computed before the
    op (CPU tokens do not move)."""
    raw, t, u, sc = _inputs(9, 300, 1, torch.bfloat16, torch.bfloat16)
    argmax, h, sampled = vocab.canvas_vocab(raw, cap, t, u, sc)
    logits = raw.float() if cap is None else cap * torch.tanh(raw.float() / cap)  # the model's
    z = logits / t
    probs = torch.softmax(z, dim=-1, dtype=torch.float32)
    cdf = torch.cumsum(probs, -1)
    want = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    assert torch.equal(sampled, want.clamp(max=299))
    assert torch.equal(argmax, torch.argmax(z, -1)) and torch.equal(h, ebc.token_entropy(z))
    # the former sc buffer held z in bf16; the model then took softmax(sc.float() / 1.0) in fp32
    former_sc = z.to(torch.bfloat16)
    probs_then = torch.nn.functional.softmax(former_sc.float() / 1.0, dim=-1, dtype=torch.float32)
    assert torch.equal(sc, probs_then.to(torch.bfloat16))


def _probs_close(got: torch.Tensor, want: torch.Tensor, z: torch.Tensor) -> None:
    """The self-conditioning probabilities: the kernel's tanh form and exp(y - log Z) are a few
    fp32 roundings from the twin. In bf16 both round z first; where their z's fall on either side
    of a rounding boundary they differ by one bf16 ulp of z (2^-7 |z|, up to 0.25 at |z| ~ 40),
    which scales that probability by e^ulp, and the probability itself rounds to bf16 (2^-8)."""
    if got.dtype != torch.bfloat16:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-9)
        return
    ulp = torch.exp2(torch.floor(torch.log2(z.abs().clamp(min=1e-30))) - 7)
    bound = torch.exp(ulp + 2e-2)
    ratio = (got.float() + 1e-30) / (want.float() + 1e-30)
    assert ((ratio <= bound) & (ratio >= 1 / bound)).all()
    assert (ratio - 1).abs().median() < 1e-2  # most entries: the same rounded z


@pytest.mark.gpu
@kernel_test
@pytest.mark.parametrize("rows,v", [(1, 37), (7, 300), (32, 4096), (256, 262144)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the model's (raw and sc)
@pytest.mark.parametrize("cap", [CAP, None])
def test_kernel_matches_twin(rows, v, dtype, cap):
    if INTERPRET and rows * v > 200_000:
        pytest.skip("slow under the interpreter")
    if not CUDA and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter's bf16 casts truncate")
    from dlmrt._kernels.canvas_vocab import canvas_vocab

    raw, t, u, sc = _inputs(rows, v, rows + v, dtype, dtype)
    sc_ref = torch.empty_like(sc)
    got = canvas_vocab(raw, cap, t, u, sc)
    want = vocab.canvas_vocab(raw, cap, t, u, sc_ref)
    assert torch.equal(got[0], want[0])  # argmax, the first index among ties
    torch.testing.assert_close(got[1], want[1], atol=2e-4, rtol=1e-4)  # entropy
    _probs_close(sc, sc_ref, vocab.softcapped(raw, cap) / t)
    ones = torch.ones(rows, dtype=torch.float64, device=DEV)
    assert torch.allclose(sc.double().sum(-1), ones, atol=2e-2)
    # the sample: equal unless u * total falls within rounding of a CDF step
    logits = vocab.softcapped(raw, cap)
    cdf = torch.cumsum(torch.softmax(logits / t, -1, dtype=torch.float64), -1)
    lo = torch.searchsorted(cdf, (u.double() - 1e-5).clamp(min=0)[:, None], right=True)[:, 0]
    hi = torch.searchsorted(cdf, (u.double() + 1e-5)[:, None], right=True)[:, 0]
    assert ((got[2] >= lo.clamp(max=v - 1)) & (got[2] <= hi.clamp(max=v - 1))).all()
    assert (got[2] == want[2]).float().mean() >= 0.9
