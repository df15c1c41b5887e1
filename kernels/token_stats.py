"""One pass over the vocabulary per row: argmax, its probability, entropy and log-normaliser.

x = logits / T (fp32); log_z = logsumexp(x); entropy = log_z - sum(p * x); confidence = p[argmax]
= exp(max - log_z). Online: running max, sum of exp(x - max) and of exp(x - max) * x, rescaled
when the max moves; argmax keeps the first index among ties (as torch.argmax).
Torch twin: `dlmrt.ops.reference.token_stats`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _token_stats_kernel(
    logits_ptr,
    stride_row,
    vocab,
    inv_t,
    token_ptr,
    conf_ptr,
    entropy_ptr,
    log_z_ptr,
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    offs = tl.arange(0, BLOCK_V)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    t = tl.zeros([], tl.float32)
    best = tl.zeros([], tl.int32)
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_t
        tile_max = tl.max(x, 0)
        tile_arg = tl.argmax(x, 0, tie_break_left=True) + start
        best = tl.where(tile_max > m, tile_arg, best)
        m_new = tl.maximum(m, tile_max)
        alpha = tl.exp(m - m_new)
        e = tl.exp(x - m_new)
        s = s * alpha + tl.sum(e, 0)
        t = t * alpha + tl.sum(tl.where(e > 0, e * x, 0.0), 0)
        m = m_new
    log_z = m + tl.log(s)
    tl.store(token_ptr + row, best.to(tl.int64))
    tl.store(conf_ptr + row, tl.exp(m - log_z))
    tl.store(entropy_ptr + row, log_z - t / s)
    tl.store(log_z_ptr + row, log_z)


def token_stats(
    logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [rows, vocab] -> argmax [rows] long, confidence, entropy, log_z [rows] fp32."""
    rows, vocab = logits.shape
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    dev = logits.device
    token = torch.empty(rows, dtype=torch.long, device=dev)
    conf, entropy, log_z = (torch.empty(rows, dtype=torch.float32, device=dev) for _ in range(3))
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    _token_stats_kernel[(rows,)](
        logits,
        logits.stride(0),
        vocab,
        inv_t,
        token,
        conf,
        entropy,
        log_z,
        BLOCK_V=4096,
        num_warps=8,
        **pdl.launch(),
    )
    return token, conf, entropy, log_z
