"""The dense FP8 GEMMs at block rows: bf16 cuBLAS vs FP8 cuBLAS (`torch._scaled_mm`, row-wise
scales) vs our split-K kernel (kernels/fp8_gemm.py, every candidate config of
`dlmrt/ops/fp8_choice.py`), graph-replayed, at 32 and 256 rows (and 512).

    python -m benchmarks.kernels.fp8_gemm [--rows 32 256] [--out results/fp8_gemm_h200_DATE.json]

Shapes (N x K): QwenDLM-4B q|k|v, o, gate|up, down, LM head; DiffusionGemma-26B-A4B sliding
q|k|v, full q|k, o (sliding / full), dense gate|up and down, LM head. Each row gives µs per
call (the calls cycling over copies of the weight that exceed the L2 cache: read from HBM, as
in a round), the FP8 FLOP floor (2 M N K / 1,580 TFLOP/s) and byte floor (the FP8 weight at the device's copy bandwidth),
the winning kernel config and its error vs the fp32 twin, and, where quack-kernels is installed,
its FP8 GEMM (one scalar scale: a lower bound, see `quack`). Activations already quantized
(a fused producer); the row quantizer's own time is timed once per shape beside it.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.common import PEAK_BYTES, write_result
from dlmrt.model_shapes import diffusion_gemma_26b, layer_widths, qwen_dlm_4b
from dlmrt.models.diffusion_gemma_config import FULL, SLIDING
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.fp8_choice import cold_time_us, cold_weights, kernel_times
from dlmrt.ops.timing import graph_time_us


def gemm_shapes() -> dict[str, tuple[int, int]]:
    """(N, K) of each dense GEMM of a QwenDLM-4B round and a DiffusionGemma-26B-A4B step (its
    full layers project K and V as one: K = V)."""
    q, dg = qwen_dlm_4b(), diffusion_gemma_26b()
    h, inter = q.hidden_size, q.intermediate_size
    shapes = {
        "qwen_dlm.qkv": (q.q_size + 2 * q.kv_size, h), "qwen_dlm.o": (h, q.q_size),
        "qwen_dlm.gate_up": (2 * inter, h), "qwen_dlm.down": (h, inter),
        "qwen_dlm.lm_head": (q.vocab_size, h),
    }  # fmt: skip
    h, inter, heads = dg.hidden_size, dg.intermediate_size, dg.num_attention_heads
    (sd, skv), (fd, fkv) = layer_widths(dg, SLIDING), layer_widths(dg, FULL)
    return shapes | {
        "diffusion_gemma.qkv_sliding": ((heads + 2 * skv) * sd, h),
        "diffusion_gemma.qk_full": ((heads + fkv) * fd, h),
        "diffusion_gemma.o_sliding": (h, heads * sd), "diffusion_gemma.o_full": (h, heads * fd),
        "diffusion_gemma.gate_up": (2 * inter, h), "diffusion_gemma.down": (h, inter),
        "diffusion_gemma.lm_head": (dg.vocab_size, h),
    }  # fmt: skip


SHAPES = gemm_shapes()


def one(rows: int, n: int, k: int) -> dict:
    dev = torch.device("cuda")
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
    ws, wqs = cold_weights(n, k, dev)  # weights from HBM, as in a round
    xq, wq = fp8_ops.quant_rows(x), wqs[0]
    twin = xq.dequantize(torch.float32) @ wq.dequantize(torch.float32).t()
    out = {"rows": rows, "n": n, "k": k, "bf16_us": cold_time_us(lambda w: F.linear(x, w), ws)}
    out["quant_rows_us"] = graph_time_us(lambda: fp8_ops.quant_rows(x))
    out["cublas_fp8_us"] = cold_time_us(lambda w: fp8_ops.fp8_linear(xq, w), wqs)
    kernel = kernel_times(rows, n, k, xq, wqs, dev)
    best = min((c for c, t in kernel.items() if isinstance(t, float)), key=kernel.__getitem__)
    plan = fp8_ops.GemmPlan.new(rows, n, best, dev)
    err = (fp8_ops.fp8_linear(xq, wq, plan=plan).float() - twin).norm() / twin.norm()
    out |= {"kernel_us": kernel[best], "kernel_config": str(best), "kernel_rel_error": float(err)}
    kernel = {str(c): t for c, t in kernel.items()}
    out |= {
        "kernel_all_us": kernel,
        "floor_us": max(2 * rows * n * k / 1580e12, n * k / PEAK_BYTES) * 1e6,
    }
    out |= quack(xq.q, wqs)
    out = {key: round(v, 2) if isinstance(v, float) else v for key, v in out.items()}
    return out


def quack(a: torch.Tensor, wqs: list) -> dict:
    """quack-kernels' SM90 FP8 GEMM on the same codes, default config and split-K 2 / 4 (serial,
    deterministic): it takes one scalar scale (alpha), so this is a lower bound for a per-row x
    per-channel scaled linear on it. "not installed" without quack (an optional library)."""
    try:
        from quack.gemm_interface import gemm
    except ImportError:
        return {"quack": "not installed"}
    out = {}
    for split in (1, 2, 4):

        def call(w, split=split):
            return gemm(
                a, w.qweight.t(), alpha=1.0, out_dtype=torch.bfloat16, tuned=False, split_k=split
            )

        try:
            call(wqs[0])  # compile outside the timing
            out[f"quack_split{split}_us"] = cold_time_us(call, wqs)
        except Exception as e:  # noqa: BLE001 (record why it cannot run here)
            out[f"quack_split{split}_us"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="a subset of the shapes")
    ap.add_argument("--out", default="benchmarks/results/fp8_gemm.json")
    ap.add_argument("--git-revision", default=None)
    args = ap.parse_args()
    results = []
    for rows in args.rows:
        for name in args.shapes:
            n, k = SHAPES[name]
            r = {"shape": name} | one(rows, n, k)
            results.append(r)
            q = {key: v for key, v in r.items() if key.startswith("quack")}
            print(
                f"{name:30s} {rows:4d} bf16 {r['bf16_us']:7.1f} cublas-fp8 {r['cublas_fp8_us']:7.1f}"
                f" kernel {r['kernel_us']:7.1f} {r['kernel_config']} floor {r['floor_us']:6.1f} {q}",
                flush=True,
            )
    write_result(args.out, {"benchmark": "fp8_gemm", "results": results}, args.git_revision)


if __name__ == "__main__":
    main()
