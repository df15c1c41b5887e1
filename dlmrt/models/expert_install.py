"""Install a model's routed experts quantized (`quantized_install.py` walks the layers): FP8
experts on the W8A8 kernel or weight-only W8A16, whichever times faster at the block rows
(`ops/moe_fp8_choice.py`); NVFP4 experts on the W4A16 kernel, or converted to per-channel FP8
codes on the W8A8 kernel where that is faster (never under W4A4 emulation)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from dlmrt import envs
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.ops.moe_fp8_choice import HALF, keep_nvfp4, use_fp8_for_nvfp4, use_w8a8

if TYPE_CHECKING:
    from dlmrt.models.quantized_install import Installer

log = logging.getLogger("dlmrt")


def install_experts(
    ins: Installer,
    prefix: str,
    experts: nn.Module,
    projs: tuple[str, ...],
    top_k: int,
    activation: str,
) -> None:
    """The routed experts at `prefix` (`projs`: gate, up, down or gate|up, down), installed FP8
    or NVFP4 if all their projections are; else nothing (the loader dequantizes them)."""
    names = [f"{prefix}.{p}" for p in projs]
    if all(n in ins.nvfp4 for n in names):
        _nvfp4_experts(ins, prefix, experts, projs, top_k, activation)
        return
    if not all(n in ins.fp8 for n in names):
        return
    scales = []
    for proj, name in zip(projs, names):
        w = ins.fp8[name]
        setattr(experts, proj, nn.Parameter(w.qweight.to(ins.device), requires_grad=False))
        scales.append(w.scale.to(ins.device).float())
    if len(scales) == 2:  # fused gate|up [E, 2I]: split into the gate and up halves
        gate, up = scales[0].chunk(2, dim=1)
        scales = [gate.contiguous(), up.contiguous(), scales[1]]
    experts.fp8_scales = tuple(scales)
    ins.done += names
    gate_up = (
        (experts.gate_proj, experts.up_proj)
        if len(projs) == 3
        else (experts.gate_up_proj.chunk(2, dim=1))
    )
    w8a8, why = use_w8a8(
        ins.rows,
        top_k,
        tuple(gate_up),
        getattr(experts, projs[-1]),
        experts.fp8_scales,
        activation,
        ins.dtype,
    )
    experts.fp8_w8a8 = w8a8
    kind = "W8A8" if w8a8 else "weight-only W8A16"
    log.debug("fp8 %s: FP8 %s (routed experts; %s)", prefix, kind, why)


def _nvfp4_experts(
    ins: Installer,
    prefix: str,
    experts: nn.Module,
    projs: tuple[str, ...],
    top_k: int,
    activation: str,
) -> None:
    """NVFP4 routed experts: `experts.nvfp4` = (gate, up, down) on the device (W4A16 kernel,
    kernels/moe_mlp_nvfp4.py), or, where it times faster, converted to per-channel FP8 codes
    on the W8A8 kernel (`ops/moe_fp8_choice.py`; never under W4A4 emulation); the bf16
    stacks are freed."""
    from dlmrt.ops.nvfp4 import split_gate_up

    ws = [ins.nvfp4_to_device(ins.nvfp4[f"{prefix}.{p}"]) for p in projs]
    nvfp4 = (*split_gate_up(ws[0]), ws[1]) if len(ws) == 2 else tuple(ws)
    if ins.emulate:
        keep_nvfp4(ins.rows, top_k, nvfp4[2], activation, "W4A4 emulation")
    elif _nvfp4_as_fp8(ins, prefix, experts, nvfp4, top_k, activation):
        ins.done += [f"{prefix}.{p}" for p in projs]
        return
    experts.nvfp4 = nvfp4
    for proj in projs:
        old = getattr(experts, proj)
        setattr(experts, proj, nn.Parameter(old.new_empty(0), requires_grad=False))
    ins.done += [f"{prefix}.{p}" for p in projs]
    log.debug("nvfp4 %s: NVFP4 weight-only W4A16 (routed experts)", prefix)


def _nvfp4_as_fp8(
    ins: Installer, prefix: str, experts: nn.Module, nvfp4: tuple, top_k: int, activation: str
) -> bool:
    """Convert NVFP4 experts (gate, up, down) to per-channel FP8 codes on the W8A8 kernel if
    that times faster (installed into `experts`); False (nothing installed) otherwise."""
    if envs.nvfp4_experts() == "w4a16" or ins.dtype not in HALF:  # as `experts`
        why = "DLMRT_NVFP4_EXPERTS=w4a16" if ins.dtype in HALF else f"a {ins.dtype} model"
        keep_nvfp4(ins.rows, top_k, nvfp4[2], activation, why)
        return False
    fp8 = [quantize_per_channel(w.dequantize(torch.float32)) for w in nvfp4]
    scales = tuple(w.scale.float() for w in fp8)
    codes = ((fp8[0].qweight, fp8[1].qweight), fp8[2].qweight, scales)
    ok, why = use_fp8_for_nvfp4(ins.rows, top_k, nvfp4, codes, activation)
    log.debug(
        "nvfp4 %s: %s (routed experts; %s)",
        prefix,
        "converted to FP8 W8A8" if ok else "NVFP4 weight-only W4A16",
        why,
    )
    if not ok:
        return False
    if hasattr(experts, "gate_up_proj"):  # DiffusionGemma: one fused gate|up stack
        gate_up = torch.cat([fp8[0].qweight, fp8[1].qweight], dim=1)
        experts.gate_up_proj = nn.Parameter(gate_up, requires_grad=False)
        gate, up = gate_up.chunk(2, dim=1)
    else:
        gate, up = fp8[0].qweight, fp8[1].qweight
        experts.gate_proj = nn.Parameter(gate, requires_grad=False)
        experts.up_proj = nn.Parameter(up, requires_grad=False)
    experts.down_proj = nn.Parameter(fp8[2].qweight, requires_grad=False)
    experts.fp8_scales, experts.fp8_w8a8 = scales, True
    return True
