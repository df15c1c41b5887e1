"""FP8 ops: the producers that quantize their output (RMSNorm, SiLU·up, a plain row quantizer)
and the FP8 linear that consumes them. Each resolved like every op (`dlmrt.ops.implementation`):
CUDA -> kernels/fp8_quant.py and `torch._scaled_mm`; otherwise the torch twin.

Twins ("dequantize, then the bf16 op"): a producer is its plain op followed by `quantize_rows`;
`fp8_linear` multiplies the dequantized activation by the dequantized weight in fp32 and rounds
once to the output dtype. The fast path differs from the twin only in the GEMM's accumulation
order (`use_fast_accum`), so tests compare them within rounding.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dlmrt.formats.fp8 import AmaxAct, Fp8Weight, QuantAct, quantize_rows
from dlmrt.ops import gemma, implementation, reference


def _kernels():
    return importlib.import_module("dlmrt._kernels.fp8_quant")


def _gemm_kernel():
    return importlib.import_module("dlmrt._kernels.fp8_gemm")


def _glu_kernel():
    return importlib.import_module("dlmrt._kernels.fp8_glu_gemm")


@dataclass(frozen=True)
class GemmPlan:
    """Run a linear's FP8 GEMM on kernels/fp8_gemm.py at `rows` rows (other row counts, such as a
    prefill, take cuBLAS): the tile / split `config` the start-up measurement picked
    (`ops/fp8_choice.py`) and the kernel's zeroed per-tile counters (left zeroed by each call)."""

    rows: int
    config: tuple[int, ...]
    counts: torch.Tensor

    @staticmethod
    def new(rows: int, n: int, config: tuple[int, ...], device: torch.device) -> GemmPlan:
        tiles = -(-rows // config[0]) * -(-n // config[1])  # kernels/fp8_gemm.py: tiles(); no
        # Triton import here: a CPU install has none, and the CPU twin ignores the plan
        return GemmPlan(rows, config, torch.zeros(tiles, dtype=torch.int32, device=device))


@dataclass(frozen=True)
class GluPlan:
    """Run a gated MLP's gate|up GEMM and its activation as kernels/fp8_glu_gemm.py at `rows`
    rows, with the tile `config` (bm, bn, bk, stages, warps) the start-up measurement picked
    (`ops/fp8_glu_choice.py`); other row counts take the unfused path."""

    rows: int
    config: tuple[int, ...]


def _fast(x: torch.Tensor) -> bool:
    return x.is_cuda and x.stride(-1) == 1 and implementation("fp8") == "triton"


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor, eps: float) -> QuantAct:
    """quantize_rows(rms_norm(x)) in one kernel on CUDA."""
    if _fast(x):
        q, s, _ = _kernels().rms_norm_fp8(x, None, weight, eps)
        return QuantAct(q, s)
    return quantize_rows(reference.rms_norm(x, weight, eps))


def add_rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[QuantAct, torch.Tensor]:
    """(quantize_rows(rms_norm(x + residual)), x + residual) in one kernel on CUDA."""
    if _fast(x):
        q, s, total = _kernels().rms_norm_fp8(x, residual, weight, eps)
        return QuantAct(q, s), total
    y, total = reference.add_rms_norm(x, residual, weight, eps)
    return quantize_rows(y), total


def silu_mul_fp8(gate_up: torch.Tensor) -> QuantAct:
    """quantize_rows(silu_mul(gate_up)) in one kernel on CUDA."""
    if _fast(gate_up):
        return QuantAct(*_kernels().silu_mul_fp8(gate_up))
    return quantize_rows(reference.silu_mul(gate_up))


def glu_fp8(
    x: QuantAct | torch.Tensor,
    w: Fp8Weight,
    out_dtype: torch.dtype,
    plan: GluPlan | None,
    gelu: bool = False,
) -> AmaxAct | QuantAct:
    """act(x @ gate^T) * (x @ up^T) (w = gate|up [2I, K]; act: SiLU, or gelu_tanh with `gelu`)
    as the down projection's FP8 input: on CUDA at `plan.rows` rows one kernel
    (kernels/fp8_glu_gemm.py) giving the dtype result and its rows' amax; else the gate|up GEMM
    and the fused activation-quantizer. Same codes either way, up to the GEMMs' summation order."""
    act = x if isinstance(x, QuantAct) else quant_rows(x)
    if plan is not None and _fast(act.q) and act.q.shape[0] == plan.rows:
        y, amax = _glu_kernel().fp8_glu_gemm(
            act.q, act.scale, w.qweight, w.scale, out_dtype, plan.config, gelu
        )
        return AmaxAct(y, amax)
    gate_up = fp8_linear(act, w, out_dtype)
    if gelu:
        return quant_rows(gemma.gelu_mul(gate_up))
    return silu_mul_fp8(gate_up)


def quant_rows(x: torch.Tensor) -> QuantAct:
    """Per-row e4m3 codes and scales of x [M, K] (for a consumer whose producer is not fused)."""
    if _fast(x):
        return QuantAct(*_kernels().quant_rows(x))
    return quantize_rows(x)


def fp8_linear(
    x: QuantAct | AmaxAct | torch.Tensor,
    w: Fp8Weight,
    out_dtype: torch.dtype = torch.bfloat16,
    plan: GemmPlan | None = None,
) -> torch.Tensor:
    """x [M, K] (codes + row scales, a dtype tensor + row amax, or a plain tensor quantized here)
    @ w [N, K]^T -> [M, N]: on CUDA kernels/fp8_gemm.py where `plan` covers M rows, else
    `torch._scaled_mm`."""
    if isinstance(x, AmaxAct):
        if plan is not None and _fast(x.x) and x.x.shape[0] == plan.rows:
            return _gemm_kernel().fp8_gemm(
                x.x, x.amax, w.qweight, w.scale, plan.counts, out_dtype, plan.config, amax=True
            )
        x = x.x  # quantized below: the same codes (kernels/fp8_gemm.py's docstring)
    act = x if isinstance(x, QuantAct) else quant_rows(x)
    if act.q.is_cuda and implementation("fp8") == "triton":
        if plan is not None and act.q.shape[0] == plan.rows:
            return _gemm_kernel().fp8_gemm(
                act.q, act.scale, w.qweight, w.scale, plan.counts, out_dtype, plan.config
            )
        out = torch._scaled_mm(  # row-wise scales need a bf16 output; an fp32 model casts it
            act.q,
            w.qweight.t(),
            scale_a=act.scale,
            scale_b=w.scale.view(1, -1),
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
        )
        return out if out_dtype == torch.bfloat16 else out.to(out_dtype)
    return F.linear(act.dequantize(torch.float32), w.dequantize(torch.float32)).to(out_dtype)
