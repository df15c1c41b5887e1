"""DiffusionGemma's vocabulary work of one canvas step in one stream over the vocabulary: the LM
head, the step's statistics and sample, and the next step's self-conditioning embedding, from
the final normed hidden, without writing the logits or the probabilities.

kernels/vocab_pass.py's attention over the vocabulary (queries h [rows, hidden], keys the head's
weight W, values the embedding E: one tensor when tied), with DiffusionGemma's arithmetic from
kernels/canvas_vocab.py: per chunk of 128 vocabulary entries

  raw = h @ W[chunk]^T          fp32 accumulators rounded to the model dtype (the head's output)
  z   = softcap(raw) / T        T read from the device (the step's temperature)
  stats  online max of z (its first index), S0 = sum e^(z - m), S1 = sum e^(z - m)(z - m)
  y   = z rounded to E's dtype  online (max, sum) of y, and soft += e^(y - m_y) E[chunk] in an
                                fp32 scratch per (split, rows), both rescaled when the max moves
  sample partials               the running max m per (row, chunk) and sum e^(z - m) per group of
                                GROUP entries: the cumulative sum at GROUP resolution

A combine kernel (program (row, hidden block)) merges the splits: argmax, entropy
log S0 - S1 / S0, confidence 1 / sum e^(y - max y) (the argmax's self-conditioning
probability), soft = sum_split e^(m_y,split - M_y) soft_split / Z_y in E's dtype, and, in each
row's first program, the inverse-CDF sample: it scans the row's group sums in vocabulary order
(rescaled to the row's max) to the group where the cumulative sum passes u * total, recomputes
that group's GROUP logits and counts its entries below the target (kernels/canvas_vocab.py's
count, clamped to V - 1). The logits are never written: the sample costs the partials
(rows x V / GROUP x 4 B, written and read once) and GROUP logits a row.

Differences from the three steps (head, kernels/canvas_vocab.py, the p @ E GEMM; the twin
`dlmrt.ops.vocab.canvas_vocab_pass`), from the order of fp32 additions and one rounding: the
argmax is exact where the logits are (ties to the first index); the entropy and totals are
summed per chunk, then over splits; the sample differs only where u * total falls within that
rounding of a step of the cumulative sum; soft's probabilities are rounded to E's dtype
relative to the running max, the twin's relative to the normaliser (bf16: 2^-8 relative per
probability, so |soft - twin| <= 2^-7 (p @ |E|) + soft's own rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .canvas_vocab import _BIG, _reduce, _softcap
from .device import sm_count
from .vocab_pass import BLOCK_D, BLOCK_K, BLOCK_V, _logits_chunk, _z_update, launch_shape

GROUP = 32  # entries per sample partial (the entries the sample recomputes a row)
SCAN = 1024  # partials per step of the sample's scan
PARTS = 5  # per-split partials in `part`: max z, S0, S1, max y, sum e^(y - max y)


@triton.jit
def _pass_split_kernel(
    h_ptr, w_ptr, e_ptr, t_ptr, rows, vocab, hidden, split_len, cap,
    part_ptr, arg_ptr, zpart_ptr, cmax_ptr, csum_ptr, n_chunks,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, GROUP: tl.constexpr, ROUND: tl.constexpr, IEEE: tl.constexpr,
    SOFTCAP: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    split = tl.program_id(1)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < rows
    lo = split * split_len
    hi = tl.minimum(lo + split_len, vocab)
    t = tl.load(t_ptr)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s0 = tl.zeros([BLOCK_M], tl.float32)
    s1 = tl.zeros([BLOCK_M], tl.float32)
    m_y = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s_y = tl.zeros([BLOCK_M], tl.float32)
    best = tl.zeros([BLOCK_M], tl.int32)
    zpart = zpart_ptr + split.to(tl.int64) * rows * hidden
    per: tl.constexpr = BLOCK_V // GROUP
    for start in range(lo, hi, BLOCK_V):
        offs_v = start + tl.arange(0, BLOCK_V)
        v_ok = offs_v < hi
        raw = _logits_chunk(h_ptr, w_ptr, rm, row_ok, offs_v, v_ok, hidden,
                            BLOCK_M, BLOCK_V, BLOCK_K, ROUND, IEEE)  # fmt: skip
        z = tl.where(v_ok[None, :], _softcap(raw, cap, SOFTCAP) / t, float("-inf"))
        tile_max = tl.max(z, 1)
        best = tl.where(tile_max > m, tl.argmax(z, 1, tie_break_left=True) + start, best)
        m_new = tl.maximum(m, tile_max)  # every chunk holds an entry: finite
        alpha = tl.exp(m - m_new)
        e = tl.exp(z - m_new[:, None])
        # S1 relative to the running max: alpha (S1 + (m - m') S0) + sum e (z - m')
        shift = tl.where(m > float("-inf"), m - m_new, 0.0)
        rel = e * tl.where(v_ok[None, :], z - m_new[:, None], 0.0)  # masked: 0, not 0 * inf
        s1 = alpha * (s1 + shift * s0) + tl.sum(rel, 1)
        s0 = s0 * alpha + tl.sum(e, 1)
        chunk = start // BLOCK_V
        tl.store(cmax_ptr + rm * n_chunks + chunk, m_new, mask=row_ok)
        groups = tl.sum(tl.reshape(e, [BLOCK_M, per, GROUP]), 2)
        offs_g = chunk * per + tl.arange(0, per)
        csum = csum_ptr + rm[:, None] * (n_chunks * per) + offs_g[None, :]
        tl.store(csum, groups, mask=row_ok[:, None])
        y = z.to(e_ptr.dtype.element_ty).to(tl.float32)  # the self-conditioning input's rounding
        my_new = tl.maximum(m_y, tl.max(y, 1))
        alpha_y = tl.exp(m_y - my_new)
        p = tl.exp(y - my_new[:, None])
        s_y = s_y * alpha_y + tl.sum(p, 1)
        _z_update(zpart, e_ptr, p, alpha_y, rm, row_ok, offs_v, v_ok, hidden, start == lo,
                  BLOCK_D, IEEE)  # fmt: skip
        m, m_y = m_new, my_new
    at = part_ptr + split * rows + rm
    plane = tl.num_programs(1) * rows
    tl.store(at, m, mask=row_ok)
    tl.store(at + plane, s0, mask=row_ok)
    tl.store(at + 2 * plane, s1, mask=row_ok)
    tl.store(at + 3 * plane, m_y, mask=row_ok)
    tl.store(at + 4 * plane, s_y, mask=row_ok)
    tl.store(arg_ptr + split * rows + rm, best, mask=row_ok)


@triton.jit
def _sample(h_ptr, w_ptr, cmax_ptr, csum_ptr, row, big_m, target, t, cap, vocab, hidden,
            n_chunks, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
            SCAN: tl.constexpr, ROUND: tl.constexpr, IEEE: tl.constexpr,
            SOFTCAP: tl.constexpr):  # fmt: skip
    """The number of entries of `row` whose cumulative sum of e^(z - M) is <= target, clamped
    to V - 1: whole groups from the partials, then the passing group's entries recomputed."""
    per: tl.constexpr = BLOCK_V // GROUP
    n_groups = n_chunks * per
    lane = tl.arange(0, SCAN)
    running = tl.sum(tl.zeros([SCAN], tl.float32), 0)
    below = running  # the cumulative sum before the passing group
    full = tl.sum(tl.zeros([SCAN], tl.int32), 0)  # groups wholly at or below the target
    for g0 in range(0, n_groups, SCAN):
        g = g0 + lane
        ok = g < n_groups
        s = tl.load(csum_ptr + row * n_groups + g, mask=ok, other=0.0)
        mc = tl.load(cmax_ptr + row * n_chunks + g // per, mask=ok, other=0.0)
        w = tl.where(ok, s * tl.exp(mc - big_m), 0.0)
        under = ok & (running + tl.cumsum(w, 0) <= target)  # a prefix: w >= 0
        full += tl.sum(under.to(tl.int32), 0)
        below += tl.sum(tl.where(under, w, 0.0), 0)
        running += tl.sum(w, 0)
    offs_v = full * GROUP + tl.arange(0, GROUP)
    v_ok = offs_v < vocab  # none past the last group: the count is clamped below
    lanes = tl.arange(0, 16)  # tl.dot's smallest row block; lane 0 is the row
    raw = _logits_chunk(h_ptr, w_ptr, row + lanes * 0, lanes == 0, offs_v, v_ok, hidden,
                        16, GROUP, BLOCK_K, ROUND, IEEE)  # fmt: skip
    raw = tl.sum(tl.where((lanes == 0)[:, None], raw, 0.0), 0)
    p = tl.where(v_ok, tl.exp(_softcap(raw, cap, SOFTCAP) / t - big_m), 0.0)
    inside = tl.sum((v_ok & (below + tl.cumsum(p, 0) <= target)).to(tl.int32), 0)
    return tl.minimum(full * GROUP + inside, vocab - 1)


@triton.jit
def _pass_combine_kernel(
    part_ptr, arg_ptr, zpart_ptr, cmax_ptr, csum_ptr, h_ptr, w_ptr, t_ptr, u_ptr,
    argmax_ptr, entropy_ptr, conf_ptr, sample_ptr, soft_ptr,
    rows, vocab, hidden, splits, n_chunks, cap,
    SPLITS_P: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, GROUP: tl.constexpr, SCAN: tl.constexpr, ROUND: tl.constexpr,
    IEEE: tl.constexpr, SOFTCAP: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0)
    k = tl.arange(0, SPLITS_P)
    ok = k < splits
    at = part_ptr + k * rows + row
    plane = splits * rows
    m = tl.load(at, mask=ok, other=float("-inf"))
    s0 = tl.load(at + plane, mask=ok, other=0.0)
    s1 = tl.load(at + 2 * plane, mask=ok, other=0.0)
    m_y = tl.load(at + 3 * plane, mask=ok, other=float("-inf"))
    s_y = tl.load(at + 4 * plane, mask=ok, other=0.0)
    best_i = tl.load(arg_ptr + k * rows + row, mask=ok, other=_BIG)
    argmax, big_m, total, rel, big_y, sum_y = _reduce(m, s0, s1, m, best_i, m_y, s_y)
    if tl.program_id(1) == 0:
        tl.store(argmax_ptr + row, argmax.to(tl.int64))
        tl.store(entropy_ptr + row, tl.log(total) - rel / total)
        tl.store(conf_ptr + row, 1.0 / sum_y)  # e^(max y - log Z_y): the argmax's y is max y
        target = tl.load(u_ptr + row) * total
        count = _sample(h_ptr, w_ptr, cmax_ptr, csum_ptr, row, big_m, target, tl.load(t_ptr),
                        cap, vocab, hidden, n_chunks, BLOCK_V, BLOCK_K, GROUP, SCAN, ROUND,
                        IEEE, SOFTCAP)  # fmt: skip
        tl.store(sample_ptr + row, count.to(tl.int64))
    w_y = tl.where(m_y > float("-inf"), tl.exp(m_y - big_y), 0.0) / sum_y
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < hidden
    zp = zpart_ptr + (k[:, None].to(tl.int64) * rows + row) * hidden + offs_d[None, :]
    zs = tl.load(zp, mask=ok[:, None] & d_ok[None, :], other=0.0)
    soft = tl.sum(zs * w_y[:, None], 0)
    out = soft_ptr + row.to(tl.int64) * hidden + offs_d
    tl.store(out, soft.to(soft_ptr.dtype.element_ty), mask=d_ok)


def _check(h: torch.Tensor, weight: torch.Tensor, embed: torch.Tensor, soft: torch.Tensor) -> None:
    rows, hidden = h.shape
    if weight.shape != embed.shape or weight.shape[1] != hidden:
        raise ValueError(
            f"canvas_vocab_pass: h {tuple(h.shape)}, weight {tuple(weight.shape)} and embed "
            f"{tuple(embed.shape)} must be [rows, hidden], [vocab, hidden], [vocab, hidden]"
        )
    if soft.shape != (rows, hidden) or soft.dtype != embed.dtype or not soft.is_contiguous():
        raise ValueError(
            f"canvas_vocab_pass: soft must be a contiguous [{rows}, {hidden}] {embed.dtype} "
            f"tensor, got {tuple(soft.shape)} {soft.dtype}"
        )


def canvas_vocab_pass(
    h: torch.Tensor,  # [rows, hidden] the final normed hidden (model dtype)
    weight: torch.Tensor,  # [vocab, hidden] the LM head's weight
    embed: torch.Tensor,  # [vocab, hidden] the embedding (the same tensor when tied)
    softcap: float | None,  # the final logit softcap (None: none)
    temperature: torch.Tensor,  # 0-d fp32 device scalar
    u: torch.Tensor,  # [rows] fp32 uniforms in [0, 1)
    soft: torch.Tensor,  # [rows, hidden] out: softmax(z rounded to E's dtype) @ E, E's dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(argmax, entropy, sampled, confidence) of softmax(z), z = softcap(h W^T) / T; writes the
    next step's self-conditioning embedding (before the sqrt(hidden) scale) into `soft`."""
    _check(h, weight, embed, soft)
    rows, hidden = h.shape
    vocab, dev = weight.shape[0], h.device
    h, weight, embed = h.contiguous(), weight.contiguous(), embed.contiguous()
    block_m, splits, split_len = launch_shape(rows, vocab, sm_count(dev))
    n_chunks = triton.cdiv(vocab, BLOCK_V)
    f32 = dict(dtype=torch.float32, device=dev)
    part = torch.empty(PARTS, splits, rows, **f32)
    arg = torch.empty(splits, rows, dtype=torch.int32, device=dev)
    zpart = torch.empty(splits, rows, hidden, **f32)
    cmax = torch.empty(rows, n_chunks, **f32)
    csum = torch.empty(rows, n_chunks * (BLOCK_V // GROUP), **f32)
    t = temperature.float()
    cap = 1.0 if softcap is None else float(softcap)
    ieee, rnd = h.dtype == torch.float32, h.dtype != torch.float32
    _pass_split_kernel[(triton.cdiv(rows, block_m), splits)](
        h, weight, embed, t, rows, vocab, hidden, split_len, cap, part, arg, zpart, cmax, csum,
        n_chunks, BLOCK_M=block_m, BLOCK_V=BLOCK_V, BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D,
        GROUP=GROUP, ROUND=rnd, IEEE=ieee, SOFTCAP=softcap is not None,
        num_warps=4 if block_m < 64 else 8, **pdl.launch(),
    )  # fmt: skip
    argmax = torch.empty(rows, dtype=torch.int64, device=dev)
    sampled = torch.empty_like(argmax)
    entropy, conf = torch.empty(rows, **f32), torch.empty(rows, **f32)
    _pass_combine_kernel[(rows, triton.cdiv(hidden, BLOCK_D))](
        part, arg, zpart, cmax, csum, h, weight, t, u.float().contiguous(), argmax, entropy,
        conf, sampled, soft, rows, vocab, hidden, splits, n_chunks, cap,
        SPLITS_P=triton.next_power_of_2(splits), BLOCK_V=BLOCK_V, BLOCK_K=BLOCK_K,
        BLOCK_D=BLOCK_D, GROUP=GROUP, SCAN=SCAN, ROUND=rnd, IEEE=ieee,
        SOFTCAP=softcap is not None, num_warps=4, **pdl.launch(),
    )  # fmt: skip
    return argmax, entropy, sampled, conf
