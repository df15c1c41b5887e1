"""One key tile folded into a flash-style online softmax: the step the attention kernels share.

Scores are kept in log2 units (`qk_scale` = scale * log2(e)): `exp2` is one MUFU instruction where
`exp` is a multiply and an `exp2`, and the scale folds into the one multiply the scores need anyway.
The accumulator is rescaled and handed to the P·V dot as its accumulator (`tl.dot(p, v, acc)`), so
on Hopper the wgmma adds in place instead of producing a second [BLOCK_M, D] tile to add.

MASKED: the tile may hold keys some rows must not see (`visible`); then a row that has seen
nothing yet keeps m = -inf, and the rescale uses 0 in its place (exp2(-inf - -inf) would be NaN).
Unmasked tiles (every row sees every key: the interior of a block's range) skip the compare, the
select and that guard: most of a round's tiles.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def scores(q, k, IEEE: tl.constexpr):
    """q · kᵀ in fp32 (exact "ieee" products for the fp32 parity tests)."""
    if IEEE:
        return tl.dot(q, tl.trans(k), input_precision="ieee")
    return tl.dot(q, tl.trans(k))


@triton.jit
def fold(acc, m_i, l_i, s, v, visible, MASKED: tl.constexpr, IEEE: tl.constexpr):
    """Fold scores s [M, N] (fp32, already times qk_scale) and values v [N, DV]
    into (acc [M, DV] unnormalised, m_i running max, l_i running sum). Returns the new triple."""
    if MASKED:
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new_safe = m_new
    p = tl.math.exp2(s - m_new_safe[:, None])
    alpha = tl.math.exp2(m_i - m_new_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def key_tile(acc, m_i, l_i, first, q, k_rows, v_rows, stride_kn, stride_vn, row_end, hi, qk_scale,
             MASKED: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
    """Load key tile [first, first + BLOCK_N) of one arena layer's K / V rows (`k_rows`, `v_rows`:
    pointers [1, D] at row 0) and fold it in. MASKED: keys >= hi are not loaded and every row sees
    only keys < its row_end; unmasked: every key is loaded and seen. An FP8 arena is dequantized in
    registers."""
    offs_n = first + tl.arange(0, BLOCK_N)
    if MASKED:
        in_tile = offs_n < hi
        k = tl.load(k_rows + offs_n[:, None] * stride_kn, mask=in_tile[:, None], other=0.0)
        v = tl.load(v_rows + offs_n[:, None] * stride_vn, mask=in_tile[:, None], other=0.0)
        visible = (offs_n[None, :] < row_end[:, None]) & in_tile[None, :]
    else:
        k = tl.load(k_rows + offs_n[:, None] * stride_kn)
        v = tl.load(v_rows + offs_n[:, None] * stride_vn)
        visible = row_end  # unused: every row sees every key of an unmasked tile
    s = scores(q, k.to(q.dtype), IEEE) * qk_scale
    return fold(acc, m_i, l_i, s, v.to(q.dtype), visible, MASKED, IEEE)


@triton.jit
def key_range(acc, m_i, l_i, lo, hi, q, k_rows, v_rows, stride_kn, stride_vn, row_end, end,
              qk_scale, MASKED: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
              WHILE: tl.constexpr, WS: tl.constexpr = False):  # fmt: skip
    """Key tiles [lo, hi) (lo on the tile grid; lo >= hi: none), each through `key_tile` with
    its load bound `end`. WHILE: the interpreter's loop form (it cannot range() over tensor
    bounds; a while loop is not software-pipelined on the GPU, so CUDA keeps the for loop).
    WS: the loop warp-specialized by Triton (loads and MMAs in their own warps; measured by
    benchmarks/kernels/attention_peers.py, not shipped: see docs/kernels.md)."""
    if WHILE:
        first = lo
        while first < hi:
            acc, m_i, l_i = key_tile(acc, m_i, l_i, first, q, k_rows, v_rows, stride_kn,
                                     stride_vn, row_end, end, qk_scale, MASKED, BLOCK_N,
                                     IEEE)  # fmt: skip
            first += BLOCK_N
    elif WS:
        for first in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
            acc, m_i, l_i = key_tile(acc, m_i, l_i, first, q, k_rows, v_rows, stride_kn,
                                     stride_vn, row_end, end, qk_scale, MASKED, BLOCK_N,
                                     IEEE)  # fmt: skip
    else:
        for first in range(lo, hi, BLOCK_N):
            acc, m_i, l_i = key_tile(acc, m_i, l_i, first, q, k_rows, v_rows, stride_kn,
                                     stride_vn, row_end, end, qk_scale, MASKED, BLOCK_N,
                                     IEEE)  # fmt: skip
    return acc, m_i, l_i
