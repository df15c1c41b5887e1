"""Calibration for `dlmrt quantize`: the diagonal of H = XᵀX of every gated MLP's inputs.

`HessianHooks(model)` hooks every routed-experts module and every dense gated MLP (SwiGLU /
GeGLU) of a built dlmrt model; while the model decodes the calibration prompts (the canvases it
sees at inference), each hook adds Σ x² over the tokens to its projections' diagonals: gate / up
from the MLP input, down from SiLU(gate)·up (GELU for GeGLU / DiffusionGemma) recomputed from the
layer's weights; routed experts per expert, from the tokens routed to it. `diagonals()` returns
{parameter name: h} with h [K] (dense) or [E, K] (stacked experts), named as the model's state_dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt.models import diffusion_gemma, moe
from dlmrt.models.layers import GeGLU, SwiGLU


def _act(gelu: bool, g: torch.Tensor) -> torch.Tensor:
    return F.gelu(g, approximate="tanh") if gelu else F.silu(g)


class HessianHooks:
    """Accumulates the Hessian diagonals while installed; `remove()` takes the hooks out."""

    def __init__(self, model: nn.Module) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.tokens: dict[str, int] = {}
        self.handles = []
        for name, module in model.named_modules():
            if isinstance(module, (moe.Experts, diffusion_gemma.Experts)):
                hook = self._experts_hook(name, module)
            elif isinstance(module, SwiGLU):
                hook = self._dense_hook(name, module)
            else:
                continue
            self.handles.append(module.register_forward_pre_hook(hook))

    def _add(self, name: str, value: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0) + value.detach().double().cpu()

    def _dense_hook(self, prefix: str, mlp: SwiGLU):
        def hook(_module, args) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            gate = F.linear(x, mlp.gate_proj.weight.float())
            h = _act(isinstance(mlp, GeGLU), gate) * F.linear(x, mlp.up_proj.weight.float())
            xx = (x**2).sum(0)
            for proj in ("gate_proj", "up_proj"):
                self._add(f"{prefix}.{proj}.weight", xx)
            self._add(f"{prefix}.down_proj.weight", (h**2).sum(0))

        return hook

    def _experts_hook(self, prefix: str, experts: nn.Module):
        fused = hasattr(experts, "gate_up_proj")  # DiffusionGemma: [E, 2I, H], GeGLU

        def hook(_module, args) -> None:
            x, _weights, index = args[0].float(), args[1], args[2]
            num = experts.down_proj.shape[0]
            xx = torch.zeros(num, x.shape[-1], device=x.device, dtype=torch.float32)
            hh = torch.zeros(num, experts.down_proj.shape[-1], device=x.device)
            for e in index.unique().tolist():
                xe = x[(index == e).any(-1)]
                if fused:
                    gate, up = F.linear(xe, experts.gate_up_proj[e].float()).chunk(2, dim=-1)
                else:
                    gate = F.linear(xe, experts.gate_proj[e].float())
                    up = F.linear(xe, experts.up_proj[e].float())
                xx[e] = (xe**2).sum(0)
                hh[e] = ((_act(fused, gate) * up) ** 2).sum(0)
            for proj in ("gate_up_proj",) if fused else ("gate_proj", "up_proj"):
                self._add(f"{prefix}.{proj}", xx)
            self._add(f"{prefix}.down_proj", hh)

        return hook

    def diagonals(self) -> dict[str, torch.Tensor]:
        """{parameter name: diag(XᵀX) fp32}; a projection no token reached is absent."""
        return {n: s.float() for n, s in self.sums.items()}

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
