"""Whether an FP8 gated MLP runs gate|up and its activation as one kernel: measured at start-up.

The two forms of the MLP's first half and the down projection that reads it:
- separate: the gate|up FP8 GEMM (cuBLAS or kernels/fp8_gemm.py, as `ops/fp8_choice.py` picked
  it) storing [rows, 2I], the activation-quantizer (`silu_mul_fp8`; GeGLU: gelu_mul, then the
  down projection's row quantizer), the down GEMM on codes;
- fused: kernels/fp8_glu_gemm.py storing y [rows, I] and its rows' amax, the down GEMM on
  kernels/fp8_gemm.py quantizing y as it loads it (its `amax` form; cuBLAS cannot).
Each is timed as the rounds run it (`fp8_choice.cold_time_us`: graph replay, weights cycling
past the L2), over a few tile configs of each kernel; the faster form is kept. The separate
form's GEMM times come from `fp8_choice.measure`'s cache (the install timed them already).
DLMRT_FP8_GLU=on|off pins the form (tests, benchmarks' before / after). Each shape's choice is
recorded in the choices registry (`ops/choices.py`: logged once).
"""

from __future__ import annotations

import torch

from dlmrt import envs
from dlmrt.formats.fp8 import AmaxAct
from dlmrt.ops import choices, gemma
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.fp8_choice import cold_time_us, cold_weights, describe, kernel_times, measure
from dlmrt.ops.timing import graph_time_us

_MEASURED: dict[tuple, tuple] = {}


def glu_configs(rows: int) -> list[tuple[int, ...]]:
    """Tiles (bm, bn, bk, stages, warps) of kernels/fp8_glu_gemm.py worth timing: 64-row tiles at
    <= 64 rows (the smallest wgmma), else 128; each program holds two fp32 accumulators."""
    bm = 64 if rows <= 64 else 128
    return [(bm, 64, 128, 4, 4), (bm, 64, 128, 4, 8), (bm, 128, 128, 3, 8), (64, 128, 128, 4, 4)]


def _fused(rows, i, k, n_down, gelu, x, device) -> tuple[float, tuple | None, tuple | None]:
    """(µs, glu config, down config) of the fused form's fastest pair (inf if none runs)."""
    _, gu = cold_weights(2 * i, k, device)
    glu: dict[tuple, float] = {}
    for config in glu_configs(rows):
        plan = fp8_ops.GluPlan(rows, config)
        try:
            glu[config] = cold_time_us(
                lambda w, p=plan: fp8_ops.glu_fp8(x, w, torch.bfloat16, p, gelu), gu
            )
        except Exception:  # noqa: BLE001 (a tile too big for this GPU: not a candidate)
            continue
    if not glu:
        return float("inf"), None, None
    best_glu = min(glu, key=glu.__getitem__)
    y = fp8_ops.glu_fp8(x, gu[0], torch.bfloat16, fp8_ops.GluPlan(rows, best_glu), gelu)
    assert isinstance(y, AmaxAct)
    _, down = cold_weights(n_down, i, device)
    ran = {
        c: t
        for c, t in kernel_times(rows, n_down, i, y, down, device).items()
        if isinstance(t, float)
    }
    if not ran:
        return float("inf"), None, None
    best_down = min(ran, key=ran.__getitem__)
    return glu[best_glu] + ran[best_down], best_glu, best_down


def _separate(rows, i, k, n_down, gelu, device) -> float:
    """µs of the separate form: its GEMMs as installed (cached) and the activation between."""
    gate_up = torch.randn(rows, 2 * i, device=device, dtype=torch.bfloat16)
    if gelu:  # GeGLU: the down projection's measured time includes its row quantizer
        act_us = graph_time_us(lambda: gemma.gelu_mul(gate_up))
    else:
        act_us = graph_time_us(lambda: fp8_ops.silu_mul_fp8(gate_up))
    first = measure(rows, 2 * i, k, device, fused_input=not gelu)[1]
    return first + act_us + measure(rows, n_down, i, device, fused_input=not gelu)[1]


def use_glu(
    rows: int, i: int, k: int, n_down: int, device: torch.device, gelu: bool
) -> tuple[bool, str, tuple | None, tuple | None]:
    """(run gate|up + activation as one kernel?, why, its config, the down GEMM's config) for a
    gated MLP [k] -> 2 x [i] -> [n_down] at `rows` rows (SiLU, or gelu_tanh with `gelu`);
    recorded in the choices registry."""
    ok, why, glu, down, options = _decide(rows, i, k, n_down, device, gelu)
    what = f"fp8 {'geglu' if gelu else 'swiglu'} {rows}x{k}->2x{i}->{n_down}: gate|up + activation"
    choices.record(what, "one kernel" if ok else "separate", why, options)
    return ok, why, glu, down


def _decide(rows, i, k, n_down, device, gelu) -> tuple[bool, str, tuple | None, tuple | None, dict]:
    policy = envs.fp8_glu()
    if device.type != "cuda" or policy == "off":
        return False, "CPU" if device.type != "cuda" else "DLMRT_FP8_GLU=off", None, None, {}
    key = (rows, i, k, n_down, gelu, envs.fp8_gemm_kernel())
    if key not in _MEASURED:
        x = fp8_ops.quant_rows(torch.randn(rows, k, device=device, dtype=torch.bfloat16))
        fused, glu, down = _fused(rows, i, k, n_down, gelu, x, device)
        if not gelu or fused == float("inf"):
            quant = 0.0  # SwiGLU: its input comes quantized from the norm either way
        else:  # GeGLU's input is quantized before the fused kernel (measured with the GEMM)
            h = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            quant = graph_time_us(lambda: fp8_ops.quant_rows(h))
        _MEASURED[key] = (_separate(rows, i, k, n_down, gelu, device), fused + quant, glu, down)
    separate, fused, glu, down = _MEASURED[key]
    options = {"separate": separate, "one kernel": fused}
    why = (
        f"{rows}x{k}->2x{i}->{n_down}: separate {separate:.1f} us, one kernel {fused:.1f} us "
        f"(glu {glu}, down on {describe(down)})"
    )
    if glu is None:
        return False, why, None, None, options
    if policy == "on":
        return True, f"DLMRT_FP8_GLU=on; {why}", glu, down, options
    return fused < separate, why, glu, down, options
