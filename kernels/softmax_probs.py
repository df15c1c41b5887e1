"""p = exp(logits / T - log_z), written in the embedding dtype for the residual GEMM z = p @ E.

Reuses the decoder's log-normaliser (from `token_stats`), so the residual softmax is one read of
the logits and one write of p instead of several fp32 passes. Torch twin:
`dlmrt.ops.reference.softmax_probs`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt


@triton.jit
def _softmax_probs_kernel(
    logits_ptr,
    log_z_ptr,
    out_ptr,
    stride_l,
    vocab,
    temperature,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < vocab
    x = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=0.0).to(tl.float32)
    log_z = tl.load(log_z_ptr + row)
    p = tl.exp(x / temperature - log_z)
    tl.store(out_ptr + row * vocab + offs, p.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_probs(
    logits: torch.Tensor, log_z: torch.Tensor, temperature: float, dtype: torch.dtype
) -> torch.Tensor:
    """logits [rows, vocab], log_z [rows] fp32 -> p [rows, vocab] in `dtype`."""
    rows, vocab = logits.shape
    out = torch.empty((rows, vocab), dtype=dtype, device=logits.device)
    block = 4096
    _softmax_probs_kernel[(rows, triton.cdiv(vocab, block))](
        logits,
        log_z,
        out,
        logits.stride(0),
        vocab,
        float(temperature),
        BLOCK=block,
        num_warps=8,
        **pdl.launch(),
    )
    return out
