"""quack-kernels (CuTe-DSL) as a candidate for the FP8 W8A8 routed experts: its SM90 FP8 grouped
varlen-M GEMM (rows gathered by index, one group per expert), timed at the LLaDA-2.1-mini 32-row
and DiffusionGemma-26B-A4B 256-row shapes (`moe_layer.py`) beside our W8A8 expert kernel in the
same run. quack's SM90 FP8 GEMM takes one scalar scale (alpha), so what is timed is the two GEMMs
alone (gate|up, then down) with per-tensor scales: a lower bound on what a full quack-based layer
(per-row x per-channel scales, activation, weighted sum) would cost. If that bound is not below our
whole layer, quack cannot win at these shapes.

quack is optional and not a dependency of dlmrt: on a machine without it every quack entry reads
"not installed". python -m benchmarks.kernels.moe_quack [--iters 50] [--out results/moe_quack.json]
"""

from __future__ import annotations

import torch

from benchmarks.common import cuda_time, graph_ms, shapes_main
from benchmarks.kernels.moe_layer import SHAPES, floor_ms, make_layer
from dlmrt import ops
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.ops.moe_fp8 import moe_mlp_w8a8


def _time(fn, iters: int) -> dict:
    """µs graph-replayed when quack's launch captures, else eager (launch gaps included)."""
    try:
        return {"us": round(1e3 * graph_ms(fn, iters), 1), "timed": "graph"}
    except Exception as e:  # noqa: BLE001 (not capturable: time it eagerly, say so)
        torch.cuda.synchronize()
        return {
            "us": round(1e6 * cuda_time(fn, iters), 1),
            "timed": "eager",
            "why_eager": str(e).splitlines()[0][:120],
        }


def _quack_gemms(x8, idx, gate_up8, down8, iters: int) -> dict:
    """The two grouped FP8 GEMMs on quack; rows gathered by A_idx, groups from cu_seqlens_m."""
    from quack.gemm_interface import gemm

    k, experts = idx.shape[1], gate_up8.shape[0]
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)
    cu = torch.zeros(experts + 1, dtype=torch.int32, device=x8.device)
    cu[1:] = torch.cumsum(torch.bincount(flat, minlength=experts), 0)
    src = (order // k).to(torch.int32)
    h8 = torch.empty(flat.numel(), down8.shape[2], dtype=torch.float8_e4m3fn, device=x8.device)
    h8.copy_(torch.randn_like(h8, dtype=torch.bfloat16).clamp(-4, 4))
    b_gu, b_d = gate_up8.transpose(1, 2), down8.transpose(1, 2)  # (E, K, N), K-major

    def gate_up() -> torch.Tensor:
        return gemm(
            x8, b_gu, cu_seqlens_m=cu, A_idx=src, alpha=1.0, tuned=False, out_dtype=torch.bfloat16
        )

    def down() -> torch.Tensor:
        return gemm(h8, b_d, cu_seqlens_m=cu, alpha=1.0, tuned=False, out_dtype=torch.bfloat16)

    out = {}
    for name, fn in (("gate_up", gate_up), ("down", down)):
        try:
            fn()  # compile once outside the timing
            out["quack_" + name] = _time(fn, iters)
        except Exception as e:  # noqa: BLE001 (record why a candidate cannot run here)
            out["quack_" + name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    parts = [out[n] for n in ("quack_gate_up", "quack_down")]
    if all(isinstance(p, dict) for p in parts):
        out["quack_two_gemms_us"] = round(sum(p["us"] for p in parts), 1)
    return out


def bench(shape, iters: int) -> dict:
    layer, route = make_layer(shape, torch.device("cuda"))
    _, _, x, gate_up, down = layer(None, parts=True)
    w, idx = route(ops)
    gu8, d8 = quantize_per_channel(gate_up), quantize_per_channel(down)
    gs, us = (t.contiguous() for t in gu8.scale.chunk(2, dim=1))
    act = shape.activation
    floor8 = floor_ms(shape, idx, bytes_per=1)[0]
    ours = graph_ms(
        lambda: moe_mlp_w8a8(x, w, idx, gu8.qweight, d8.qweight, act, (gs, us, d8.scale)), iters
    )
    out = {
        "shape": shape.name,
        "rows": shape.rows,
        "floor_fp8_us": round(1e3 * floor8, 1),
        "dlmrt_w8a8_layer_us": round(1e3 * ours, 1),
    }
    try:
        import quack  # noqa: F401
    except ImportError:
        return out | {"quack": "not installed"}
    x8 = x.clamp(-4, 4).to(torch.float8_e4m3fn)
    return out | _quack_gemms(x8, idx, gu8.qweight, d8.qweight, iters)


if __name__ == "__main__":
    shapes_main("moe_quack", __doc__, bench, SHAPES)
