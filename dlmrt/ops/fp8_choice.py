"""Which dense linears run as FP8 GEMMs: measured per shape, once, at start-up.

FP8 does not win everywhere: at 32 rows the o and down projections of a 4B model run slower
as `torch._scaled_mm` than as bf16 cuBLAS (docs/quantization.md has the table). So each distinct
(rows, N, K) is timed both ways (a CUDA graph of 20 calls, replayed: GPU time only) and the
faster kept, unless DLMRT_FP8_GEMMS says "all" or "none". The FP8 time includes its activation's
quantization only when the producer is not fused (`fused_input=False`). CPU: always FP8 (the torch
twin runs; it exists to test numerics, not speed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlmrt import envs
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.timing import graph_time_us
from dlmrt.quant.fp8 import quantize_per_channel

_MEASURED: dict[tuple[int, int, int, bool], tuple[float, float]] = {}


def measure(
    rows: int, n: int, k: int, device: torch.device, fused_input: bool
) -> tuple[float, float]:
    """(bf16 µs, fp8 µs) of one [rows, k] x [k, n] GEMM on `device` (cached per shape)."""
    key = (rows, n, k, fused_input)
    if key not in _MEASURED:
        x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
        wq, xq = quantize_per_channel(w), fp8_ops.quant_rows(x)
        bf16 = graph_time_us(lambda: F.linear(x, w))
        fp8 = graph_time_us(lambda: fp8_ops.fp8_linear(xq if fused_input else x, wq))
        _MEASURED[key] = (bf16, fp8)
    return _MEASURED[key]


def use_fp8_gemm(
    rows: int, n: int, k: int, device: torch.device, fused_input: bool = True
) -> tuple[bool, str]:
    """(run this linear as an FP8 GEMM?, why) for `rows` rows of [k] -> [n]."""
    if k % 16 or n % 16:
        return False, f"{n}x{k}: FP8 GEMMs need both dims multiples of 16"
    policy = envs.fp8_gemms()
    if policy != "measured" or device.type != "cuda":
        return policy != "none", f"DLMRT_FP8_GEMMS={policy}" if device.type == "cuda" else "CPU"
    bf16, fp8 = measure(rows, n, k, device, fused_input)
    return fp8 < bf16, f"{rows}x{k}->{n}: bf16 {bf16:.1f} us, fp8 {fp8:.1f} us"
