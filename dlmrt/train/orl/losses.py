"""The ORL losses on one packed row, as numerators of globally normalised means (Appendix C).

    L_pred = sum_R (1/N_R) sum_{(b,k) in S(R), i in I_b} l_i  /  #responses
    l_i    = CE(p_i, y_i)                          (default: all valid positions)
           = CE if H_roll(i) > zeta else min(KL(p_i || q_i), C)   (entropy gate)
    L_AEC  = sum_pairs w_R g [max(0, H_next - (1 - rho) H_source)]^2  /  D
    L      = L_pred + lambda_AEC * L_AEC

Entropies are normalised (divided by log |V|) and taken at the rollout temperature; H_next is
the replayed mean over the target state's unresolved rows; H_source is the captured one
(detached). q is rebuilt from the head input with the current head under stop-gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LOGIT_CLIP = 50.0  # both RKL distributions: float32, clipped to [-50, 50] (Appendix C)


@dataclass(frozen=True, slots=True)
class LossSpec:
    temperature: float  # rollout temperature (entropies); 0 counts as 1
    rho: float
    aec_weight: float
    entropy_gate: bool
    zeta: float
    rkl_cap: float


def normalized_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[M] entropy of softmax(logits / T) / log V, in float32."""
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / t, dim=-1)
    return -(logp.exp() * logp).sum(-1) / math.log(logits.shape[-1])


def capped_rkl(logits: torch.Tensor, ref_logits: torch.Tensor, cap: float) -> torch.Tensor:
    """[M] min(KL(p || q), C), p = softmax(logits), q = softmax(ref) detached: zero with zero
    gradient when p == q; above the cap the value is C and the gradient zero."""
    logp = torch.log_softmax(logits.float().clamp(-LOGIT_CLIP, LOGIT_CLIP), dim=-1)
    logq = torch.log_softmax(ref_logits.detach().float().clamp(-LOGIT_CLIP, LOGIT_CLIP), dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    return kl.clamp(max=cap)


def aec_hinge(h_next: torch.Tensor, h_source: torch.Tensor, rho: float) -> torch.Tensor:
    """[S] [max(0, H_next - (1 - rho) H_source)]^2 (H_source is a constant)."""
    return torch.relu(h_next - (1.0 - rho) * h_source.detach()).square()


def segment_mean(values: torch.Tensor, rows: torch.Tensor, segment: torch.Tensor, n: int):
    """[n] mean of `values` over the `rows` (bool) of each segment (0 where a segment has none)."""
    w = rows.float()
    num = torch.zeros(n, device=values.device).index_add(0, segment, values * w)
    den = torch.zeros(n, device=values.device).index_add(0, segment, w)
    return num / den.clamp(min=1.0)


def row_terms(logits, ref_logits, row, spec: LossSpec) -> dict[str, torch.Tensor]:
    """Numerators of one row: {"ce", "rkl", "aec"} (scalars with grad), and "aec_diag" (no grad,
    `aec_diagnostics`). ref_logits: the RKL reference (None without the entropy gate)."""
    ce = F.cross_entropy(logits.float(), row.target, reduction="none")
    w = row.token_weight
    rkl = torch.zeros((), device=logits.device)
    if spec.entropy_gate:
        gate = row.h_roll > spec.zeta
        rkl = (w * (~gate) * capped_rkl(logits, ref_logits, spec.rkl_cap)).sum()
        w = w * gate
    out = {"ce": (w * ce).sum(), "rkl": rkl}
    s = row.aec_weight.shape[0]
    h_next = segment_mean(
        normalized_entropy(logits, spec.temperature), row.unresolved, row.segment, s
    )
    hinge = aec_hinge(h_next, row.h_source, spec.rho)
    out["aec"] = (row.aec_weight * hinge).sum()
    out["aec_diag"] = aec_diagnostics(h_next.detach(), hinge.detach(), row)
    return out


def aec_diagnostics(h_next: torch.Tensor, hinge: torch.Tensor, row) -> torch.Tensor:
    """[4] over this row's AEC pairs (aec_weight > 0, i.e. past the gate), from the per-state
    H_next and hinge `row_terms` computed: their count, those whose hinge is active (H_next above
    (1 - rho) H_source), sum of H_source, sum of H_next: the log's view of how much AEC acts."""
    pair = (row.aec_weight > 0).float()
    active = (hinge > 0).float()
    return torch.stack(
        [pair.sum(), (pair * active).sum(), (pair * row.h_source).sum(), (pair * h_next).sum()]
    )


def combine(nums: dict[str, torch.Tensor], responses: float, aec_den: float, spec: LossSpec):
    """(loss, parts): L = (ce + rkl) / responses + lambda * aec / D (D = 0: no AEC term)."""
    pred = (nums["ce"] + nums["rkl"]) / max(responses, 1e-12)
    aec = nums["aec"] / aec_den if aec_den > 0 else nums["aec"] * 0.0
    parts = {
        "ce": nums["ce"] / max(responses, 1e-12),
        "rkl": nums["rkl"] / max(responses, 1e-12),
        "aec": aec,
    }
    return pred + spec.aec_weight * aec, parts
