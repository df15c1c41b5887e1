"""Whether a dense gated MLP in the model dtype runs gate|up and its activation as one kernel:
measured at start-up, per shape.

The two forms (`ops/bf16_glu.py`): separate, cuBLAS's gate|up GEMM storing [rows, 2I] and the
activation kernel reading it back (kernels/silu_mul.py); fused, kernels/fp8_glu_gemm.py's
unscaled form storing y [rows, I]. Each is timed as the rounds run it (`fp8_choice.cold_time_us`:
graph replay, the weights cycling past the L2), the fused one over a few tile configs; the faster
form is kept. DLMRT_BF16_GLU pins it: "off" (the default: slower than
cuBLAS at every block shape on an H100), "auto" (the
measurement decides; the CPU keeps the separate form), "on" (always; on CUDA still measured for
its tile config, on the CPU the twin runs). Each shape's choice is recorded in the choices
registry (`ops/choices.py`: logged once).
"""

from __future__ import annotations

import torch

from dlmrt import envs
from dlmrt.ops import choices, implementation
from dlmrt.ops.bf16_glu import fits, glu_bf16, twin
from dlmrt.ops.fp8 import GluPlan
from dlmrt.ops.fp8_choice import COPIES, L2_BYTES, cold_time_us

_MEASURED: dict[tuple, tuple[float, dict[tuple, float]]] = {}


def glu_configs(rows: int) -> list[tuple[int, ...]]:
    """Tiles (bm, bn, bk, stages, warps) of the fused kernel worth timing: 64-row tiles at <= 64
    rows (the smallest wgmma), else 128; each program holds two fp32 accumulators."""
    bm = 64 if rows <= 64 else 128
    return [
        (bm, 64, 64, 4, 4),
        (bm, 64, 64, 4, 8),
        (bm, 128, 64, 3, 8),
        (bm, 128, 64, 4, 8),
        (64, 128, 64, 4, 4),
    ]


def use_bf16_glu(
    rows: int, i: int, k: int, device: torch.device, dtype: torch.dtype, gelu: bool
) -> tuple[bool, str, tuple | None]:
    """(run gate|up + activation as one kernel?, why, its tile config or None) for a gated MLP
    [k] -> 2 x [i] in `dtype` at `rows` rows (SiLU, or gelu_tanh with `gelu`); recorded in the
    choices registry. True with no config: pinned on where the kernel cannot run (the twin runs)."""
    ok, why, config, options = _decide(rows, i, k, device, dtype, gelu)
    name = str(dtype).removeprefix("torch.")
    what = f"{name} {'geglu' if gelu else 'swiglu'} {rows}x{k}->2x{i}: gate|up + activation"
    choices.record(what, "one kernel" if ok else "separate", why, options)
    return ok, why, config


def _decide(rows, i, k, device, dtype, gelu) -> tuple[bool, str, tuple | None, dict]:
    policy = envs.bf16_glu()
    if policy == "off":
        return False, "DLMRT_BF16_GLU=off", None, {}
    unmeasured = _why_not_measured(rows, k, device, dtype)
    if unmeasured:
        if policy == "on":
            return True, f"DLMRT_BF16_GLU=on; {unmeasured}: its twin runs", None, {}
        return False, unmeasured, None, {}
    key = (rows, i, k, dtype, gelu, str(device))
    if key not in _MEASURED:
        _MEASURED[key] = _measure(rows, i, k, device, dtype, gelu)
    separate, fused = _MEASURED[key]
    if not fused:
        return policy == "on", f"no tile config of the kernel runs here ({policy})", None, {}
    config = min(fused, key=fused.__getitem__)
    options = {"separate": separate, "one kernel": fused[config]}
    why = (
        f"{rows}x{k}->2x{i}: separate {separate:.1f} us, one kernel {fused[config]:.1f} us "
        f"(tiles {config})"
    )
    if policy == "on":
        return True, f"DLMRT_BF16_GLU=on; {why}", config, options
    return fused[config] < separate, why, config, options


def _why_not_measured(rows: int, k: int, device: torch.device, dtype: torch.dtype) -> str:
    """Why the kernel cannot run here ("" when it can)."""
    if device.type != "cuda":
        return "CPU" if device.type == "cpu" else device.type
    if implementation("silu_mul") != "triton":
        return "torch ops"
    probe = torch.empty(rows, k, device=device, dtype=dtype)
    if not fits(probe, probe):
        return f"{dtype} x [{rows}, {k}] does not fit the kernel's TMA loads"
    return ""


def _measure(rows, i, k, device, dtype, gelu) -> tuple[float, dict[tuple, float]]:
    """(µs of the separate form, {config: µs of the fused form}) over weights cycling past the L2."""
    weight_bytes = 2 * i * k * torch.empty(0, dtype=dtype).element_size()
    copies = max(2, min(COPIES, -(-L2_BYTES // weight_bytes)))
    ws = [torch.randn(2 * i, k, device=device, dtype=dtype) / k**0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device=device, dtype=dtype)
    separate = cold_time_us(lambda w: twin(x, w, gelu), ws)
    fused: dict[tuple, float] = {}
    for config in glu_configs(rows):
        plan = GluPlan(rows, config)
        try:
            fused[config] = cold_time_us(lambda w, p=plan: glu_bf16(x, w, gelu, p), ws)
        except Exception:  # noqa: BLE001 (a tile too big for this GPU: not a candidate)
            continue
    return separate, fused
