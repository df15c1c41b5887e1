"""The routed experts' last step: y [rows, k, H] fp32 (one slot per (row, expert) pair, already
times its routing weight) -> [rows, H] in the model dtype, the k slots summed in slot order.

One pass (read y once, write the rows once) instead of torch's `y.sum(1).to(dtype)` (a reduction
kernel and a cast kernel: 12 + 2 us per DiffusionGemma layer on the H200). Slot order, fp32 sums,
one cast: eager runs and graph replays give the same bits, as the torch sum did. Optionally the
shared experts' output is added in the same pass (LLaDA2: one elementwise launch a layer fewer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl  # relative: kernels/ imports nothing from dlmrt

BLOCK = 1024


@triton.jit
def _slot_sum_kernel(
    y_ptr, add_ptr, out_ptr, H, stride_add,
    K: tl.constexpr, BLOCK: tl.constexpr, ADD: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    base = y_ptr + row * K * H + cols
    acc = tl.load(base, mask=ok, other=0.0)
    for s in tl.static_range(1, K):
        acc += tl.load(base + s * H, mask=ok, other=0.0)
    out = acc.to(out_ptr.dtype.element_ty)
    if ADD:  # rounded as torch's `out + add` in the dtype: one fp32 add of the two, one cast
        a = tl.load(add_ptr + row * stride_add + cols, mask=ok, other=0.0)
        out = (out.to(tl.float32) + a.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * H + cols, out, mask=ok)


def slot_sum(y: torch.Tensor, dtype: torch.dtype, add: torch.Tensor | None = None) -> torch.Tensor:
    """y [rows, k, H] fp32, contiguous -> sum over k in slot order, as `dtype` [rows, H]; plus
    `add` [rows, H] (`dtype`, unit stride along H: the shared experts' output), rounded as the
    separate add was."""
    rows, k, hidden = y.shape
    out = torch.empty((rows, hidden), dtype=dtype, device=y.device)
    grid = (rows, triton.cdiv(hidden, BLOCK))
    has_add = add is not None
    if has_add and (add.shape != out.shape or add.dtype != dtype or add.stride(-1) != 1):
        raise ValueError(f"slot_sum: add must be {dtype} [{rows}, {hidden}] with unit stride")
    _slot_sum_kernel[grid](
        y, add if has_add else out, out, hidden, add.stride(0) if has_add else 0,
        K=k, BLOCK=BLOCK, ADD=has_add, num_warps=4, **pdl.launch(),
    )  # fmt: skip
    return out
