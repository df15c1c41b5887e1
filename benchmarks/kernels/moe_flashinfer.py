"""FlashInfer's CUTLASS fused MoE (`flashinfer.fused_moe.cutlass_fused_moe`, the TensorRT-LLM MoE
runner, its SM90 TMA warp-specialized grouped GEMMs) in FP8 W8A8 beside our W8A8 expert kernel, at
the LLaDA-2.1-mini 32-row and DiffusionGemma-26B-A4B 256-row shapes (`moe_layer.py`: random weights,
the models' own routing on random logits, precomputed and not timed, as in `moe_quant.py`).

FlashInfer's FP8 path is per-tensor: x is e4m3 quantized before the call with one static scale
(calibrated once on this x), each expert's gate|up and down weights carry one scale each, and the
hidden act(gate) * up is requantized with one static scale (calibrated on the reference). fc1 is
[E, 2I, H] with the halves in [up, gate] order (TensorRT-LLM's w3|w1): ours are [gate, up], so they
are swapped. Activation: SwiGLU (LLaDA) and GegluTanh (DiffusionGemma's gelu_tanh GeGLU). Entries:
`flashinfer_fp8` (the op on pre-quantized x), `flashinfer_fp8_with_x_quant` (x's quantization +
the op: what a layer would run; our kernel quantizes x inside), `dlmrt_w8a8` (`moe_mlp_w8a8`, the
op `moe_quant.py` times as fp8_w8a8_op). Each: µs, TB/s over the touched experts' FP8 weight bytes
and % of their byte floor (`moe_quant.py`'s definition); graph-replayed when the call captures,
else eager (launch gaps included) with "timed": "eager" and the reason. Accuracy: relative L2 error
of FlashInfer's output against plain torch on its own dequantized weights and x (the hidden not
requantized), and of both FP8 layers against the bf16 layer.

FlashInfer JIT-compiles the runner (nvcc) on first use. Its stock `fused_moe_90` module holds
every SM90 kernel the runner can dispatch to, over an hour of nvcc on 16 cores; `--jit trimmed`
(default) builds `flashinfer_fp8_jit.py`'s copy instead: the same sources, only the e4m3 x e4m3 ->
bf16 grouped GEMMs (all 72 tile / cluster / swap-AB / fusion variants) and their MoeGemmRunner
compiled, every other launcher a stub that throws. The build (`flashinfer_build.py`) runs without
ninja, so that `--build-deadline` can cut it short (exit 3) and a later run resumes from the
objects left in the JIT cache (FLASHINFER_WORKSPACE_BASE); MAX_JOBS jobs. The .so then goes to
FlashInfer's AOT folder (flashinfer/data/aot/NAME/NAME.so), where later runs load it without nvcc
(`--prebuilt SO` puts one there). FlashInfer is optional and not a dependency of dlmrt: without it
the script exits with a message. `.devrun/flashinfer.sh` installs it on the device and runs this.

python -m benchmarks.kernels.moe_flashinfer [--iters 50] [--out results/moe_flashinfer_h200_DATE.json]
    [--no-autotune] [--build-only] [--jit trimmed|stock] [--prebuilt SO] [--build-log PATH]
    [--build-deadline SECONDS]
"""

from __future__ import annotations

import datetime
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import command_line, cuda_time, graph_ms, iters_parser, write_result
from benchmarks.kernels.flashinfer_build import build, log
from benchmarks.kernels.moe_layer import SHAPES, floor_ms, make_layer

T_START = time.monotonic()
FP8_MAX = 448.0
# dlmrt activation name -> FlashInfer ActivationType member
ACTIVATIONS = {"silu": "Swiglu", "gelu_tanh": "GegluTanh"}


def _entry(ms: float, floor_ms_: float, weight_bytes: float) -> dict:
    """moe_quant.py's entry: µs, TB/s over the touched experts' bytes, % of their byte floor."""
    return {"us": round(ms * 1e3, 1), "tb_s": round(weight_bytes / (ms * 1e-3) / 1e12, 2),
            "floor_pct": round(100 * floor_ms_ / ms, 1)}  # fmt: skip


def _time(fn, iters: int) -> tuple[float, dict]:
    """(ms, how): graph-replayed when fn captures, else eager (launch gaps included)."""
    try:
        return graph_ms(fn, iters), {"timed": "graph"}
    except Exception as e:  # noqa: BLE001 (not capturable: time it eagerly, say so)
        torch.cuda.synchronize()
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
        log(f"  graph capture failed ({why}); timing eagerly")
        return cuda_time(fn, iters) * 1e3, {"timed": "eager", "why_eager": why}


def _act(h: torch.Tensor, activation: str) -> torch.Tensor:
    return F.silu(h) if activation == "silu" else F.gelu(h, approximate="tanh")


def torch_moe(x, weights, index, gate, up, down, activation: str, hidden_amax: list | None = None):
    """Plain torch in fp32, one expert at a time: y = sum_k w_k * down_e (act(gate_e x) * up_e x).
    gate / up [E, I, H], down [E, H, I] (any float dtype, or callables e -> fp32 tensors)."""
    x = x.float()
    y = torch.zeros_like(x)
    get = lambda w, e: w(e) if callable(w) else w[e].float()  # noqa: E731
    for e in torch.unique(index).tolist():
        rows, slot = (index == e).nonzero(as_tuple=True)
        xe = x[rows]
        h = _act(xe @ get(gate, e).T, activation) * (xe @ get(up, e).T)
        if hidden_amax is not None:
            hidden_amax.append(h.abs().amax())
        y.index_add_(0, rows, (h @ get(down, e).T) * weights[rows, slot, None].float())
    return y


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def quantize_per_expert(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, N, K] -> (e4m3 codes, fp32 dequant scale [E]): one scale per expert (amax / 448)."""
    scale = (w.abs().amax(dim=(1, 2)).float() / FP8_MAX).clamp_min(1e-12)
    codes = torch.empty_like(w, dtype=torch.float8_e4m3fn)
    for e in range(w.shape[0]):  # per expert: no fp32 copy of the whole stack
        codes[e] = (w[e].float() / scale[e]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def _flashinfer_op(shape, dev, x, w, idx, gate, up, down, out):
    """FlashInfer's inputs, and plain torch on them: (fi, fi_with_x_quant, fc1, y, ref_dq)."""
    from flashinfer.fused_moe import (
        ActivationType,
        cutlass_fused_moe,
        cutlass_fused_moe_workspace_size,
    )

    act = shape.activation
    # FlashInfer: fc1 = [up; gate] per expert, per-expert weight scales, static x / hidden scales
    fc1, fc1_s = quantize_per_expert(torch.cat([up, gate], dim=1))
    fc2, fc2_s = quantize_per_expert(down)
    x_scale = (x.float().abs().amax() / FP8_MAX).clamp_min(1e-12)  # static, calibrated on this x
    x_inv = 1.0 / x_scale
    x8 = (x.float() * x_inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    xq = x8.float() * x_scale
    dq = lambda codes, s, lo, hi: lambda e: codes[e, lo:hi].float() * s[e]  # noqa: E731
    i_ = shape.inter
    g_dq, u_dq = dq(fc1, fc1_s, i_, 2 * i_), dq(fc1, fc1_s, 0, i_)
    d_dq = dq(fc2, fc2_s, 0, shape.hidden)
    amaxes: list[torch.Tensor] = []
    ref_dq = torch_moe(xq, w, idx, g_dq, u_dq, d_dq, act, hidden_amax=amaxes)
    h_scale = (torch.stack(amaxes).max() / FP8_MAX).clamp_min(1e-12)  # static hidden scale
    quant_scales = [
        (fc1_s * x_scale).float().contiguous(),  # fc1 dequant [E]: weight scale x x's scale
        (1.0 / h_scale).float().reshape(()),  # fc2 activation quant (a multiplier), scalar
        (fc2_s * h_scale).float().contiguous(),  # fc2 dequant [E]
        x_scale.float().reshape(()),  # fc1 input dequant, scalar
    ]
    sel, fin = idx.to(torch.int32).contiguous(), w.float().contiguous()
    y = torch.empty(shape.rows, shape.hidden, dtype=torch.bfloat16, device=dev)
    act_type = getattr(ActivationType, ACTIVATIONS[act])
    out["flashinfer_activation"] = act_type.name
    try:
        ws_bytes = cutlass_fused_moe_workspace_size(
            shape.rows, shape.hidden, shape.inter, shape.experts, shape.top_k,
            x_dtype=torch.float8_e4m3fn, weight_dtype=torch.float8_e4m3fn,
            output_dtype=torch.bfloat16, activation_type=act_type, device=dev,
        )  # fmt: skip
        workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)
        out["flashinfer_workspace_mib"] = round(ws_bytes / 2**20, 2)
    except Exception as e:  # noqa: BLE001 (older API: let the op allocate per call)
        workspace = None
        out["flashinfer_workspace"] = f"per call ({type(e).__name__}: {str(e)[:120]})"

    def fi(a=fc1, inp=x8) -> None:
        cutlass_fused_moe(inp, sel, fin, a, fc2, torch.bfloat16, quant_scales, output=y,
                          activation_type=act_type, workspace_buffer=workspace)  # fmt: skip

    def fi_with_x_quant() -> None:  # static per-tensor quantization in plain torch ops
        fi(inp=(x.float() * x_inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn))

    return fi, fi_with_x_quant, fc1, y, ref_dq


def _check_fi(shape, autotune, fi, fc1, y, ref_dq, ours, x, w, idx, gate, up, down, out):
    """FlashInfer tuned (if asked), run and checked: its first output, or why it failed (a str)."""
    from flashinfer.autotuner import autotune as fi_autotune

    act, i_ = shape.activation, shape.inter
    out["flashinfer_autotuned"] = False
    if autotune:  # profile the runner's tactics at this row count, as a server would at load
        log("  FlashInfer autotune: start")
        t0 = time.perf_counter()
        try:
            with fi_autotune(True, tuning_buckets=(shape.rows,)):
                fi()
            torch.cuda.synchronize()
            out["flashinfer_autotuned"] = True
            log(f"  FlashInfer autotune: done in {time.perf_counter() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001 (then the runner's default tactic)
            out["flashinfer_autotune_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"  FlashInfer autotune failed: {out['flashinfer_autotune_error']}")
            torch.cuda.synchronize()
    try:
        fi()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (record why it cannot run here, keep ours)
        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        log(f"  FlashInfer failed: {msg}")
        return msg
    out["rel_err_flashinfer_vs_dequant_ref"] = rel_err(y, ref_dq)
    log(f"  FlashInfer vs plain torch on its dequantized weights: rel L2 error "
        f"{out['rel_err_flashinfer_vs_dequant_ref']:.4f}")  # fmt: skip
    if out["rel_err_flashinfer_vs_dequant_ref"] > 0.3:  # a layout slip shows as ~1: try the other
        fi(a=torch.cat([fc1[:, i_:], fc1[:, :i_]], dim=1).contiguous())
        out["rel_err_flashinfer_gate_up_swapped"] = rel_err(y, ref_dq)
        log(f"  (with [gate, up] instead: {out['rel_err_flashinfer_gate_up_swapped']:.4f})")
        fi()
    y_fi = y.clone()
    ref_bf16 = torch_moe(x, w, idx, gate, up, down, act)
    out["rel_err_flashinfer_vs_bf16_ref"] = rel_err(y_fi, ref_bf16)
    out["rel_err_dlmrt_w8a8_vs_bf16_ref"] = rel_err(ours(), ref_bf16)
    log(f"  vs the bf16 layer: FlashInfer {out['rel_err_flashinfer_vs_bf16_ref']:.4f}, "
        f"dlmrt W8A8 {out['rel_err_dlmrt_w8a8_vs_bf16_ref']:.4f}")  # fmt: skip
    return y_fi


def bench(shape, iters: int, autotune: bool) -> dict:
    from dlmrt import ops
    from dlmrt.formats.fp8 import quantize_per_channel
    from dlmrt.ops.moe_fp8 import moe_mlp_w8a8

    dev = torch.device("cuda")
    log(f"{shape.name}: rows {shape.rows}, hidden {shape.hidden}, inter {shape.inter}, "
        f"{shape.experts} experts, top-{shape.top_k}, {shape.activation}")  # fmt: skip
    layer, route = make_layer(shape, dev)
    _, _, x, gate_up, down = layer(None, parts=True)
    w, idx = route(ops)
    touched = int(torch.unique(idx).numel())
    params = touched * 3 * shape.hidden * shape.inter  # FP8: one byte a weight
    floor8 = floor_ms(shape, idx, bytes_per=1)[0]
    act = shape.activation
    out = {"shape": shape.name, "rows": shape.rows, "touched_experts": touched,
           "floor_fp8_us": round(1e3 * floor8, 1)}  # fmt: skip
    gate, up = gate_up.chunk(2, dim=1)

    # ours: per-channel weight scales, x and the hidden quantized inside the kernels
    gu8, d8 = quantize_per_channel(gate_up), quantize_per_channel(down)
    gs, us = (t.contiguous() for t in gu8.scale.chunk(2, dim=1))
    ours = lambda: moe_mlp_w8a8(x, w, idx, gu8.qweight, d8.qweight, act, (gs, us, d8.scale))  # noqa: E731
    ms, how = _time(ours, iters)
    out["dlmrt_w8a8"] = _entry(ms, floor8, params) | how
    log(f"  dlmrt W8A8: {out['dlmrt_w8a8']}")

    fi, fi_with_x_quant, fc1, y, ref_dq = _flashinfer_op(shape, dev, x, w, idx, gate, up, down, out)
    y_fi = _check_fi(shape, autotune, fi, fc1, y, ref_dq, ours, x, w, idx, gate, up, down, out)
    if isinstance(y_fi, str):
        return out | {"flashinfer_fp8": y_fi}
    for name, fn in (("flashinfer_fp8", fi), ("flashinfer_fp8_with_x_quant", fi_with_x_quant)):
        try:
            ms, how = _time(fn, iters)
            out[name] = _entry(ms, floor8, params) | how
            torch.cuda.synchronize()  # the replays wrote y (fused finalize: atomics, any order)
            out[f"rel_err_{name}_timed_vs_first"] = rel_err(y, y_fi.float())
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        log(f"  {name}: {out[name]}")
    return out


def main() -> None:
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    ap = iters_parser(__doc__, 50, f"results/moe_flashinfer_h200_{date}.json")
    ap.add_argument("--no-autotune", action="store_true",
                    help="skip FlashInfer's tactic profiling (its heuristic default tactic)")  # fmt: skip
    ap.add_argument("--build-only", action="store_true",
                    help="only JIT-build FlashInfer's fused_moe_90 module into its cache")  # fmt: skip
    ap.add_argument("--jit", choices=("trimmed", "stock"), default="trimmed",
                    help="which fused_moe_90 module to build (default: %(default)s)")  # fmt: skip
    ap.add_argument("--prebuilt", default=None,
                    help="a trimmed fused_moe_90 .so built earlier: load it, no nvcc")  # fmt: skip
    ap.add_argument("--build-log", default="flashinfer_build.log",
                    help="nvcc's output, each step's (default: %(default)s)")  # fmt: skip
    ap.add_argument("--build-deadline", type=float, default=None,
                    help="seconds from the start: stop compiling then (exit 3; the objects "
                    "done stay in the JIT cache and a later run resumes from them)")  # fmt: skip
    args = ap.parse_args()
    try:
        import flashinfer
    except ImportError as e:
        sys.exit(f"moe_flashinfer: flashinfer is not installed ({e}); it is optional and not a "
                 "dependency of dlmrt. On the device: bash .devrun/flashinfer.sh")  # fmt: skip
    if not torch.cuda.is_available():
        sys.exit("moe_flashinfer: needs a CUDA GPU (SM90)")
    cap = torch.cuda.get_device_capability()
    log(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name()} (sm{cap[0]}{cap[1]})")  # fmt: skip
    if cap != (9, 0):
        sys.exit(f"moe_flashinfer: times the SM90 build only, this GPU is sm{cap[0]}{cap[1]}")
    jit = build(args, T_START)
    if args.build_only:
        return
    rows = []
    payload = {"benchmark": "moe_flashinfer", "command": command_line(),
               "flashinfer": flashinfer.__version__, "flashinfer_api": "cutlass_fused_moe (FP8)",
               "fused_moe_90": jit, "results": rows}  # fmt: skip
    with torch.inference_mode():
        for shape in SHAPES:
            rows.append(bench(shape, args.iters, autotune=not args.no_autotune))
            print(rows[-1], flush=True)
            write_result(args.out, payload, args.git_revision)  # each shape: a cut run keeps it


if __name__ == "__main__":
    main()
