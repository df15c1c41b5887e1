"""DiffusionGemma's vocabulary pass of one denoising step: one program per canvas row.

From the LM head's raw output r [rows, V] (the model dtype), the final softcap c and the step's
temperature T (a device scalar): the logits x = c tanh(r / c) in fp32 (c None: x = r), z = x / T;
argmax z (first among ties); the entropy of softmax(z); the inverse-CDF sample: the number of
tokens whose cumulative probability is <= u * (total), clamped to V - 1 (`torch.searchsorted(cdf,
u * cdf[-1], right=True)`), for the counter RNG's uniform u per row; and the next step's
self-conditioning probabilities softmax(z rounded to the model dtype), written to `sc` in the
model dtype (the soft embedding is then one GEMM: no second reduction over the vocabulary, and
neither the fp32 logits nor z are ever stored). Two passes over the row: (1) per-lane online max,
S0 = sum e^(z - m), S1 = sum e^(z - m)(z - m) (entropy = log S0 - S1 / S0 at the final max), the
argmax, and the online log-normaliser of the rounded z; (2) the running cumulative sum, block by
block (tl.cumsum), counting entries <= the target, and the probabilities. Torch twin:
`dlmrt.ops.vocab.canvas_vocab` (the step's and the model's former torch code).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt

BLOCK = 2048
_BIG = tl.constexpr(1 << 30)


@triton.jit
def _softcap(x, cap, SOFTCAP: tl.constexpr):
    """cap * tanh(x / cap) of fp32 x (SOFTCAP off: x). tanh(a) = sign(a) (1 - e) / (1 + e),
    e = exp(-2|a|) <= 1: no overflow, and no libdevice (the interpreter runs this too).
    kernels/canvas_vocab_pass.py applies it to the logits it computes."""
    if SOFTCAP:
        a = x / cap
        e = tl.exp(-2.0 * tl.abs(a))
        th = (1.0 - e) / (1.0 + e)
        x = cap * tl.where(a < 0, -th, th)
    return x


@triton.jit
def _logits(r_row, offs, ok, cap, SOFTCAP: tl.constexpr):
    """x = cap * tanh(r / cap) in fp32 (-inf where masked)."""
    x = tl.load(r_row + offs, mask=ok, other=0.0).to(tl.float32)
    return tl.where(ok, _softcap(x, cap, SOFTCAP), float("-inf"))


@triton.jit
def _online(m, s, x):
    """One block into a per-lane online (max, sum of e^(x - max)); -inf lanes add nothing."""
    m_new = tl.maximum(m, x)
    live = m_new > float("-inf")
    alpha = tl.where(live, tl.exp(m - m_new), 0.0)
    return m_new, alpha * s + tl.where(live, tl.exp(x - m_new), 0.0), alpha


@triton.jit
def _stats_pass(r_row, start, t, cap, SC_DTYPE: tl.constexpr, V: tl.constexpr,
                SPAN: tl.constexpr, BLOCK: tl.constexpr, SOFTCAP: tl.constexpr):  # fmt: skip
    """Pass 1 over entries start .. start + SPAN of a row (those >= V masked): per-lane online
    (max, S0, S1) of z, (best value, its first index), and the online (max, sum) of z rounded to
    the model dtype. kernels/canvas_vocab_split.py runs it over one split of the row."""
    lane = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s0 = tl.zeros([BLOCK], tl.float32)
    s1 = tl.zeros([BLOCK], tl.float32)
    m_y = tl.full([BLOCK], float("-inf"), tl.float32)
    s_y = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK], tl.int32)
    for v0 in range(0, SPAN, BLOCK):
        offs = start + v0 + lane
        ok = offs < V
        z = _logits(r_row, offs, ok, cap, SOFTCAP) / t
        better = z > best  # strict: the first index of a lane's maximum stays
        best_i = tl.where(better, offs, best_i)
        best = tl.where(better, z, best)
        m_y, s_y, _ = _online(m_y, s_y, z.to(SC_DTYPE).to(tl.float32))
        m_old = m
        m, p_sum, alpha = _online(m, s0, z)
        live = m > float("-inf")
        p = tl.where(live, tl.exp(z - m), 0.0)
        # S1 relative to the running max: sum e^(z-m')(z-m') = alpha (S1 + (m - m') S0) + p (z - m')
        shift = tl.where(live & (m_old > float("-inf")), m_old - m, 0.0)
        s1 = alpha * (s1 + shift * s0) + p * tl.where(ok & live, z - m, 0.0)
        s0 = p_sum
    return m, s0, s1, best, best_i, m_y, s_y


@triton.jit
def _merge(m):
    """A row's max over per-lane online maxima, and each lane's weight e^(m - max) (0: empty)."""
    big_m = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp(m - big_m), 0.0)
    return big_m, w


@triton.jit
def _reduce(m, s0, s1, best, best_i, m_y, s_y):
    """Per-lane (or per-split) online states -> (argmax, max M, total = sum e^(z - M), sum
    e^(z - M)(z - M), max of rounded z, its sum at that max); empty lanes: m = -inf, index BIG."""
    top = tl.max(best, 0)
    argmax = tl.min(tl.where(best == top, best_i, _BIG), 0)
    big_m, w = _merge(m)
    total = tl.sum(s0 * w, 0)
    rel = tl.sum(w * (s1 + tl.where(m > float("-inf"), m - big_m, 0.0) * s0), 0)
    big_y, w_y = _merge(m_y)
    return argmax, big_m, total, rel, big_y, tl.sum(s_y * w_y, 0)


@triton.jit
def _sample_pass(r_row, sc_row, start, t, cap, big_m, log_z_y, target, running,
                 LIMIT: tl.constexpr, V: tl.constexpr, SPAN: tl.constexpr, BLOCK: tl.constexpr,
                 SOFTCAP: tl.constexpr):  # fmt: skip
    """Pass 2 over entries start .. start + SPAN of a row: writes the self-conditioning
    probabilities e^(y - log Z_y) and returns how many entries below LIMIT have a cumulative sum
    of e^(z - M) (from `running`, the sum before `start`) <= target."""
    sc_dtype = sc_row.dtype.element_ty
    lane = tl.arange(0, BLOCK)
    count = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    for v0 in range(0, SPAN, BLOCK):
        offs = start + v0 + lane
        ok = offs < V
        z = _logits(r_row, offs, ok, cap, SOFTCAP) / t
        y = z.to(sc_dtype).to(tl.float32)
        tl.store(sc_row + offs, tl.exp(y - log_z_y).to(sc_dtype), mask=ok)
        p = tl.where(ok, tl.exp(z - big_m), 0.0)
        cdf = running + tl.cumsum(p, 0)
        count += tl.sum((ok & (offs < LIMIT) & (cdf <= target)).to(tl.int32), 0)
        running += tl.sum(p, 0)
    return count


@triton.jit
def _canvas_vocab_kernel(r_ptr, t_ptr, u_ptr, sc_ptr, argmax_ptr, entropy_ptr, sample_ptr, cap,
                         stride_r, stride_sc, V: tl.constexpr, BLOCK: tl.constexpr,
                         SOFTCAP: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """V constexpr: one compile per vocabulary (a model constant), static loop bounds."""
    pdl.enter(PDL)
    row = tl.program_id(0)
    t = tl.load(t_ptr)
    r_row = r_ptr + row.to(tl.int64) * stride_r
    sc_row = sc_ptr + row.to(tl.int64) * stride_sc
    sc_dtype = sc_ptr.dtype.element_ty
    lanes = _stats_pass(r_row, 0, t, cap, sc_dtype, V, V, BLOCK, SOFTCAP)
    argmax, big_m, total, rel, big_y, sum_y = _reduce(*lanes)
    tl.store(argmax_ptr + row, argmax.to(tl.int64))
    tl.store(entropy_ptr + row, tl.log(total) - rel / total)
    log_z_y = big_y + tl.log(sum_y)
    # pass 2: inverse CDF in the e^(z - M) scale, and the self-conditioning probabilities
    target = tl.load(u_ptr + row) * total
    running = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    count = _sample_pass(r_row, sc_row, 0, t, cap, big_m, log_z_y, target, running, V, V, V,
                         BLOCK, SOFTCAP)  # fmt: skip
    tl.store(sample_ptr + row, tl.minimum(count, V - 1).to(tl.int64))


def canvas_vocab(
    raw: torch.Tensor,  # [rows, V] the LM head's output (any float dtype)
    softcap: float | None,  # the final logit softcap (None: none)
    temperature: torch.Tensor,  # 0-d fp32 device scalar
    u: torch.Tensor,  # [rows] fp32 uniforms in [0, 1)
    sc: torch.Tensor,  # [rows, V] out: the self-conditioning probabilities, model dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # argmax, entropy, sampled
    rows, vocab = raw.shape
    if raw.stride(-1) != 1 or sc.stride(-1) != 1:
        raise ValueError("canvas_vocab: raw logits and sc need a contiguous last dim")
    argmax = torch.empty(rows, dtype=torch.int64, device=raw.device)
    sampled = torch.empty_like(argmax)
    entropy = torch.empty(rows, dtype=torch.float32, device=raw.device)
    _canvas_vocab_kernel[(rows,)](
        raw, temperature.float(), u.float().contiguous(), sc, argmax, entropy, sampled,
        1.0 if softcap is None else float(softcap), raw.stride(0), sc.stride(0), V=vocab,
        BLOCK=BLOCK if raw.is_cuda else 64, SOFTCAP=softcap is not None,
        num_warps=8 if raw.is_cuda else 1, **pdl.launch(),
    )  # fmt: skip
    return argmax, entropy, sampled
