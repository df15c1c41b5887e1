"""Builders of the dense sites' implementation objects (rows of `formats.py`): a quantized linear,
a gated MLP's `gate_up` and `down_proj`.

- FP8 (`fp8_linear`, `fp8_gated_mlp`): per-channel e4m3 `Fp8Linear`s on cuBLAS or kernels/fp8_gemm.py,
  kept where they measure faster than bf16 at the model's block rows (`ops/fp8_choice.py`). A
  linear's activation is quantized inside its producer where one can (`fused_input`: an RMSNorm with
  `norms.fp8_out_norm`, `ops.fp8.silu_mul_fp8` before an FP8 down projection of a SwiGLU), else by
  a row quantizer before the GEMM (the measurement includes it). gate|up and the activation as
  one kernel where that measures faster (`glu_install.py`).
- NVFP4 (`nvfp4_gated_mlp`): a dense gated MLP whose gate, up and down are all NVFP4, as
  `Nvfp4Linear`s on the dense W4A16 kernel where it is faster (`ops/nvfp4_choice.py`; all of them
  under W4A4 emulation and with prefer="memory").
Any other format with a `linear` builder gets `install.generic_gated_mlp`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from dlmrt.formats.fp8 import Fp8Weight
from dlmrt.formats.nvfp4 import Nvfp4Weight
from dlmrt.impls.activation import act_mul
from dlmrt.impls.fp8_linear import Fp8Linear
from dlmrt.impls.gate_up import QuantGateUp
from dlmrt.impls.glu_install import install_glu
from dlmrt.impls.install import PROJS, Installer, set_gate_up
from dlmrt.impls.nvfp4_linear import Nvfp4Linear
from dlmrt.ops import fp8 as fp8_ops
from dlmrt.ops.fp8_choice import use_fp8_gemm
from dlmrt.ops.nvfp4_choice import use_nvfp4_dense

log = logging.getLogger("dlmrt")


def fp8_linear(
    ins: Installer, names: list[str], weights: list[Fp8Weight], fused_input: bool
) -> Fp8Linear | None:
    """An Fp8Linear of the stacked `weights` if the FP8 GEMM wins at the block rows, else None."""
    w = Fp8Weight(torch.cat([w.qweight for w in weights]), torch.cat([w.scale for w in weights]))
    n_out, k = w.shape
    ok, why, config = use_fp8_gemm(ins.rows, n_out, k, ins.device, fused_input)
    log.debug("fp8 %s: %s (%s)", names[0].rsplit(".", 2)[0], "FP8" if ok else "bf16", why)
    if not ok:
        return None
    plan = None if config is None else fp8_ops.GemmPlan.new(ins.rows, n_out, config, ins.device)
    placed = Fp8Weight(w.qweight.to(ins.device), w.scale.to(ins.device))
    return Fp8Linear(placed, ins.dtype, plan)


def fp8_gated_mlp(
    ins: Installer, prefix: str, mlp: nn.Module, producer: nn.Module | None
) -> list[str]:
    """FP8 gate|up and down (each where it wins); the input quantized in `producer` (the norm
    before the MLP, if it can), a SwiGLU's hidden in `silu_mul_fp8` when both halves are FP8;
    then gate|up + activation as one kernel where that is faster."""
    names = [f"{prefix}.{p}.weight" for p in PROJS]
    done: list[str] = []
    gate_up = ins.linear(names[:2], fused_input=producer is not None, norm=producer)
    silu_fp8 = gate_up is not None and mlp.activation == "silu"
    down = ins.linear(names[2:], fused_input=silu_fp8)
    if gate_up is not None:
        act = fp8_ops.silu_mul_fp8 if silu_fp8 and down is not None else act_mul(mlp.activation)
        set_gate_up(mlp, QuantGateUp(gate_up, act))
        done += names[:2]
    if down is not None:
        ins.swap(mlp, "down_proj", down)
        done += names[2:]
        install_glu(prefix, mlp, ins.rows)
    return done


def nvfp4_gated_mlp(
    ins: Installer, prefix: str, mlp: nn.Module, producer: nn.Module | None
) -> list[str]:
    """gate|up as one `Nvfp4Linear` (each half keeps its global scale, per row), down as another,
    if all three are NVFP4 (and the W4A16 kernel is faster, unless emulating W4A4 or
    prefer="memory"); the input stays in the model dtype (no NVFP4 activation producer)."""
    names = [f"{prefix}.{p}.weight" for p in PROJS]
    if not all(isinstance(ins.weights.get(n), Nvfp4Weight) for n in names):
        return []  # gate/up NVFP4 beside an FP8 down, say: all three dequantized
    if not ins.emulate and not ins.memory:
        gate_up, down = ins.weights[names[0]].shape, ins.weights[names[2]].shape
        shapes = [(2 * gate_up[0], gate_up[1]), (down[0], down[1])]
        ok, why = use_nvfp4_dense(ins.rows, shapes, ins.device)
        log.debug("nvfp4 %s: %s (%s)", prefix, "W4A16 kernel" if ok else "dequantized", why)
        if not ok:
            return []
    ws = {n: ins.weights[n].to(ins.device) for n in names}
    set_gate_up(
        mlp, QuantGateUp(Nvfp4Linear({n: ws[n] for n in names[:2]}), act_mul(mlp.activation))
    )
    ins.swap(mlp, "down_proj", Nvfp4Linear({names[2]: ws[names[2]]}))
    log.debug("nvfp4 %s: NVFP4 weight-only W4A16 (dense MLP)", prefix)
    return names
