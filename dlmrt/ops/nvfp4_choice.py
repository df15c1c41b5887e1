"""Whether a dense NVFP4 MLP runs the W4A16 kernel or is dequantized to bf16: measured once.

The dense kernel (`kernels/linear_nvfp4.py`) decodes every weight tile once per BM-row tile of the
input, so its cost grows with the rows while a bf16 GEMM's is flat at few rows. On the H200
(`benchmarks/results/round_latency_qwen_dlm_nvfp4_h200_2026-12-02.json`) QwenDLM-4B's 256-row round
took 10.99 ms with its MLPs on the kernel against 5.66 ms in bf16; DiffusionGemma's step 19.57 vs
18.59 ms with its dense GeGLUs on it. So on CUDA each MLP's gate|up and down GEMMs are timed both
ways at the model's block rows (`timing.graph_time_us`: a replayed CUDA graph, GPU time only)
and the faster kept; dequantized, the weights take 3.5x the memory. DLMRT_NVFP4_DENSE=kernel keeps
the kernel (memory first), =dequantize never uses it. The W4A4 emulation always installs it (its
numerics are the point), and so does the CPU (which only installs under the emulation). Each
choice is recorded in the choices registry (`ops/choices.py`: logged once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlmrt import envs
from dlmrt.formats.nvfp4 import quantize_nvfp4
from dlmrt.ops import choices
from dlmrt.ops import nvfp4 as nvfp4_ops
from dlmrt.ops.timing import graph_time_us

_MEASURED: dict[tuple[int, int, int], tuple[float, float]] = {}


def measure(rows: int, n: int, k: int, device: torch.device) -> tuple[float, float]:
    """(bf16 µs, NVFP4 kernel µs) of one [rows, k] x [k, n] GEMM on `device` (cached per shape)."""
    key = (rows, n, k)
    if key not in _MEASURED:
        x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
        wq = quantize_nvfp4(w)
        bf16 = graph_time_us(lambda: F.linear(x, w))
        nvfp4 = graph_time_us(lambda: nvfp4_ops.linear_nvfp4(x, wq))
        _MEASURED[key] = (bf16, nvfp4)
    return _MEASURED[key]


def use_nvfp4_dense(
    rows: int, shapes: list[tuple[int, int]], device: torch.device
) -> tuple[bool, str]:
    """(run this MLP's [n, k] projections on the NVFP4 kernel?, why) for `rows` input rows;
    recorded in the choices registry."""
    ok, why, options = _decide(rows, shapes, device)
    what = f"nvfp4 dense mlp {rows} rows, " + ", ".join(f"{k}->{n}" for n, k in shapes)
    choices.record(what, "W4A16 kernel" if ok else "dequantized", why, options)
    return ok, why


def _decide(
    rows: int, shapes: list[tuple[int, int]], device: torch.device
) -> tuple[bool, str, dict[str, float]]:
    policy = envs.nvfp4_dense()
    if policy != "measured" or device.type != "cuda":
        why = f"DLMRT_NVFP4_DENSE={policy}" if device.type == "cuda" else "CPU"
        return policy != "dequantize", why, {}
    bf16 = nvfp4 = 0.0
    for n, k in shapes:
        b, q = measure(rows, n, k, device)
        bf16, nvfp4 = bf16 + b, nvfp4 + q
    why = f"{rows} rows: bf16 {bf16:.1f} us, NVFP4 kernel {nvfp4:.1f} us"
    return nvfp4 < bf16, why, {"bf16": bf16, "NVFP4 kernel": nvfp4}
