"""`fixed_steps`: a fixed number of denoising rounds per block (SDAR's `low_confidence_static`).

Round s of S accepts the k = ceil(n_unresolved / (S - s)) most confident unresolved rows (ties by
row index), so a block of B rows always finishes in exactly min(S, B) rounds. Benchmarks use it to
force a realistic tokens-per-forward (e.g. 23 rounds per 256-token block, TPF ~11) on random weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlmrt.decoding.base import DecodeRule, Proposal


@dataclass(frozen=True, slots=True)
class FixedStepsRule(DecodeRule):
    denoising_steps: int = 23
    name: str = "fixed_steps"

    def accept(
        self, proposal: Proposal, unresolved: torch.Tensor, step: torch.Tensor
    ) -> torch.Tensor:
        remaining = unresolved.sum()
        rounds_left = (self.denoising_steps - step).clamp(min=1)
        k = (remaining + rounds_left - 1) // rounds_left  # ceil, on the device
        conf = proposal.confidence.masked_fill(~unresolved, -1.0)
        order = torch.sort(conf, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(
            0, order, torch.arange(order.numel(), device=order.device)
        )
        return unresolved & (rank < k)
