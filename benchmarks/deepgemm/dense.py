"""One dense projection x [rows, K] @ w [N, K]^T on DeepGEMM against torch and our FP8 path:
GPU µs (a CUDA graph of calls cycling over weight copies that exceed the L2, so the weight comes
from HBM as in a round: `ops/fp8_choice.py` `cold_time_us`), the floors, and each result checked
against an fp32 reference of the same operands.

- bf16: cuBLAS (F.linear) vs DeepGEMM `bf16_gemm_nt(a, b, d)` (csrc/apis/gemm.hpp: D = A @ B^T,
  A [M, K], B [N, K], D [M, N] preallocated).
- fp8: our FP8 path as a model runs it (`fp8_choice.measure`: the faster of cuBLAS
  `torch._scaled_mm` with per-row x per-channel scales and kernels/fp8_gemm.py over its candidate
  configs; the activation's codes given, as from a fused producer) vs DeepGEMM `fp8_gemm_nt((a,
  sfa), (b, sfb), d, disable_ue8m0_cast=True)` (csrc/apis/gemm.hpp; the SM90 call of
  tests/test_fp8_fp4.py `test_gemm`: legacy recipe, fp32 scales) with 1x128 activation and
  128x128 weight scales from DeepGEMM's `per_token_cast_to_fp8` / `per_block_cast_to_fp8`
  (deep_gemm/utils/math.py, use_ue8m0=False). The activation's scales are handed over already
  MN-major and TMA-aligned (`get_mn_major_tma_aligned_tensor`, deep_gemm/utils/__init__.py from
  csrc/jit_kernels/impls/smxx_layout.hpp; a fused producer would write them so), so the timed call
  transforms nothing; that transposition's own time is `sfa_layout_us`.

Tolerance: relative Frobenius error <= TOL against the fp32 product of the operands each GEMM
was given (bf16 for bf16; the dequantized codes for FP8): only the summation order and the bf16
output rounding differ. DeepGEMM's own `calc_diff` (its FP8 tests want < 1e-3) is recorded too.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F

from benchmarks.common import PEAK_BYTES, PEAK_FLOPS
from benchmarks.deepgemm import quant
from benchmarks.deepgemm.cases import Dense
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops import fp8_choice
from dlmrt.ops.timing import graph_time_us

TOL = 1e-2
KINDS = ("bf16", "fp8")


def floors(rows: int, n: int, k: int, bytes_per: int) -> dict[str, float]:
    """µs floors: FLOPs at the dense peak (FP8: twice bf16's), and the weight + activation + bf16
    output bytes at the device's copy bandwidth (benchmarks/common.py)."""
    flops = 2 * rows * n * k / (PEAK_FLOPS * (2 if bytes_per == 1 else 1))
    moved = (n * k + rows * k) * bytes_per + rows * n * 2
    return {"flop_floor_us": flops * 1e6, "byte_floor_us": moved / PEAK_BYTES * 1e6}


def run(
    dg: ModuleType, shape: Dense, rows: int, kind: str, warm_only: bool = False, ours: bool = True
) -> dict:
    """One (shape, rows, kind) row; `warm_only`: only DeepGEMM's calls, once each (its JIT
    compiles them into DG_JIT_CACHE_DIR), nothing timed; `ours`: time our FP8 path too."""
    dev = torch.device("cuda")
    gen = torch.Generator(dev).manual_seed(rows * 31 + shape.n + shape.k)
    x = torch.randn(rows, shape.k, device=dev, generator=gen, dtype=torch.bfloat16)
    if warm_only:
        ws = [torch.randn(shape.n, shape.k, device=dev, dtype=torch.bfloat16) / shape.k**0.5]
    else:
        ws, _ = fp8_choice.cold_weights(shape.n, shape.k, dev)
    row = {"shape": shape.name, "family": shape.family, "rows": rows, "n": shape.n, "k": shape.k}
    row |= {"kind": kind} | floors(rows, shape.n, shape.k, 2 if kind == "bf16" else 1)
    if kind == "bf16":
        row |= _bf16(dg, x, ws, warm_only)
    else:
        row |= _fp8(dg, x, ws, warm_only, ours)
    return quant.rounded(row)


def _bf16(dg: ModuleType, x: torch.Tensor, ws: list, warm_only: bool) -> dict:
    d = torch.empty(x.shape[0], ws[0].shape[0], device=x.device, dtype=torch.bfloat16)

    def call(w: torch.Tensor) -> None:
        dg.bf16_gemm_nt(x, w, d)  # csrc/apis/gemm.hpp: bf16_gemm_nt(a, b, d, c=None, "nk")

    call(ws[0])
    if warm_only:
        return {}
    want = x.float() @ ws[0].float().t()
    err = quant.rel_error(d, want)
    out = {"deepgemm_rel_err": err, "deepgemm_calc_diff": quant.calc_diff(d, want)}
    out |= {"cublas_rel_err": quant.rel_error(F.linear(x, ws[0]), want), "ok": err <= TOL}
    out["cublas_us"] = fp8_choice.cold_time_us(lambda w: F.linear(x, w), ws)
    out["deepgemm_us"] = fp8_choice.cold_time_us(call, ws)
    return out


def _fp8(dg: ModuleType, x: torch.Tensor, ws: list, warm_only: bool, ours: bool) -> dict:
    rows, n = x.shape[0], ws[0].shape[0]
    if warm_only:  # a kernel depends on shapes and layouts only: skip the casts' temporaries
        a, bs = _blank(x.shape), [_blank(ws[0].shape, weight=True)]
    else:
        a = dg.per_token_cast_to_fp8(x, use_ue8m0=False)  # deep_gemm/utils/math.py
        bs = [dg.per_block_cast_to_fp8(w, use_ue8m0=False) for w in ws]
    sfa = dg.get_mn_major_tma_aligned_tensor(a[1])  # the layout its SM90 kernels read
    d = torch.empty(rows, n, device=x.device, dtype=torch.bfloat16)

    def call(b: tuple) -> None:
        dg.fp8_gemm_nt((a[0], sfa), b, d, disable_ue8m0_cast=True)  # csrc/apis/gemm.hpp

    call(bs[0])
    if warm_only:
        return {}
    want = quant.reference_fp8(a, bs[0])
    err = quant.rel_error(d, want)
    out = {"deepgemm_rel_err": err, "deepgemm_calc_diff": quant.calc_diff(d, want)}
    out["twin_casts_equal"] = _twins_equal(x, a, ws[0], bs[0])
    out["deepgemm_us"] = fp8_choice.cold_time_us(call, bs)
    out["sfa_layout_us"] = graph_time_us(lambda: dg.get_mn_major_tma_aligned_tensor(a[1]))
    mine = _ours(x, ws[0]) if ours else {}
    return out | mine | {"ok": err <= TOL and mine.get("ours_rel_err", 0.0) <= TOL}


def _blank(shape: torch.Size, weight: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero codes and unit scales of a 1x128 (or, `weight`, 128x128) cast of that shape."""
    m, k = shape
    codes = torch.zeros(m, k, device="cuda", dtype=quant.FP8)
    rows = -(-m // quant.GRAN) if weight else m
    return codes, torch.ones(rows, -(-k // quant.GRAN), device="cuda")


def _twins_equal(x: torch.Tensor, a: tuple, w: torch.Tensor, b: tuple) -> bool:
    """Whether quant.py's casts give DeepGEMM's codes and scales bit for bit (the reference and
    the grouped benchmark use them)."""

    def same(p: tuple, q: tuple) -> bool:
        codes = torch.equal(p[0].view(torch.uint8), q[0].view(torch.uint8))
        return codes and torch.equal(p[1], q[1])

    return same(quant.per_token_cast(x), a) and same(quant.per_block_cast(w), b)


def _ours(x: torch.Tensor, w: torch.Tensor) -> dict:
    """Our FP8 path at this shape (the start-up measurement's own timing and pick), and its error
    against the fp32 product of its own operands (per-row x per-channel codes)."""
    rows, n, k = x.shape[0], w.shape[0], x.shape[1]
    bf16_us, fp8_us, config = fp8_choice.measure(rows, n, k, x.device, fused_input=True)
    xq, wq = fp8_ops.quant_rows(x), quantize_per_channel(w)
    plan = None if config is None else fp8_ops.GemmPlan.new(rows, n, config, x.device)
    got = fp8_ops.fp8_linear(xq, wq, plan=plan)
    want = xq.dequantize(torch.float32) @ wq.dequantize(torch.float32).t()
    return {
        "ours_us": fp8_us,
        "ours_config": fp8_choice.describe(config),
        "ours_bf16_cublas_us": bf16_us,  # fp8_choice's own bf16 timing (same method)
        "ours_rel_err": quant.rel_error(got, want),
    }
