"""The decoding-rule contract (the rules: `docs/decoding.md`).

Vocabulary, for the active block of B rows:
  canvas      [B] long   current token ids (prompt tail, accepted tokens, mask ids)
  unresolved  [B] bool   rows still to be decided (True = masked / not yet accepted)
  proposal    per-row candidate token, its confidence (probability under the decoding distribution),
              the entropy of that distribution (nats) and its log-normaliser (see `propose`)
  accepted    [B] bool   rows whose proposal was written into the canvas this round
  done        []  bool   the block is finished

A rule is a pure function of these tensors: no host sync (.item(), .tolist(), bool(tensor)), no
model call, no KV write, no data-dependent shapes. That is what lets a whole block run inside one
CUDA graph, and what lets every rule be tested on the CPU with crafted logits. Absorbing rules
accept at least one unresolved row per round, so a block always terminates. Editing rules
(`llada_editing`) may also rewrite resolved rows of the block (`editable`, never the prompt tail);
they carry their own round counter (`post_steps`) and bound the rounds with `max_rounds`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

import torch


class Proposal(NamedTuple):
    tokens: torch.Tensor  # [B] long: argmax (greedy) or sampled token
    confidence: torch.Tensor  # [B] fp32: probability of `tokens`
    entropy: torch.Tensor  # [B] fp32: entropy of the decoding distribution, nats
    log_z: torch.Tensor  # [B] fp32: logsumexp(logits / T); reused by the residual softmax


class RuleOutput(NamedTuple):
    canvas: torch.Tensor  # [B] long
    unresolved: torch.Tensor  # [B] bool
    accepted: torch.Tensor  # [B] bool
    done: torch.Tensor  # [] bool
    edited: torch.Tensor | None = None  # [B] bool: resolved rows rewritten (editing rules only)
    post_steps: torch.Tensor | None = None  # [] long: editing rules' post-fill round counter


class DecodeRule(ABC):
    """An acceptance rule: decides which unresolved rows take their proposal this round."""

    name: str
    edits: ClassVar[bool] = False  # rewrites resolved rows, checking a filled block (post-fill)

    def max_rounds(self, block: int) -> int:
        """Upper bound on the rounds of a block (absorbing rules accept >= 1 row per round)."""
        return block

    @abstractmethod
    def accept(
        self, proposal: Proposal, unresolved: torch.Tensor, step: torch.Tensor
    ) -> torch.Tensor:
        """Return the bool [B] rows to accept; must be a subset of `unresolved` (non-empty if it is)."""

    def __call__(
        self,
        proposal: Proposal,
        canvas: torch.Tensor,
        unresolved: torch.Tensor,
        step: torch.Tensor,
        editable: torch.Tensor | None = None,
        post_steps: torch.Tensor | None = None,
    ) -> RuleOutput:
        """`editable` (rows the request generates) and `post_steps` are read by editing rules only."""
        accepted = self.accept(proposal, unresolved, step) & unresolved
        canvas = torch.where(accepted, proposal.tokens, canvas)
        unresolved = unresolved & ~accepted
        return RuleOutput(canvas, unresolved, accepted, ~unresolved.any())
