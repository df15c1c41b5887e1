"""DiffusionGemma's vocabulary pass with each canvas row's vocabulary split over several programs.

The outputs of kernels/canvas_vocab.py (argmax, entropy, the inverse-CDF sample, the next step's
self-conditioning probabilities `sc`) from a grid of rows x splits instead of one program per row
(256 programs on 132 SMs at DiffusionGemma's canvas, each streaming 262,144 entries alone). The
split count follows the SM count (`launch_shape`). Two kernels, the same two passes:

  stats   program (row, split): pass 1 of canvas_vocab over its split (per-lane online max,
          S0, S1, argmax, the rounded z's normaliser), reduced to one partial per split
          (`part` [6, splits, rows] fp32, `arg` [splits, rows]); split 0 zeroes the row's sample.
  finish  program (row, split): merges its row's partials (every program all of them: a few
          hundred floats from L2, no third launch) into the row's max M, total sum e^(z - M),
          entropy and argmax (split 0 writes those two), the log-normaliser of the rounded z, and
          its split's exclusive prefix of the split totals; then pass 2 over its split: the
          probabilities into `sc`, and the number of its entries whose cumulative sum (from the
          prefix) is <= u * total, added atomically into the row's sample (integer adds: the
          order of the programs does not change the sum).

The last entry of the vocabulary never counts, so the sum is the one-program kernel's clamp at
V - 1 without a pass after the atomics. Differences from kernels/canvas_vocab.py, from the order
of fp32 additions only: the total, the prefixes and the normalisers are summed per split, then
over splits, so entropy and `sc` differ in the last bits, and the sample differs only where
u * total falls within that rounding of a step of the cumulative sum (a draw on a boundary).
The argmax (first index among ties) is exact. The blocks of pass 2 are the one-program kernel's
blocks (a split spans whole blocks), so the in-block cumulative sums are the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt
from .canvas_vocab import _BIG, BLOCK, _reduce, _sample_pass, _stats_pass
from .device import sm_count

PROGRAMS_PER_SM = 8  # programs the split count aims at per SM: ~4 waves at 2 resident each
STATS = 6  # the per-split partials in `part`: M, S0, S1, best z, M_y, S_y


@triton.jit
def _split_stats_kernel(r_ptr, t_ptr, sc_ptr, part_ptr, arg_ptr, sample_ptr, cap, stride_r,
                        rows, V: tl.constexpr, SPAN: tl.constexpr, BLOCK: tl.constexpr,
                        SOFTCAP: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """sc_ptr is read for its dtype only (the rounding of the normaliser's z)."""
    pdl.enter(PDL)
    row = tl.program_id(0)
    sp = tl.program_id(1)
    t = tl.load(t_ptr)
    r_row = r_ptr + row.to(tl.int64) * stride_r
    sc_dtype = sc_ptr.dtype.element_ty
    lanes = _stats_pass(r_row, sp * SPAN, t, cap, sc_dtype, V, SPAN, BLOCK, SOFTCAP)
    m, s0, s1, best, best_i, m_y, s_y = lanes
    argmax, big_m, total, rel, big_y, sum_y = _reduce(m, s0, s1, best, best_i, m_y, s_y)
    at = part_ptr + sp * rows + row
    plane = tl.num_programs(1) * rows
    tl.store(at, big_m)
    tl.store(at + plane, total)
    tl.store(at + 2 * plane, rel)
    tl.store(at + 3 * plane, tl.max(best, 0))
    tl.store(at + 4 * plane, big_y)
    tl.store(at + 5 * plane, sum_y)
    tl.store(arg_ptr + sp * rows + row, argmax)
    if sp == 0:
        tl.store(sample_ptr + row, 0)


@triton.jit
def _split_finish_kernel(r_ptr, t_ptr, u_ptr, sc_ptr, part_ptr, arg_ptr, argmax_ptr,
                         entropy_ptr, sample_ptr, cap, stride_r, stride_sc, rows, splits,
                         V: tl.constexpr, SPAN: tl.constexpr, BLOCK: tl.constexpr,
                         SPLITS_P: tl.constexpr, SOFTCAP: tl.constexpr,
                         PDL: tl.constexpr = False):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0)
    sp = tl.program_id(1)
    k = tl.arange(0, SPLITS_P)
    ok = k < splits
    at = part_ptr + k * rows + row
    plane = splits * rows
    m = tl.load(at, mask=ok, other=float("-inf"))
    s0 = tl.load(at + plane, mask=ok, other=0.0)
    s1 = tl.load(at + 2 * plane, mask=ok, other=0.0)
    best = tl.load(at + 3 * plane, mask=ok, other=float("-inf"))
    m_y = tl.load(at + 4 * plane, mask=ok, other=float("-inf"))
    s_y = tl.load(at + 5 * plane, mask=ok, other=0.0)
    best_i = tl.load(arg_ptr + k * rows + row, mask=ok, other=_BIG)
    argmax, big_m, total, rel, big_y, sum_y = _reduce(m, s0, s1, best, best_i, m_y, s_y)
    if sp == 0:
        tl.store(argmax_ptr + row, argmax.to(tl.int64))
        tl.store(entropy_ptr + row, tl.log(total) - rel / total)
    # the splits before this one, in the e^(z - M) scale: where this split's cumulative sum starts
    w = tl.where(m > float("-inf"), tl.exp(m - big_m), 0.0)
    running = tl.sum(tl.where(k < sp, s0 * w, 0.0), 0)
    target = tl.load(u_ptr + row) * total
    r_row = r_ptr + row.to(tl.int64) * stride_r
    sc_row = sc_ptr + row.to(tl.int64) * stride_sc
    log_z_y = big_y + tl.log(sum_y)
    count = _sample_pass(r_row, sc_row, sp * SPAN, tl.load(t_ptr), cap, big_m, log_z_y, target,
                         running, V - 1, V, SPAN, BLOCK, SOFTCAP)  # fmt: skip
    tl.atomic_add(sample_ptr + row, count.to(tl.int64))


def launch_shape(rows: int, vocab: int, sms: int, block: int) -> tuple[int, int]:
    """(splits, span): the vocabulary of a row in `splits` spans of `span` entries (whole blocks
    of `block`; the last span may be short), so that rows x splits reaches PROGRAMS_PER_SM
    programs a SM where the vocabulary has blocks enough (DiffusionGemma on an H100: 256 rows x
    5 splits of 26 blocks of 2,048)."""
    blocks = triton.cdiv(vocab, block)
    want = max(1, min(blocks, triton.cdiv(PROGRAMS_PER_SM * sms, rows)))
    per_split = triton.cdiv(blocks, want)
    return triton.cdiv(blocks, per_split), per_split * block


def canvas_vocab(
    raw: torch.Tensor,  # [rows, V] the LM head's output (any float dtype)
    softcap: float | None,  # the final logit softcap (None: none)
    temperature: torch.Tensor,  # 0-d fp32 device scalar
    u: torch.Tensor,  # [rows] fp32 uniforms in [0, 1)
    sc: torch.Tensor,  # [rows, V] out: the self-conditioning probabilities, model dtype
    splits: int | None = None,  # None: `launch_shape`'s (the benchmark sweeps others)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # argmax, entropy, sampled
    """kernels/canvas_vocab.py's op over rows x vocabulary splits (this module's docstring)."""
    rows, vocab = raw.shape
    if raw.stride(-1) != 1 or sc.stride(-1) != 1:
        raise ValueError("canvas_vocab: raw logits and sc need a contiguous last dim")
    if splits is not None and splits < 1:
        raise ValueError(f"canvas_vocab: splits must be >= 1, got {splits}")
    block = BLOCK if raw.is_cuda else 64
    if splits is None:
        splits, span = launch_shape(rows, vocab, sm_count(raw.device), block)
    else:
        span = triton.cdiv(triton.cdiv(vocab, block), splits) * block
        splits = triton.cdiv(vocab, span)  # every split holds at least one entry
    dev = raw.device
    part = torch.empty(STATS, splits, rows, dtype=torch.float32, device=dev)
    arg = torch.empty(splits, rows, dtype=torch.int32, device=dev)
    argmax = torch.empty(rows, dtype=torch.int64, device=dev)
    sampled = torch.empty_like(argmax)
    entropy = torch.empty(rows, dtype=torch.float32, device=dev)
    t = temperature.float()
    cap = 1.0 if softcap is None else float(softcap)
    shape = dict(V=vocab, SPAN=span, BLOCK=block, SOFTCAP=softcap is not None)
    warps = 8 if raw.is_cuda else 1
    _split_stats_kernel[(rows, splits)](
        raw, t, sc, part, arg, sampled, cap, raw.stride(0), rows, **shape, num_warps=warps,
        **pdl.launch(),
    )  # fmt: skip
    _split_finish_kernel[(rows, splits)](
        raw, t, u.float().contiguous(), sc, part, arg, argmax, entropy, sampled, cap,
        raw.stride(0), sc.stride(0), rows, splits, **shape,
        SPLITS_P=triton.next_power_of_2(splits), num_warps=warps, **pdl.launch(),
    )  # fmt: skip
    return argmax, entropy, sampled
