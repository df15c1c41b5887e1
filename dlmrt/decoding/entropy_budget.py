"""`entropy_budget`: the EB-sampler (Ben-Hamu et al. 2025), exact paper form (as SGLang's EBSampling).

Sort the unresolved rows by entropy (nats, natural log, not normalised), ascending, and accept the
longest prefix U with sum_{i in U} H_i - max_{i in U} H_i <= gamma. In ascending order that is: the
k-th row is accepted iff H_(1) + ... + H_(k-1) <= gamma, so the lowest-entropy row always is.
(JetEngine's variant uses the inclusive sum and accepts one row fewer; we follow the paper.)
Default gamma for QwenDLM + ORL: 0.8; the paper sweeps 0.2-3.0. Ties sort by row index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrt.decoding.base import DecodeRule, Proposal
from dlmrt.rules import KNOBS


@dataclass(frozen=True, slots=True)
class EntropyBudgetRule(DecodeRule):
    entropy_budget: float = KNOBS["entropy_budget"].fallback  # gamma
    name: str = "entropy_budget"

    def accept(
        self, proposal: Proposal, unresolved: torch.Tensor, step: torch.Tensor
    ) -> torch.Tensor:
        # NaN entropies (a broken model) sort as the largest finite value, never before a resolved
        # row (+inf), so the lowest-entropy unresolved row is always accepted: progress is guaranteed.
        h = torch.nan_to_num(proposal.entropy, nan=torch.finfo(torch.float32).max)
        h = h.masked_fill(~unresolved, float("inf"))
        sorted_h, order = torch.sort(h, stable=True)
        # Exclusive prefix sum by shifting (not cumsum - h, whose rounding can flip a verdict at the
        # boundary); resolved rows sort last with +inf, so they never lower a sum before them.
        before = torch.cat((sorted_h.new_zeros(1), torch.cumsum(sorted_h, dim=0)[:-1]))
        ok_sorted = before <= self.entropy_budget
        ok = torch.zeros_like(unresolved).scatter_(0, order, ok_sorted)
        return unresolved & ok
