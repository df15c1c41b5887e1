"""W4A4 emulation (`activations="nvfp4"`): Blackwell's NVFP4 activation numerics on any GPU or
the CPU, by quantize-dequantizing the inputs of the installed NVFP4 GEMMs."""

from __future__ import annotations

import logging

from torch import nn

from dlmrt.impls.experts import Nvfp4Experts
from dlmrt.impls.nvfp4_linear import Nvfp4Linear
from dlmrt.ops.nvfp4 import act_quantizers

log = logging.getLogger("dlmrt")


def emulate_w4a4(model: nn.Module) -> None:
    """Give every NVFP4 experts implementation its activation quantizers (`ops.nvfp4.act_quantizers`)
    and every installed dense NVFP4 linear its input scale (`Nvfp4Linear.emulate_w4a4`: the dense
    MLP's input with max(gate, up)'s, the hidden with down's); ValueError naming a missing input
    scale. Dense NVFP4 weights the model did not install run dequantized (W16A16)."""
    experts = [
        m.impl for m in model.modules() if isinstance(getattr(m, "impl", None), Nvfp4Experts)
    ]
    for impl in experts:
        impl.act_scales = act_quantizers(*impl.stacks)
    mlps = [m for m in model.modules() if isinstance(getattr(m, "gate_up", None), nn.Module)]
    pairs = [(m.gate_up.linear, m.down_proj) for m in mlps]  # in the order they run
    dense = [lin for pair in pairs for lin in pair if isinstance(lin, Nvfp4Linear)]
    for m in dense:
        m.emulate_w4a4()
    log.info(
        "NVFP4 W4A4 emulation: the inputs of %d expert layer(s) and %d dense NVFP4 linear(s) "
        "quantize-dequantized per 16 (Blackwell's numerics, not its speed)",
        len(experts),
        len(dense),
    )
