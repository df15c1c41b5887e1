"""Whether FP8 routed experts run W8A8 (activations quantized, FP8 MMA) or weight-only W8A16:
measured once per expert shape at start-up.

The W8A8 kernel (kernels/moe_mlp_fp8.py) reads the same weight bytes as the W8A16 one
(kernels/moe_mlp.py with `scales`) but feeds the codes straight to an FP8 dot instead of
converting each weight tile to bf16 in registers; it pays one extra launch (x's quantizer).
Which wins depends on the rows and the routing, so on CUDA both are timed on the layer's own
weights with uniformly random routing of the model's block rows (`timing.graph_time_us`: a
replayed CUDA graph, GPU time only) and the faster kept, logged by the installer.
DLMRT_FP8_EXPERTS=w8a8 / w8a16 forces one. CPU (where a model is installed there, tests only:
the CPU dequantizes FP8 at load): W8A8, the twin of what CUDA normally runs.

NVFP4 experts on Hopper (no FP4 tensor cores) either run the W4A16 kernel (kernels/
moe_mlp_nvfp4.py: 4.5 bits a weight read, decoded to bf16 in registers) or are converted at load
to per-channel FP8 codes and run W8A8 (`use_fp8_for_nvfp4`, timed the same way). On the H200 the
W8A8 kernel is faster at both MoE shapes (benchmarks/results/moe_quant_h200_2026-12-03.json),
so NVFP4 checkpoints run as FP8 there: twice the expert memory of NVFP4, and the FP8 rounding of
the NVFP4 values on top of theirs. DLMRT_NVFP4_EXPERTS=w4a16 / fp8 forces one. Each choice is
recorded in the choices registry (`ops/choices.py`: logged once).
"""

from __future__ import annotations

import torch

from dlmrt import envs, ops
from dlmrt.ops import choices
from dlmrt.ops.moe_fp8 import moe_mlp_w8a8
from dlmrt.ops.nvfp4 import moe_mlp_nvfp4
from dlmrt.ops.timing import graph_time_us

_MEASURED: dict[tuple, tuple[float, float]] = {}
HALF = (torch.bfloat16, torch.float16)  # model dtypes the W8A8 expert kernel serves


def measure(
    rows: int, top_k: int, gate_up: tuple, down: torch.Tensor, scales: tuple, activation: str
) -> tuple[float, float]:
    """(W8A16 µs, W8A8 µs) of one expert layer call at `rows` rows (cached per shape)."""
    experts, hidden, inter = down.shape
    key = (rows, top_k, experts, hidden, inter, activation)
    if key not in _MEASURED:
        x, weights, index = _random_routing(rows, top_k, hidden, experts, down.device)
        args = (x, weights, index, gate_up, down, activation)
        w8a16 = graph_time_us(lambda: ops.moe_mlp(*args, scales=scales))
        w8a8 = graph_time_us(lambda: moe_mlp_w8a8(*args, scales))
        _MEASURED[key] = (w8a16, w8a8)
    return _MEASURED[key]


def use_w8a8(
    rows: int,
    top_k: int,
    gate_up: tuple,
    down: torch.Tensor,
    scales: tuple,
    activation: str,
    dtype: torch.dtype | None = None,
) -> tuple[bool, str]:
    """(run these FP8 experts W8A8?, why) for `rows` rows routed to `top_k` experts each of a
    `dtype` model (the W8A8 kernel rounds like a bf16 / fp16 model: others keep the codes' exact
    sums, W8A16); recorded in the choices registry."""
    policy, options = envs.fp8_experts(), {}
    if dtype is not None and dtype not in HALF:
        ok, why = False, f"a {dtype} model"
    elif policy != "measured" or down.device.type != "cuda":
        ok, why = policy != "w8a16", f"DLMRT_FP8_EXPERTS={policy}" if down.is_cuda else "CPU"
    else:
        w8a16, w8a8 = measure(rows, top_k, gate_up, down, scales, activation)
        ok, why = w8a8 < w8a16, f"{rows} rows: W8A16 {w8a16:.1f} us, W8A8 {w8a8:.1f} us"
        options = {"W8A16": w8a16, "W8A8": w8a8}
    what = f"fp8 experts {_shape(rows, top_k, down, activation)}"
    choices.record(what, "W8A8" if ok else "weight-only W8A16", why, options)
    return ok, why


def _shape(rows: int, top_k: int, down, activation: str) -> str:
    experts, hidden, inter = down.shape
    return f"{rows} rows, top-{top_k} of {experts} x {hidden}->{inter}->{hidden} {activation}"


def _random_routing(rows: int, top_k: int, hidden: int, experts: int, device: torch.device):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, hidden, device=device, generator=g, dtype=torch.bfloat16)
    weights, index = torch.rand(rows, experts, device=device, generator=g).topk(top_k, dim=-1)
    return x, weights, index


def keep_nvfp4(rows: int, top_k: int, down, activation: str, why: str) -> None:
    """Record that NVFP4 experts stay W4A16 unmeasured (`why`: a pin, a dtype, the emulation)."""
    _record(rows, top_k, down, activation, False, why, {})


def use_fp8_for_nvfp4(
    rows: int, top_k: int, nvfp4: tuple, fp8: tuple, activation: str
) -> tuple[bool, str]:
    """(run these NVFP4 experts as their FP8 conversion, W8A8?, why). `nvfp4`: (gate, up, down)
    `Nvfp4Weight`s; `fp8`: ((gate, up) codes, down codes, scales) of the conversion."""
    policy = envs.nvfp4_experts()
    down = fp8[1]
    if policy != "measured" or not down.is_cuda:
        ok, why = policy == "fp8", f"DLMRT_NVFP4_EXPERTS={policy}" if down.is_cuda else "CPU"
        _record(rows, top_k, down, activation, ok, why, {})
        return ok, why
    experts, hidden, inter = down.shape
    key = ("nvfp4", rows, top_k, experts, hidden, inter, activation)
    if key not in _MEASURED:
        x, weights, index = _random_routing(rows, top_k, hidden, experts, down.device)
        w4 = graph_time_us(lambda: moe_mlp_nvfp4(x, weights, index, *nvfp4, activation))
        w8 = graph_time_us(
            lambda: moe_mlp_w8a8(x, weights, index, fp8[0], down, activation, fp8[2])
        )
        _MEASURED[key] = (w4, w8)
    w4, w8 = _MEASURED[key]
    ok, why = w8 < w4, f"{rows} rows: NVFP4 W4A16 {w4:.1f} us, as FP8 W8A8 {w8:.1f} us"
    _record(rows, top_k, down, activation, ok, why, {"NVFP4 W4A16": w4, "as FP8 W8A8": w8})
    return ok, why


def _record(rows, top_k, down, activation, ok: bool, why: str, options: dict) -> None:
    what = f"nvfp4 experts {_shape(rows, top_k, down, activation)}"
    choices.record(what, "converted to FP8 W8A8" if ok else "NVFP4 weight-only W4A16", why, options)
