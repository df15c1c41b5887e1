"""Calibration for `dlmrt quantize`: H = XᵀX of every gated MLP's inputs, its diagonal or its 16 × 16
diagonal blocks (`HessianHooks(model, blocks=True)`).

`HessianHooks(model)` hooks every routed-experts module and every dense gated MLP (SwiGLU /
GeGLU) of a built dlmrt model; while the model decodes the calibration prompts (the canvases it
sees at inference), each hook adds Σ x² over the tokens to its projections' diagonals: gate / up
from the MLP input, down from SiLU(gate)·up (GELU for GeGLU / DiffusionGemma) recomputed from the
layer's weights; routed experts per expert, from the tokens routed to it. `diagonals()` returns
{parameter name: h} with h [K] (dense) or [E, K] (stacked experts) — with blocks, [K/16, 16, 16] /
[E, K/16, 16, 16] — named as the model's state_dict.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt.models.experts import Experts
from dlmrt.models.layers import SwiGLU


def _act(gelu: bool, g: torch.Tensor) -> torch.Tensor:
    return F.gelu(g, approximate="tanh") if gelu else F.silu(g)


class HessianHooks:
    """Accumulates the Hessian diagonals while installed; `remove()` takes the hooks out."""

    def __init__(self, model: nn.Module, blocks: bool = False) -> None:
        self.blocks = blocks
        self.sums: dict[str, torch.Tensor] = {}
        self.amax: dict[str, torch.Tensor] = {}  # max |input| ([E] per expert): input scales
        self.tokens: dict[str, int] = {}
        self.handles = []
        for name, module in model.named_modules():
            if isinstance(module, Experts):
                hook = self._experts_hook(name, module)
            elif isinstance(module, SwiGLU):
                hook = self._dense_hook(name, module)
            else:
                continue
            self.handles.append(module.register_forward_pre_hook(hook))

    def _add(self, name: str, value: torch.Tensor, amax: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0) + value.detach().double().cpu()
        amax = amax.detach().float().cpu()
        self.amax[name] = torch.maximum(self.amax[name], amax) if name in self.amax else amax

    def _h(self, x: torch.Tensor) -> torch.Tensor:
        """Σ_t x_t x_tᵀ of rows x [T, K]: its diagonal [K], or its 16 × 16 blocks [K/16, 16, 16]."""
        if not self.blocks or x.shape[-1] % 16:
            return (x**2).sum(0)
        xb = x.unflatten(-1, (-1, 16))
        return torch.einsum("tbi,tbj->bij", xb, xb)

    def _dense_hook(self, prefix: str, mlp: SwiGLU):
        def hook(_module, args) -> None:
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            gate = F.linear(x, mlp.gate_proj.weight.float())
            h = _act(mlp.activation == "gelu_tanh", gate) * F.linear(x, mlp.up_proj.weight.float())
            xx = self._h(x)
            for proj in ("gate_proj", "up_proj"):
                self._add(f"{prefix}.{proj}.weight", xx, x.abs().amax())
            self._add(f"{prefix}.down_proj.weight", self._h(h), h.abs().amax())

        return hook

    def _experts_hook(self, prefix: str, experts: nn.Module):
        fused = experts.fused_gate_up  # DiffusionGemma: one [E, 2I, H] stack

        def hook(_module, args) -> None:
            x, _weights, index = args[0].float(), args[1], args[2]
            num, inter = experts.down_proj.shape[0], experts.down_proj.shape[-1]
            xx = torch.zeros(num, *self._h(x[:1]).shape, device=x.device)
            hh = torch.zeros(num, *self._h(x.new_zeros(1, inter)).shape, device=x.device)
            x_amax, h_amax = x.new_zeros(num), x.new_zeros(num)
            for e in index.unique().tolist():
                xe = x[(index == e).any(-1)]
                if fused:
                    gate, up = F.linear(xe, experts.gate_up_proj[e].float()).chunk(2, dim=-1)
                else:
                    gate = F.linear(xe, experts.gate_proj[e].float())
                    up = F.linear(xe, experts.up_proj[e].float())
                he = _act(experts.activation == "gelu_tanh", gate) * up
                xx[e], hh[e] = self._h(xe), self._h(he)
                x_amax[e], h_amax[e] = xe.abs().amax(), he.abs().amax()
            for proj in ("gate_up_proj",) if fused else ("gate_proj", "up_proj"):
                self._add(f"{prefix}.{proj}", xx, x_amax)
            self._add(f"{prefix}.down_proj", hh, h_amax)

        return hook

    def diagonals(self) -> dict[str, torch.Tensor]:
        """{parameter name: diag(XᵀX) (or its blocks) fp32}; a projection no token reached is absent."""
        return {n: s.float() for n, s in self.sums.items()}

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
