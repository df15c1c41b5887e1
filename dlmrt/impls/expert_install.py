"""Builders of the routed experts' implementation (rows of `formats.py`): FP8 experts on the W8A8
kernel or weight-only W8A16, whichever times faster at the block rows (`ops/moe_fp8_choice.py`);
NVFP4 experts on the W4A16 kernel, or converted to per-channel FP8 codes on the W8A8 kernel where
that is faster (never under W4A4 emulation or prefer="memory"). FP8 codes replace the module's bf16 stacks under the
same names; NVFP4 stacks live in the `Nvfp4Experts` object and the bf16 stacks are freed."""

from __future__ import annotations

import logging

import torch
from torch import nn

from dlmrt import envs
from dlmrt.formats.fp8 import quantize_per_channel
from dlmrt.impls.experts import DenseExperts, Nvfp4Experts, W8A8Experts
from dlmrt.impls.install import Installer
from dlmrt.ops.moe_fp8_choice import HALF, keep_nvfp4, use_fp8_for_nvfp4, use_w8a8
from dlmrt.ops.nvfp4 import split_gate_up

log = logging.getLogger("dlmrt")


def _split_scales(scales: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    if len(scales) == 2:  # fused gate|up [E, 2I]: split into the gate and up halves
        gate, up = scales[0].chunk(2, dim=1)
        return gate.contiguous(), up.contiguous(), scales[1]
    return tuple(scales)


def _set_codes(experts: nn.Module, codes: dict[str, torch.Tensor]) -> None:
    for proj, w in codes.items():
        setattr(experts, proj, nn.Parameter(w, requires_grad=False))


def fp8_experts(ins: Installer, prefix: str, experts: nn.Module, top_k: int) -> list[str]:
    """The FP8 stacks installed as codes + per-channel scales, W8A8 or W8A16 as measured."""
    names = [f"{prefix}.{p}" for p in experts.projs]
    _set_codes(
        experts, {p: ins.weights[n].qweight.to(ins.device) for p, n in zip(experts.projs, names)}
    )
    scales = _split_scales([ins.weights[n].scale.to(ins.device).float() for n in names])
    gate_up = experts.gate_up()
    gate_up = gate_up.chunk(2, dim=1) if isinstance(gate_up, torch.Tensor) else gate_up
    args = (ins.rows, top_k, tuple(gate_up), experts.down_proj, scales, experts.activation)
    w8a8, why = use_w8a8(*args, ins.dtype)
    experts.impl = W8A8Experts(scales) if w8a8 else DenseExperts(scales)
    kind = "W8A8" if w8a8 else "weight-only W8A16"
    log.debug("fp8 %s: FP8 %s (routed experts; %s)", prefix, kind, why)
    return names


def nvfp4_experts(ins: Installer, prefix: str, experts: nn.Module, top_k: int) -> list[str]:
    """NVFP4 stacks on the W4A16 kernel (kernels/moe_mlp_nvfp4.py), or, where it times faster
    (prefer="speed"), converted to per-channel FP8 codes on the W8A8 kernel; the bf16 stacks
    are freed (or were never allocated: `dlmrt/loading/deferred.py`)."""
    names = [f"{prefix}.{p}" for p in experts.projs]
    ws = [ins.weights[n].to(ins.device) for n in names]
    stacks = (*split_gate_up(ws[0]), ws[1]) if len(ws) == 2 else tuple(ws)
    if ins.emulate or ins.memory:
        why = "W4A4 emulation" if ins.emulate else "prefer='memory'"
        keep_nvfp4(ins.rows, top_k, stacks[2], experts.activation, why)
    elif _as_fp8(ins, prefix, experts, stacks, top_k):
        return names
    experts.impl = Nvfp4Experts(stacks)
    _set_codes(experts, {p: getattr(experts, p).new_empty(0) for p in experts.projs})
    log.debug("nvfp4 %s: NVFP4 weight-only W4A16 (routed experts)", prefix)
    return names


def _as_fp8(ins: Installer, prefix: str, experts: nn.Module, stacks: tuple, top_k: int) -> bool:
    """Convert NVFP4 stacks (gate, up, down) to per-channel FP8 codes on the W8A8 kernel if that
    times faster (installed into `experts`); False (nothing installed) otherwise."""
    activation = experts.activation
    if envs.nvfp4_experts() == "w4a16" or ins.dtype not in HALF:
        why = "DLMRT_NVFP4_EXPERTS=w4a16" if ins.dtype in HALF else f"a {ins.dtype} model"
        keep_nvfp4(ins.rows, top_k, stacks[2], activation, why)
        return False
    fp8 = [quantize_per_channel(w.dequantize(torch.float32)) for w in stacks]
    scales = tuple(w.scale.float() for w in fp8)
    codes = ((fp8[0].qweight, fp8[1].qweight), fp8[2].qweight, scales)
    ok, why = use_fp8_for_nvfp4(ins.rows, top_k, stacks, codes, activation)
    what = "converted to FP8 W8A8" if ok else "NVFP4 weight-only W4A16"
    log.debug("nvfp4 %s: %s (routed experts; %s)", prefix, what, why)
    if not ok:
        return False
    if experts.fused_gate_up:  # one stored gate|up stack
        _set_codes(experts, {"gate_up_proj": torch.cat([fp8[0].qweight, fp8[1].qweight], dim=1)})
    else:
        _set_codes(experts, {"gate_proj": fp8[0].qweight, "up_proj": fp8[1].qweight})
    _set_codes(experts, {"down_proj": fp8[2].qweight})
    experts.impl = W8A8Experts(scales)
    return True
