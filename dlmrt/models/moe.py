"""Sigmoid-routed, group-limited MoE with shared experts (LLaDA2 / DeepSeek-V3 style routing).

    scores  = sigmoid(W_r x)                                   fp32
    biased  = scores + expert_bias                             selection only
    group g score = sum of the top-2 biased scores in g; keep the `topk_group` best groups
    index   = top-k of `biased` over the kept groups' experts
    weights = scores[index] / sum(scores[index]) * routed_scaling_factor   (unbiased scores)
    y       = sum_j weights_j * expert_{index_j}(x) + shared(x)

Routing goes through `ops.moe_route_grouped`, the experts through `models/experts.py` (Triton on
CUDA: one routing kernel and a grouped GEMM without host syncs; the torch twins on the CPU).
Checkpoints store one tensor per expert (`experts.E.{gate,up,down}_proj.weight`); `Experts` keeps them stacked [E, ...] and
`stacked_slices` tells the loader which stored name fills which slice.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from dlmrt import ops
from dlmrt.models.experts import Experts
from dlmrt.models.layers import SwiGLU

log = logging.getLogger("dlmrt")
EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


class Router(nn.Module):
    """`mlp.gate`: the router weight [E, hidden] and the selection-only `expert_bias` buffer."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        if cfg.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(cfg.num_experts, dtype=torch.float32))
        else:
            self.expert_bias = None
        self.n_group, self.topk_group, self.top_k = cfg.n_group, cfg.topk_group, cfg.top_k
        self.norm, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self._fp32: tuple[tuple, torch.Tensor] | None = None  # (weight's identity, fp32 copy)

    def weight_fp32(self) -> torch.Tensor:
        """The weight in fp32. Inference keeps one converted copy (a bf16 model converted it in
        every forward: a kernel per layer per round), refreshed when the weight changes."""
        w = self.weight
        if w.dtype == torch.float32 or (w.requires_grad and torch.is_grad_enabled()):
            return w.float()
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        if self._fp32 is None or self._fp32[0] != key:
            self._fp32 = (key, w.detach().float())
        return self._fp32[1]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = router_logits(x, self.weight, self.weight_fp32)  # fp32 logits
        # Ties and the top_k == 1 case: see `ops.reference.moe_route_grouped`.
        return ops.moe_route_grouped(
            logits,
            self.expert_bias,
            self.n_group,
            self.topk_group,
            self.top_k,
            self.norm,
            self.scaling,
        )


def router_logits(x: torch.Tensor, weight: torch.Tensor, weight_fp32) -> torch.Tensor:
    """x @ weight.T in fp32 (`weight_fp32`: the weight's fp32 copy, on demand).

    The router runs in fp32: x and the weight upcast, then an fp32 GEMM (the reference's
    numerics, the CPU's and training's path). On CUDA with a bf16 / fp16 x and weight the same
    products come from one tensor-core GEMM with fp32 accumulation and fp32 output
    (`torch.mm(..., out_dtype=float32)`): a half-precision product is exact in fp32, so only the
    summation order differs, where the upcast + SIMT sgemm cost two launches and ~7 us a layer
    at LLaDA's 32 rows. Used only where that torch op exists (checked once)."""
    half = x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype
    if half and x.is_cuda and not (weight.requires_grad and torch.is_grad_enabled()):
        if _mm_fp32_out(x.device):
            flat = torch.mm(x.reshape(-1, x.shape[-1]), weight.t(), out_dtype=torch.float32)
            return flat.reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x.float(), weight_fp32())


_MM_FP32_OUT: dict[str, bool] = {}


def _mm_fp32_out(device: torch.device) -> bool:
    """Whether torch.mm takes out_dtype=float32 for half inputs on this device type (once)."""
    if device.type not in _MM_FP32_OUT:
        try:
            a = torch.ones(16, 16, device=device, dtype=torch.bfloat16)
            ok = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError) as exc:
            ok = False
            log.info("router: torch.mm(out_dtype=float32) unavailable (%s): the fp32 GEMM", exc)
        _MM_FP32_OUT[device.type] = ok
    return _MM_FP32_OUT[device.type]


class SparseMoE(nn.Module):
    """`mlp` of a MoE layer: router (`gate`), routed `experts`, optional `shared_experts`."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.gate = Router(cfg)
        inter = cfg.moe_intermediate_size
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, inter, "silu", fused_gate_up=False)
        shared = cfg.moe_intermediate_size * cfg.num_shared_experts
        self.shared_experts = SwiGLU(cfg.hidden_size, shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = None if self.shared_experts is None else self.shared_experts(x)
        return self.experts(x, *self.gate(x), add=shared)


def stacked_slices(model: nn.Module) -> dict[str, tuple[str, int]]:
    """Stored per-expert tensor name -> (stacked parameter name, expert index), for the loader."""
    out: dict[str, tuple[str, int]] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, Experts) and not module.fused_gate_up:
            for proj in EXPERT_PROJS:
                for e in range(getattr(module, proj).shape[0]):
                    out[f"{prefix}.{e}.{proj}.weight"] = (f"{prefix}.{proj}", e)
    return out
