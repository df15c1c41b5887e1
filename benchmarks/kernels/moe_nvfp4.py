"""NVFP4 routed experts: the W4A16 expert kernel (kernels/moe_mlp_nvfp4.py: E2M1 codes and e4m3
block scales decoded in registers, bf16 multiplies) against bf16 and FP8 weight-only, one MoE layer
at the LLaDA-2.1-mini and DiffusionGemma-26B shapes (`moe_layer.py`), graph-replayed, with the
weight-read floors (bf16 2 bytes, FP8 1, NVFP4 0.5625 a weight) and the kernel's error vs its twin.

python -m benchmarks.kernels.moe_nvfp4 [--iters 50] [--out results/moe_nvfp4.json]
"""

from __future__ import annotations

import torch

from benchmarks.common import graph_ms, shapes_main
from benchmarks.kernels.moe_layer import SHAPES, floor_ms, make_layer
from dlmrt import ops
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.formats.nvfp4 import quantize_nvfp4
from dlmrt.ops.nvfp4 import moe_mlp_nvfp4, split_gate_up

CONFIGS = [
    (64, None, 4, None, None, None, True),
    (64, None, 4, None, None, False, True),
    (64, 128, 4, 2, 16, None, True),
    (64, 128, 4, 4, 16, None, True),
    (32, 128, 4, 3, 16, None, True),
    (64, 128, 4, 3, 16, None, False),
    (128, 128, 4, 3, 16, None, False),
    (64, 128, 4, 2, 32, None, True),
    (64, 128, 4, 4, 32, None, True),
    (32, 128, 4, 3, 32, None, True),
    (64, 128, 4, 3, 32, None, False),
    (128, 128, 4, 3, 32, None, False),
    (64, 128, 4, 3, 64, None, False),
]  # (bn, bk, warps, stages, bm, asm: None = the kernel's choice, swap); fmt: skip


def _timed(out: dict, key: str, fn, iters: int) -> None:
    try:
        out[key] = graph_ms(fn, iters)
    except Exception as e:  # noqa: BLE001 (a config that does not compile)
        out[key] = str(e).splitlines()[0][:120]


def bench(shape, iters: int) -> dict:
    from dlmrt._kernels import moe_mlp as fp8_kernel
    from dlmrt._kernels import moe_mlp_nvfp4 as kernel

    layer, route = make_layer(shape, torch.device("cuda"))
    _, _, x, gate_up, down = layer(None, parts=True)
    w, idx = route(ops)
    out = {"shape": shape.name, "rows": shape.rows}
    for name, per in (("bf16", 2), ("fp8", 1), ("nvfp4", 0.5625)):
        out[f"floor_{name}_ms"], out["touched"] = floor_ms(shape, idx, bytes_per=per)
    out["bf16_ms"] = graph_ms(
        lambda: ops.moe_mlp(x, w, idx, gate_up, down, shape.activation), iters
    )
    gu8, d8 = quantize_per_channel(gate_up), quantize_per_channel(down)
    scales = (*(t.contiguous() for t in gu8.scale.chunk(2, dim=1)), d8.scale)
    _timed(
        out,
        "fp8_w8a16_ms",
        lambda: fp8_kernel.moe_mlp(
            x, w, idx, gu8.qweight, d8.qweight, shape.activation, scales=scales
        ),
        iters,
    )
    gu4, d4 = quantize_nvfp4(gate_up), quantize_nvfp4(down)
    gate, up = split_gate_up(gu4)
    args = [
        (q.packed, q.block_scale, q.global_scale.reshape(-1).contiguous()) for q in (gate, up, d4)
    ]
    for bn, bk, warps, stages, bm, asm, swap in CONFIGS:  # None: the kernel's defaults
        fn = lambda c=(bn, bk, warps, stages, bm, asm, swap): kernel.moe_mlp_nvfp4(  # noqa: E731
            x, w, idx, *args, shape.activation, bn=c[0], bk=c[1], warps=c[2], stages=c[3],
            bm=c[4], asm=c[5], swap=c[6],
        )  # fmt: skip
        tag = ("_ops" if asm is False else "") + ("" if swap else "_noswap")  # plain-Triton decode
        key = f"nvfp4_w4a16_ms_bn{bn}_bk{bk}_w{warps}_s{stages}_bm{bm}{tag}"
        _timed(out, key, fn, iters)
    got = moe_mlp_nvfp4(x, w, idx, gate, up, d4, shape.activation)
    ops.use("torch")
    want = moe_mlp_nvfp4(x, w, idx, gate, up, d4, shape.activation)
    ops.use(None)
    out["nvfp4_vs_twin_max_rel"] = (
        (got.float() - want.float()).abs().max() / want.float().abs().max()
    ).item()
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


if __name__ == "__main__":
    shapes_main("moe_nvfp4", __doc__, bench, SHAPES)
