"""FP8 routed experts: the expert kernel with FP8 weights (weight-only, converted in registers)
against bf16, and against `torch._scaled_grouped_mm` (W8A8, row-wise scales), one MoE layer at
the LLaDA-2.1-mini and DiffusionGemma-26B shapes (`moe_layer.py`), graph-replayed.

python -m benchmarks.kernels.moe_fp8 [--iters 50] [--out results/moe_fp8.json]
"""

from __future__ import annotations

import torch

from benchmarks.common import cuda_time, graph_ms, shapes_main
from benchmarks.kernels.moe_layer import SHAPES, floor_ms, glu, make_layer, sort_by_expert
from dlmrt import ops
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.ops import fp8 as fp8_ops


def scaled_grouped(x, w, idx, gu, down, activation: str) -> torch.Tensor:
    """W8A8 experts on torch._scaled_grouped_mm: pairs sorted on the device, activations
    quantized per row, two grouped GEMMs, the activation in bf16, scatter-add back."""
    order, offs, src = sort_by_expert(idx, gu.qweight.shape[0])

    def gemm(rows: torch.Tensor, weight) -> torch.Tensor:
        a = fp8_ops.quant_rows(rows)
        return torch._scaled_grouped_mm(
            a.q,
            weight.qweight.transpose(1, 2),
            a.scale.view(-1),
            weight.scale,
            offs=offs,
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
        )

    y = gemm(glu(gemm(x[src], gu), activation).contiguous(), down)
    y = y * w.flatten()[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, src, y)


def bench(shape, iters: int) -> dict:
    from dlmrt._kernels import moe_mlp as kernel

    layer, route = make_layer(shape, torch.device("cuda"))
    _, _, x, gate_up, down = layer(None, parts=True)
    w, idx = route(ops)
    floor, touched = floor_ms(shape, idx)
    floor8, _ = floor_ms(shape, idx, bytes_per=1)
    gu8, d8 = quantize_per_channel(gate_up), quantize_per_channel(down)
    gs, us = (t.contiguous() for t in gu8.scale.chunk(2, dim=1))
    scales = (gs, us, d8.scale)
    out = {"shape": shape.name, "rows": shape.rows, "touched": touched}
    out |= {"floor_bf16_ms": round(floor, 4), "floor_fp8_ms": round(floor8, 4)}
    out["bf16_ms"] = graph_ms(
        lambda: ops.moe_mlp(x, w, idx, gate_up, down, shape.activation), iters
    )
    configs = [(64, 64, 4, None), (64, 128, 4, None), (64, 128, 8, None), (64, 128, 4, 3)]
    configs += [(64, 128, 4, 4), (128, 128, 8, 3), (32, 128, 4, 3), (64, 256, 8, 3)]
    for bn, bk, warps, stages in configs:
        fn = lambda c=(bn, bk, warps, stages): kernel.moe_mlp(  # noqa: E731
            x, w, idx, gu8.qweight, d8.qweight, shape.activation, scales=scales,
            bn=c[0], bk=c[1], warps=c[2], stages=c[3],
        )  # fmt: skip
        key = f"fp8_w8a16_ms_bn{bn}_bk{bk}_w{warps}_s{stages}"
        try:
            out[key] = graph_ms(fn, iters)
        except Exception as e:  # noqa: BLE001 (a config that does not compile)
            out[key] = str(e).splitlines()[0][:120]

    def bf():
        return kernel.moe_mlp(x, w, idx, gate_up, down, shape.activation, bk=64, warps=4, stages=3)  # noqa: E731

    out["bf16_ms_bk64_w4_s3"] = graph_ms(bf, iters)
    try:
        sg = lambda: scaled_grouped(x, w, idx, gu8, d8, shape.activation)  # noqa: E731
        out["scaled_grouped_eager_ms"] = cuda_time(sg, iters) * 1e3
        out["scaled_grouped_graph_ms"] = graph_ms(sg, iters)
    except Exception as e:  # noqa: BLE001
        out["scaled_grouped_error"] = str(e).splitlines()[0][:200]
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


if __name__ == "__main__":
    shapes_main("moe_fp8", __doc__, bench, SHAPES)
