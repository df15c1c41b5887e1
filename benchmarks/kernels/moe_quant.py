"""One MoE layer's routed experts in every weight format, graph-replayed, against the byte floor of
the experts the routing touches: bf16, FP8 weight-only (W8A16), FP8 W8A8 (tile sweep), NVFP4
weight-only (W4A16) and `torch._scaled_grouped_mm` (W8A8, row-wise scales), at the LLaDA-2.1-mini
32-row and DiffusionGemma-26B-A4B 256-row shapes (`moe_layer.py`). Each entry: µs per layer,
achieved TB/s (touched expert bytes / time) and % of the byte floor.

python -m benchmarks.kernels.moe_quant [--iters 50] [--out results/moe_quant.json]
"""

from __future__ import annotations

import torch

from benchmarks.common import cuda_time, graph_ms, shapes_main
from benchmarks.kernels.moe_fp8 import scaled_grouped
from benchmarks.kernels.moe_layer import SHAPES, floor_ms, make_layer
from dlmrt import ops
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.formats.nvfp4 import quantize_nvfp4
from dlmrt.ops.moe_fp8 import moe_mlp_w8a8
from dlmrt.ops.nvfp4 import moe_mlp_nvfp4, split_gate_up

NVFP4_BYTES = 0.5625  # 4 bits + one e4m3 scale per 16 weights


def _entry(ms: float, floor_ms_: float, weight_bytes: float) -> dict:
    return {
        "us": round(ms * 1e3, 1),
        "tb_s": round(weight_bytes / (ms * 1e-3) / 1e12, 2),
        "floor_pct": round(100 * floor_ms_ / ms, 1),
    }


def _w8a8_configs(many: bool) -> list[dict]:
    """(bm, bn = the hidden's group, bn_down, warps, stages, swap) to sweep."""
    base = dict(bm=32 if many else 16, bn=128, bn_down=64, warps=4, stages=None, swap=True)
    out = [base]
    # (H200, 2026-12-03: stages 4, warps 8, bn 256 / 64 and bn_down 32 all measured slower;
    # x quantized inside the gate|up kernel 301 vs 252 us: results/moe_quant_x_in_kernel_*.json)
    for change in ({"stages": 3}, {"bn_down": 128}, {"bm": 16}, {"bm": 32}):
        out.append(base | change)
    return out


def kernel_us(fn, iters: int) -> dict:
    """{kernel name: mean µs per call} of fn's CUDA kernels, and their sum, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times = {
        e.key[:60]: round(e.device_time_total / iters, 1)
        for e in prof.key_averages()
        if e.device_time_total > 0
    }
    return times | {"sum": round(sum(times.values()), 1)}


def bench(shape, iters: int) -> dict:
    from dlmrt._kernels import moe_mlp_fp8 as w8a8_kernel

    layer, route = make_layer(shape, torch.device("cuda"))
    _, _, x, gate_up, down = layer(None, parts=True)
    w, idx = route(ops)
    touched = int(torch.unique(idx).numel())
    params = touched * 3 * shape.hidden * shape.inter
    out = {"shape": shape.name, "rows": shape.rows, "touched_experts": touched}

    def run(name: str, fn, bytes_per: float) -> None:
        floor = floor_ms(shape, idx, bytes_per=bytes_per)[0]
        try:
            out[name] = _entry(graph_ms(fn, iters), floor, params * bytes_per)
        except Exception as e:  # noqa: BLE001 (a config that does not compile or run)
            out[name] = str(e).splitlines()[0][:160]

    act = shape.activation
    run("bf16", lambda: ops.moe_mlp(x, w, idx, gate_up, down, act), 2)
    gu8, d8 = quantize_per_channel(gate_up), quantize_per_channel(down)
    gs, us = (t.contiguous() for t in gu8.scale.chunk(2, dim=1))
    scales = (gs, us, d8.scale)
    gate8, up8 = gu8.qweight.chunk(2, dim=1)
    run("fp8_w8a16", lambda: ops.moe_mlp(x, w, idx, gu8.qweight, d8.qweight, act, scales=scales), 1)
    for cfg in _w8a8_configs(idx.numel() >= 8 * shape.experts):
        key = "fp8_w8a8_" + "_".join(f"{k}{v}" for k, v in cfg.items())
        run(
            key,
            lambda c=cfg: w8a8_kernel.moe_mlp_fp8(
                x, w, idx, (gate8, up8), d8.qweight, act, scales, **c
            ),
            1,
        )
    run("fp8_w8a8_op", lambda: moe_mlp_w8a8(x, w, idx, gu8.qweight, d8.qweight, act, scales), 1)
    nv_gu, nv_d = quantize_nvfp4(gate_up), quantize_nvfp4(down)
    nv_g, nv_u = split_gate_up(nv_gu)
    run("nvfp4_w4a16", lambda: moe_mlp_nvfp4(x, w, idx, nv_g, nv_u, nv_d, act), NVFP4_BYTES)
    sg = lambda: scaled_grouped(x, w, idx, gu8, d8, act)  # noqa: E731
    try:  # its host-side offsets do not capture: timed eagerly (launch gaps included)
        ms = cuda_time(sg, iters) * 1e3
        out["scaled_grouped_mm_w8a8_eager"] = _entry(ms, floor_ms(shape, idx, 1)[0], params)
    except Exception as e:  # noqa: BLE001
        out["scaled_grouped_mm_w8a8_eager"] = str(e).splitlines()[0][:160]
    # the W8A8 op's parts: each kernel's own time (eager, profiled: launch gaps excluded)
    out["w8a8_kernels_us"] = kernel_us(
        lambda: moe_mlp_w8a8(x, w, idx, gu8.qweight, d8.qweight, act, scales), iters
    )
    return out


if __name__ == "__main__":
    shapes_main("moe_quant", __doc__, bench, SHAPES)
