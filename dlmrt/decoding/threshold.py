"""`threshold`: confidence-aware parallel decoding (Fast-dLLM v2 / SGLang LowConfidence).

Accept every unresolved row whose confidence is strictly greater than tau, and always the most
confident unresolved row (lowest index among ties), so every round makes progress. SDAR and
QwenDLM Base use tau = 0.9. Branch-free: the forced row is a one-hot of a masked argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrt.decoding.base import DecodeRule, Proposal
from dlmrt.rules import KNOBS


@dataclass(frozen=True, slots=True)
class ThresholdRule(DecodeRule):
    threshold: float = KNOBS["threshold"].fallback
    name: str = "threshold"

    def accept(
        self, proposal: Proposal, unresolved: torch.Tensor, step: torch.Tensor
    ) -> torch.Tensor:
        conf = proposal.confidence.masked_fill(~unresolved, -1.0)
        best = torch.zeros_like(unresolved).scatter_(0, conf.argmax().view(1), True)
        return unresolved & ((conf > self.threshold) | best)
