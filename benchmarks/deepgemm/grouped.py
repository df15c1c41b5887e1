"""A MoE family's routed experts on DeepGEMM's M-grouped GEMMs against our expert kernels: GPU µs
(graph-replayed), floors, and every DeepGEMM result checked per expert against an fp32 reference.

DeepGEMM runs the two projections of the experts as two grouped GEMMs, in either layout
(layouts.py): gate|up over the routed rows of x, down over the pairs' hidden rows (random: the
activation between them and the weighted sum after are not DeepGEMM's, so they are not timed).
Their sum is a lower bound of a layer on DeepGEMM; ours is the whole layer (`ops.moe_mlp`, and
W8A8 `ops/moe_fp8.py` for FP8: routing sort, both projections, activation, weighted sum), the
kernels the models run. Calls, as csrc/apis/gemm.hpp declares them and tests/test_fp8_fp4.py /
tests/test_bf16.py call them on SM90:
  m_grouped_bf16_gemm_nt_masked(a [E, cap, K], b [E, N, K], d [E, cap, N], masked_m, expected_m)
  m_grouped_bf16_gemm_nt_contiguous(a [M, K], b, d [M, N], grouped_layout [M])
  m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m, expected_m, disable_ue8m0_cast=True)
  m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, grouped_layout, disable_ue8m0_cast=True)
FP8 operands: quant.py's twins of DeepGEMM's casts (bit-identical, checked on the dense shapes),
vectorized over the experts; sfa handed over MN-major and TMA-aligned (dense.py says why).
Routing: uniform random top-k (random weights route so), or over the first `touched` experts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import torch

from benchmarks.common import PEAK_BYTES, PEAK_FLOPS
from benchmarks.deepgemm import layouts, quant
from benchmarks.deepgemm.dense import TOL
from benchmarks.kernels.moe_layer import Shape
from dlmrt import ops
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.ops import moe_fp8
from dlmrt.ops.timing import graph_time_us

LAYOUTS = ("masked", "contiguous")


def run(
    dg: ModuleType,
    family: str,
    shape: Shape,
    kind: str,
    layout: str,
    touched: int | None = None,
    warm_only: bool = False,
) -> dict:
    """One (experts shape, kind, layout) row."""
    dev = torch.device("cuda")
    gen = torch.Generator(dev).manual_seed(0)
    e, h, i = shape.experts, shape.hidden, shape.inter
    x = torch.randn(shape.rows, h, device=dev, generator=gen).bfloat16()
    gate_up = (torch.randn(e, 2 * i, h, device=dev, generator=gen) / h**0.5).bfloat16()
    down = (torch.randn(e, h, i, device=dev, generator=gen) / i**0.5).bfloat16()
    index = layouts.uniform_index(shape.rows, e, shape.top_k, touched, gen)
    r = layouts.route(index, e)
    pairs = index.numel()
    hidden = torch.randn(pairs, i, device=dev, generator=gen).bfloat16()  # down's input rows
    r_hidden = dataclasses.replace(r, row=torch.arange(pairs, device=dev))
    n_touched = int((r.counts > 0).sum())
    row = {"family": family, "shape": shape.name, "rows": shape.rows, "kind": kind}
    row |= {"layout": layout, "touched_experts": n_touched, "pairs": pairs}
    row |= _floors(shape, pairs, n_touched, 2 if kind == "bf16" else 1)
    expected_m, cap = -(-pairs // n_touched), layouts.capacity(shape.rows)
    for name, src, rr, w in (("gate_up", x, r, gate_up), ("down", hidden, r_hidden, down)):
        gemm = _grouped(dg, kind, layout, src, rr, w, cap, expected_m)
        gemm.call()
        if warm_only:
            continue
        row[f"{name}_us"] = graph_time_us(gemm.call)
        row[f"{name}_rel_err"] = gemm.check()
    if warm_only:
        return row
    row["deepgemm_two_gemms_us"] = row["gate_up_us"] + row["down_us"]
    row["ok"] = max(row["gate_up_rel_err"], row["down_rel_err"]) <= TOL
    row["ours_layer_us"] = _ours(shape, kind, x, index, gate_up, down, gen)
    return quant.rounded(row)


def _floors(shape: Shape, pairs: int, touched: int, bytes_per: int) -> dict[str, float]:
    """The two projections' floors: the touched experts' weights at the copy bandwidth, the
    pairs' FLOPs at the dense peak (FP8: twice bf16's)."""
    params = 3 * shape.hidden * shape.inter
    flops = 2 * pairs * params / (PEAK_FLOPS * (2 if bytes_per == 1 else 1))
    return {
        "flop_floor_us": flops * 1e6,
        "byte_floor_us": touched * params * bytes_per / PEAK_BYTES * 1e6,
    }


# csrc/apis/gemm.hpp's names (deep_gemm/__init__.py exports them), by (kind, layout)
FUNCTIONS = {
    ("bf16", "masked"): "m_grouped_bf16_gemm_nt_masked",
    ("bf16", "contiguous"): "m_grouped_bf16_gemm_nt_contiguous",
    ("fp8", "masked"): "m_grouped_fp8_gemm_nt_masked",
    ("fp8", "contiguous"): "m_grouped_fp8_gemm_nt_contiguous",
}


@dataclasses.dataclass
class _Gemm:
    call: Callable[[], None]  # the DeepGEMM call on prepared buffers
    check: Callable[[], float]  # relative error of the valid rows vs the fp32 reference


def _grouped(dg, kind: str, layout: str, src, r: layouts.Routed, w, cap: int, expected_m: int):
    """DeepGEMM's grouped A @ W[e]^T over the routed rows `r` of `src`, in `layout`."""
    if layout == "masked":
        a, masked_m = layouts.masked(src, r, cap)
        at = (r.expert, r.rank)  # each pair's row of A and D
    else:
        dg.set_mk_alignment_for_contiguous_layout(  # as tests/test_fp8_fp4.py does first
            dg.get_theoretical_mk_alignment_for_contiguous_layout()
        )
        a, grouped, pos = layouts.contiguous(src, r, dg.get_mk_alignment_for_contiguous_layout())
        at = (pos,)
    d = torch.empty(*a.shape[:-1], w.shape[1], device=a.device, dtype=torch.bfloat16)
    fn = getattr(dg, FUNCTIONS[kind, layout])
    if kind == "fp8":
        aq, bq = quant.per_token_cast(a), quant.per_block_cast(w)
        a_arg, b_arg = (aq[0], dg.get_mn_major_tma_aligned_tensor(aq[1])), bq
        extra = {"disable_ue8m0_cast": True}  # fp32 scales: the SM90 recipe
        rows_a = lambda: quant.dequant_tokens(aq[0][at], aq[1][at])  # noqa: E731
        weight = lambda e: quant.dequant_blocks(bq[0][e], bq[1][e])  # noqa: E731
    else:
        a_arg, b_arg, extra = a, w, {}
        rows_a = lambda: a[at].float()  # noqa: E731
        weight = lambda e: w[e].float()  # noqa: E731
    if layout == "masked":
        call = lambda: fn(a_arg, b_arg, d, masked_m, expected_m, **extra)  # noqa: E731
    else:
        call = lambda: fn(a_arg, b_arg, d, grouped, **extra)  # noqa: E731
    return _Gemm(call, lambda: _check(d[at], r.counts, rows_a(), weight))


def _check(got: torch.Tensor, counts: torch.Tensor, rows_a: torch.Tensor, weight) -> float:
    """Relative error of the pairs' output rows (sorted by expert) against the fp32 product of
    their input rows and their expert's weight (`weight(e)`), expert by expert."""
    want = torch.empty(got.shape, device=got.device, dtype=torch.float32)
    start = 0
    for e, count in enumerate(counts.tolist()):
        if count:
            want[start : start + count] = rows_a[start : start + count] @ weight(e).t()
            start += count
    return quant.rel_error(got, want)


def _ours(shape, kind, x, index, gate_up, down, gen) -> float:
    """µs of our whole routed-experts layer (the kernels the models run) on the same routing."""
    weights = torch.rand(index.shape, device=x.device, generator=gen).softmax(-1)
    if kind == "bf16":
        return graph_time_us(
            lambda: ops.moe_mlp(x, weights, index, gate_up, down, shape.activation)
        )
    gu8, d8 = quantize_per_channel(gate_up), quantize_per_channel(down)
    gs, us = (t.contiguous() for t in gu8.scale.chunk(2, dim=1))
    scales = (gs, us, d8.scale)
    return graph_time_us(
        lambda: moe_fp8.moe_mlp_w8a8(
            x, weights, index, gu8.qweight, d8.qweight, shape.activation, scales
        )
    )
