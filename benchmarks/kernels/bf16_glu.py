"""A gated MLP's first half in bf16 at each family's block rows: cuBLAS's gate|up GEMM + the
activation kernel (the unfused path, `ops.bf16_glu.twin`) vs the one kernel (kernels/fp8_glu_gemm.py's
unscaled form, every tile config of `ops/bf16_glu_choice.py`), graph-replayed, the calls cycling
over weight copies that exceed the L2 (read from HBM, as in a round).

    python -m benchmarks.kernels.bf16_glu [--rows 32 256 512] [--out results/bf16_glu.json]

Shapes (I x K, the weight gate|up [2I, K]): QwenDLM-4B's dense SwiGLU, LLaDA-2.1-mini's dense
layers (SwiGLU), DiffusionGemma-26B-A4B's dense GeGLU. Each row: µs of cuBLAS's GEMM alone, of
the activation alone, of the two, of the best fused config (and every config's), its largest
difference from the unfused path in bf16 ulps of y and the fraction of y bit-equal, and the
floors: 2 M 2I K / 790 TFLOP/s and the bytes (weight + x + y) at the device's copy bandwidth.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.common import PEAK_BYTES, PEAK_FLOPS, write_result
from dlmrt import ops
from dlmrt.model_shapes import diffusion_gemma_26b, llada21_mini, qwen_dlm_4b
from dlmrt.ops import gemma
from dlmrt.ops.bf16_glu import glu_bf16, twin
from dlmrt.ops.bf16_glu_choice import glu_configs
from dlmrt.ops.fp8 import GluPlan
from dlmrt.ops.fp8_choice import COPIES, L2_BYTES, cold_time_us
from dlmrt.ops.timing import graph_time_us


def glu_shapes() -> dict[str, tuple[int, int, int, bool]]:
    """name -> (block rows, I, K, GeGLU?) of each family's dense gated MLP."""
    q, ll, dg = qwen_dlm_4b(), llada21_mini(), diffusion_gemma_26b()
    return {
        "qwen_dlm.gate_up": (q.block_size, q.intermediate_size, q.hidden_size, False),
        "llada2.gate_up": (ll.block_size, ll.intermediate_size, ll.hidden_size, False),
        "diffusion_gemma.gate_up": (dg.canvas_length, dg.intermediate_size, dg.hidden_size, True),
    }


SHAPES = glu_shapes()


def _agreement(y: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(largest |y - want| in ulps of want's bf16 value, the fraction of y bit-equal to want)."""
    ulp = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp_min(1e-30)
    ulps = ((y.float() - want.float()).abs() / ulp).max().item()
    return ulps, (y == want).float().mean().item()


def one(rows: int, i: int, k: int, gelu: bool) -> dict:
    dev = torch.device("cuda")
    copies = max(2, min(COPIES, -(-L2_BYTES // (4 * i * k))))
    ws = [torch.randn(2 * i, k, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    gate_up = F.linear(x, ws[0])
    act = (lambda: gemma.gelu_mul(gate_up)) if gelu else (lambda: ops.silu_mul(gate_up))
    out = {"rows": rows, "i": i, "k": k, "gelu": gelu}
    out["cublas_gemm_us"] = cold_time_us(lambda w: F.linear(x, w), ws)
    out["act_us"] = graph_time_us(act)
    out["unfused_us"] = cold_time_us(lambda w: twin(x, w, gelu), ws)
    fused: dict[str, float | str] = {}
    for config in glu_configs(rows):
        try:
            fused[str(config)] = cold_time_us(
                lambda w, c=config: glu_bf16(x, w, gelu, GluPlan(rows, c)), ws
            )
        except Exception as e:  # noqa: BLE001 (recorded: a tile too big for this GPU)
            fused[str(config)] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    ran = {c: t for c, t in fused.items() if isinstance(t, float)}
    best = min(ran, key=ran.__getitem__)
    config = tuple(int(v) for v in best.strip("()").split(","))
    ulps, same = _agreement(glu_bf16(x, ws[0], gelu, GluPlan(rows, config)), twin(x, ws[0], gelu))
    weight, io = 2 * i * k * 2, (rows * k + rows * i) * 2
    out |= {"fused_us": ran[best], "fused_config": best, "fused_all_us": fused}
    out |= {"max_ulps_vs_unfused": ulps, "bit_equal_fraction": same}
    out |= {"flop_floor_us": 2 * rows * 2 * i * k / PEAK_FLOPS * 1e6}
    out |= {"byte_floor_us": (weight + io) / PEAK_BYTES * 1e6}
    return {key: round(v, 3) if isinstance(v, float) else v for key, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, nargs="+", default=None, help="default: each family's")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="a subset of the shapes")
    ap.add_argument("--out", default="benchmarks/results/bf16_glu.json")
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args()
    results = []
    with torch.inference_mode():
        for name in args.shapes:
            block, i, k, gelu = SHAPES[name]
            for rows in args.rows or [block]:
                r = {"shape": name} | one(rows, i, k, gelu)
                results.append(r)
                print(
                    f"{name:24s} {rows:4d} cublas {r['cublas_gemm_us']:6.1f} + act {r['act_us']:5.1f}"
                    f" = {r['unfused_us']:6.1f}  fused {r['fused_us']:6.1f} {r['fused_config']}"
                    f"  floors {r['flop_floor_us']:5.1f} / {r['byte_floor_us']:5.1f} us"
                    f"  {r['bit_equal_fraction']:.4f} bit-equal, max {r['max_ulps_vs_unfused']:.1f} ulp",
                    flush=True,
                )
    write_result(args.out, {"benchmark": "bf16_glu", "results": results}, args.git_revision)


if __name__ == "__main__":
    main()
