"""One pass over the vocabulary for a block's rows: the LM head, the decoder's statistics and the
residual z = softmax(logits / T_z) @ E, without writing the logits.

An attention over the vocabulary: the queries are the final normed hidden h [rows, hidden], the
keys the head's weight W [vocab, hidden], the values the embedding E [vocab, hidden] (one tensor
when the embedding is tied). Each program owns a block of rows and a split of the vocabulary and
streams its split once, a chunk at a time:

  s      = h @ W[chunk]^T                 fp32 accumulators, rounded to h's dtype (the logits the
                                          unfused head would have written)
  stats  running raw max (and its first index), sum of exp(x - m) and of exp(x - m) * x with
         x = s / T, rescaled when the max moves (flash attention's online softmax)
  z      sum of exp(s / T_z - m_z) * E[chunk], kept in an fp32 scratch slice per (split, rows)
         and rescaled by the same factor

The hidden width (thousands) is too wide for a [rows, hidden] accumulator in registers, so the z
accumulator lives in that scratch (read, rescaled and written back per chunk: L2 traffic, no
logits). A second kernel combines the splits per row (flash-decoding's reduction): argmax = the
first index of the largest logit, log_z, confidence = exp(max - log_z), entropy, and
z = sum_split w_split z_split / L in E's dtype.

Torch twin: `dlmrt.ops.one_pass.vocab_pass` (the unfused head, `token_stats`, `softmax_probs`
and the p @ E GEMM).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .device import sm_count

BLOCK_V = 128  # vocabulary rows per chunk (the z scratch is read and written once per chunk)
BLOCK_K = 64  # hidden columns per step of the logits dot
BLOCK_D = 64  # hidden columns per step of the z update


@triton.jit
def _logits_chunk(h_ptr, w_ptr, rm, row_ok, offs_v, v_ok, hidden,
                  BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                  ROUND: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """s = h[rm] @ W[offs_v]^T in fp32 ([BLOCK_M, BLOCK_V]); ROUND: rounded to h's dtype."""
    acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    for k in range(0, hidden, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        k_ok = offs_k < hidden
        a = tl.load(h_ptr + rm[:, None] * hidden + offs_k[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
        b = tl.load(w_ptr + offs_v[:, None].to(tl.int64) * hidden + offs_k[None, :],
                    mask=v_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
        if IEEE:
            acc = tl.dot(a, tl.trans(b.to(a.dtype)), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b.to(a.dtype)), acc)
    if ROUND:  # the unfused head writes its logits in the model dtype
        acc = acc.to(h_ptr.dtype.element_ty).to(tl.float32)
    return acc


@triton.jit
def _z_update(zpart_ptr, e_ptr, p, alpha_z, rm, row_ok, offs_v, v_ok, hidden, first,
              BLOCK_D: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """zpart[rm] = zpart[rm] * alpha_z + p @ E[offs_v], a BLOCK_D slice of hidden at a time
    (`first`: the scratch holds nothing yet, so it is not read)."""
    for d in range(0, hidden, BLOCK_D):
        offs_d = d + tl.arange(0, BLOCK_D)
        d_ok = offs_d < hidden
        zmask = row_ok[:, None] & d_ok[None, :]
        zp = zpart_ptr + rm[:, None] * hidden + offs_d[None, :]
        acc = tl.load(zp, mask=zmask, other=0.0)
        acc = tl.where(first, 0.0, acc * alpha_z[:, None])  # a select: what it held may be NaN
        ev = tl.load(e_ptr + offs_v[:, None].to(tl.int64) * hidden + offs_d[None, :],
                     mask=v_ok[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
        if IEEE:
            acc = tl.dot(p.to(ev.dtype), ev, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(ev.dtype), ev, acc)
        tl.store(zp, acc, mask=zmask)


@triton.jit
def _vocab_split_kernel(
    h_ptr, w_ptr, e_ptr, rows, vocab, hidden, split_len, inv_t, inv_tz,
    part_m_ptr, part_s_ptr, part_t_ptr, part_lz_ptr, part_arg_ptr, zpart_ptr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr, WITH_Z: tl.constexpr, SAME: tl.constexpr,
    ROUND: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    split = tl.program_id(1)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < rows
    lo = split * split_len
    hi = tl.minimum(lo + split_len, vocab)
    m_raw = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    t = tl.zeros([BLOCK_M], tl.float32)
    lz = tl.zeros([BLOCK_M], tl.float32)
    best = tl.zeros([BLOCK_M], tl.int32)
    zpart = zpart_ptr + split.to(tl.int64) * rows * hidden
    for start in range(lo, hi, BLOCK_V):
        offs_v = start + tl.arange(0, BLOCK_V)
        v_ok = offs_v < hi
        raw = _logits_chunk(h_ptr, w_ptr, rm, row_ok, offs_v, v_ok, hidden,
                            BLOCK_M, BLOCK_V, BLOCK_K, ROUND, IEEE)  # fmt: skip
        raw = tl.where(v_ok[None, :], raw, float("-inf"))
        tile_max = tl.max(raw, 1)
        tile_arg = tl.argmax(raw, 1, tie_break_left=True) + start
        best = tl.where(tile_max > m_raw, tile_arg, best)  # ties keep the earlier index
        m_new = tl.maximum(m_raw, tile_max)
        # x = raw / T; max(x) = max(raw) / T exactly (a positive scale keeps the order)
        x = raw * inv_t
        alpha = tl.exp(m_raw * inv_t - m_new * inv_t)
        e = tl.exp(x - (m_new * inv_t)[:, None])
        s = s * alpha + tl.sum(e, 1)
        t = t * alpha + tl.sum(tl.where(e > 0, e * x, 0.0), 1)
        if WITH_Z:
            if SAME:  # the residual's temperature is the decoder's: its softmax is this one
                ez, alpha_z = e, alpha
            else:
                alpha_z = tl.exp(m_raw * inv_tz - m_new * inv_tz)
                ez = tl.exp(raw * inv_tz - (m_new * inv_tz)[:, None])
                lz = lz * alpha_z + tl.sum(ez, 1)
            _z_update(zpart, e_ptr, ez, alpha_z, rm, row_ok, offs_v, v_ok, hidden,
                      start == lo, BLOCK_D, IEEE)  # fmt: skip
        m_raw = m_new
    out = split * rows + rm
    tl.store(part_m_ptr + out, m_raw, mask=row_ok)
    tl.store(part_s_ptr + out, s, mask=row_ok)
    tl.store(part_t_ptr + out, t, mask=row_ok)
    tl.store(part_lz_ptr + out, lz, mask=row_ok)
    tl.store(part_arg_ptr + out, best, mask=row_ok)


@triton.jit
def _vocab_combine_kernel(
    part_m_ptr, part_s_ptr, part_t_ptr, part_lz_ptr, part_arg_ptr, zpart_ptr,
    token_ptr, conf_ptr, entropy_ptr, log_z_ptr, z_ptr,
    rows, hidden, splits, vocab, inv_t, inv_tz,
    SPLITS_P: tl.constexpr, BLOCK_D: tl.constexpr, WITH_Z: tl.constexpr, SAME: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0)
    sp = tl.arange(0, SPLITS_P)
    ok = sp < splits
    mr = tl.load(part_m_ptr + sp * rows + row, mask=ok, other=float("-inf"))
    big = tl.max(mr, 0)
    arg = tl.load(part_arg_ptr + sp * rows + row, mask=ok, other=0)
    token = tl.min(tl.where(ok & (mr == big), arg, vocab), 0)  # the first split holding the max
    m = big * inv_t
    w = tl.where(ok, tl.exp(mr * inv_t - m), 0.0)
    total = tl.sum(tl.load(part_s_ptr + sp * rows + row, mask=ok, other=0.0) * w, 0)
    tx = tl.sum(tl.load(part_t_ptr + sp * rows + row, mask=ok, other=0.0) * w, 0)
    log_z = m + tl.log(total)
    if tl.program_id(1) == 0:
        tl.store(token_ptr + row, token.to(tl.int64))
        tl.store(conf_ptr + row, tl.exp(m - log_z))
        tl.store(entropy_ptr + row, log_z - tx / total)
        tl.store(log_z_ptr + row, log_z)
    if WITH_Z:
        if SAME:
            wz = w / total
        else:
            wz = tl.where(ok, tl.exp(mr * inv_tz - big * inv_tz), 0.0)
            lz = tl.load(part_lz_ptr + sp * rows + row, mask=ok, other=0.0)
            wz = wz / tl.sum(lz * wz, 0)
        offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = offs_d < hidden
        zp = zpart_ptr + (sp[:, None].to(tl.int64) * rows + row) * hidden + offs_d[None, :]
        zs = tl.load(zp, mask=ok[:, None] & d_ok[None, :], other=0.0)
        z = tl.sum(zs * wz[:, None], 0)
        tl.store(
            z_ptr + row.to(tl.int64) * hidden + offs_d, z.to(z_ptr.dtype.element_ty), mask=d_ok
        )


def launch_shape(rows: int, vocab: int, sms: int) -> tuple[int, int, int]:
    """(BLOCK_M, splits, split_len): the row block (16 / 32 / 64 rows; tl.dot needs >= 16) and
    the vocabulary splits, so that row blocks x splits fill about two waves of `sms` and every
    split holds at least one chunk (a function of the shape class only: no autotuning)."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    chunks = triton.cdiv(vocab, BLOCK_V)
    want = max(1, min(256, triton.cdiv(2 * sms, triton.cdiv(rows, block_m)), chunks))
    per_split = triton.cdiv(chunks, want)
    return block_m, triton.cdiv(chunks, per_split), per_split * BLOCK_V


def vocab_pass(
    h: torch.Tensor,
    weight: torch.Tensor,
    embed: torch.Tensor | None,
    temperature: float,
    z_temperature: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """h [rows, hidden], weight [vocab, hidden] (the head), embed [vocab, hidden] or None (no z):
    (argmax [rows] long, confidence, entropy, log_z [rows] fp32 of softmax(logits / T); T <= 0:
    T = 1), and z = softmax(logits / z_temperature) @ embed [rows, hidden] in embed's dtype."""
    rows, hidden = h.shape
    vocab = weight.shape[0]
    h, weight = h.contiguous(), weight.contiguous()
    with_z = embed is not None
    e = embed.contiguous() if with_z else weight
    dev = h.device
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    inv_tz = 1.0 / z_temperature
    block_m, splits, split_len = launch_shape(rows, vocab, sm_count(dev))
    part = [torch.empty(splits, rows, dtype=torch.float32, device=dev) for _ in range(4)]
    arg = torch.empty(splits, rows, dtype=torch.int32, device=dev)
    zshape = (splits, rows, hidden) if with_z else (1,)  # no z: the scratch is never touched
    zpart = torch.empty(zshape, dtype=torch.float32, device=dev)
    ieee = h.dtype == torch.float32
    same = inv_t == inv_tz
    _vocab_split_kernel[(triton.cdiv(rows, block_m), splits)](
        h, weight, e, rows, vocab, hidden, split_len, inv_t, inv_tz, *part, arg, zpart,
        BLOCK_M=block_m, BLOCK_V=BLOCK_V, BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D, WITH_Z=with_z,
        SAME=same, ROUND=h.dtype != torch.float32, IEEE=ieee, num_warps=4 if block_m < 64 else 8,
        **pdl.launch(),
    )  # fmt: skip
    token = torch.empty(rows, dtype=torch.long, device=dev)
    conf, entropy, log_z = (torch.empty(rows, dtype=torch.float32, device=dev) for _ in range(3))
    z = torch.empty(rows, hidden, dtype=e.dtype, device=dev) if with_z else None
    d_blocks = triton.cdiv(hidden, BLOCK_D) if with_z else 1
    _vocab_combine_kernel[(rows, d_blocks)](
        *part, arg, zpart, token, conf, entropy, log_z, z if with_z else conf,
        rows, hidden, splits, vocab, inv_t, inv_tz,
        SPLITS_P=triton.next_power_of_2(splits), BLOCK_D=BLOCK_D, WITH_Z=with_z, SAME=same,
        num_warps=4, **pdl.launch(),
    )  # fmt: skip
    return token, conf, entropy, log_z, z
