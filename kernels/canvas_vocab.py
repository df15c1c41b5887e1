"""DiffusionGemma's vocabulary pass of one denoising step: one program per canvas row.

From the softcapped fp32 logits x [rows, V] and the step's temperature T (a device scalar):
z = x / T; argmax z (first among ties); the entropy of softmax(z); the self-conditioning input
z in the model dtype (written to `sc`); and the inverse-CDF sample: the number of tokens whose
cumulative probability is <= u * (total), clamped to V - 1 (`torch.searchsorted(cdf, u * cdf[-1],
right=True)`), for the counter RNG's uniform u per row. Two passes over the row: (1) per-lane
online max / sum of e^(z - m) / sum of e^(z - m)(z - m) (entropy = log S0 - S1 / S0 at the final
max) and argmax, writing sc; (2) the running cumulative sum, block by block (tl.cumsum), counting
entries <= the target. Torch twin: `dlmrt.ops.vocab.canvas_vocab` (the step's former torch code).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048
_BIG = tl.constexpr(1 << 30)


@triton.jit
def _stats_pass(x_row, sc_row, t, V: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 1: per-lane online (max, S0, S1) and (best value, its first index); writes sc."""
    lane = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s0 = tl.zeros([BLOCK], tl.float32)
    s1 = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK], tl.int32)
    for v0 in range(0, V, BLOCK):
        offs = v0 + lane
        ok = offs < V
        z = tl.load(x_row + offs, mask=ok, other=float("-inf")) / t
        tl.store(sc_row + offs, z.to(sc_row.dtype.element_ty), mask=ok)
        better = z > best  # strict: the first index of a lane's maximum stays
        best_i = tl.where(better, offs, best_i)
        best = tl.where(better, z, best)
        m_new = tl.maximum(m, z)
        live = m_new > float("-inf")
        alpha = tl.where(live, tl.exp(m - m_new), 0.0)
        p = tl.where(ok & live, tl.exp(z - m_new), 0.0)
        # S1 relative to the running max: sum e^(z-m')(z-m') = alpha (S1 + (m - m') S0) + p (z - m')
        shift = tl.where(live & (m > float("-inf")), m - m_new, 0.0)
        s1 = alpha * (s1 + shift * s0) + p * tl.where(ok & live, z - m_new, 0.0)
        s0 = alpha * s0 + p
        m = m_new
    return m, s0, s1, best, best_i


@triton.jit
def _canvas_vocab_kernel(x_ptr, t_ptr, u_ptr, sc_ptr, argmax_ptr, entropy_ptr, sample_ptr,
                         stride_x, stride_sc, V: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """V constexpr: one compile per vocabulary (a model constant), static loop bounds."""
    row = tl.program_id(0)
    t = tl.load(t_ptr)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    sc_row = sc_ptr + row.to(tl.int64) * stride_sc
    m, s0, s1, best, best_i = _stats_pass(x_row, sc_row, t, V, BLOCK)
    top = tl.max(best, 0)
    tl.store(argmax_ptr + row, tl.min(tl.where(best == top, best_i, _BIG), 0).to(tl.int64))
    big_m = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp(m - big_m), 0.0)
    total = tl.sum(s0 * w, 0)
    rel = tl.sum(w * (s1 + tl.where(m > float("-inf"), m - big_m, 0.0) * s0), 0)
    tl.store(entropy_ptr + row, tl.log(total) - rel / total)
    # pass 2: inverse CDF in the e^(z - M) scale
    target = tl.load(u_ptr + row) * total
    lane = tl.arange(0, BLOCK)
    running = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    count = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    for v0 in range(0, V, BLOCK):
        offs = v0 + lane
        ok = offs < V
        z = tl.load(x_row + offs, mask=ok, other=float("-inf")) / t
        p = tl.where(ok, tl.exp(z - big_m), 0.0)
        cdf = running + tl.cumsum(p, 0)
        count += tl.sum((ok & (cdf <= target)).to(tl.int32), 0)
        running += tl.sum(p, 0)
    tl.store(sample_ptr + row, tl.minimum(count, V - 1).to(tl.int64))


def canvas_vocab(
    logits: torch.Tensor,  # [rows, V] fp32 (softcapped)
    temperature: torch.Tensor,  # 0-d fp32 device scalar
    u: torch.Tensor,  # [rows] fp32 uniforms in [0, 1)
    sc: torch.Tensor,  # [rows, V] out: logits / T in the model dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # argmax, entropy, sampled
    rows, vocab = logits.shape
    if logits.stride(-1) != 1 or sc.stride(-1) != 1:
        raise ValueError("canvas_vocab: logits and sc need a contiguous last dim")
    argmax = torch.empty(rows, dtype=torch.int64, device=logits.device)
    sampled = torch.empty_like(argmax)
    entropy = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _canvas_vocab_kernel[(rows,)](
        logits, temperature.float(), u.float().contiguous(), sc, argmax, entropy, sampled,
        logits.stride(0), sc.stride(0), V=vocab, BLOCK=BLOCK if logits.is_cuda else 64,
        num_warps=8 if logits.is_cuda else 1,
    )  # fmt: skip
    return argmax, entropy, sampled
