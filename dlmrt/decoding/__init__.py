"""Acceptance rules, one per file, registered by name."""

from __future__ import annotations

from dlmrt.decoding.base import DecodeRule, Proposal, RuleOutput
from dlmrt.decoding.entropy_budget import EntropyBudgetRule
from dlmrt.decoding.fixed_steps import FixedStepsRule
from dlmrt.decoding.llada_editing import LLaDAEditingRule
from dlmrt.decoding.proposal import propose
from dlmrt.decoding.threshold import ThresholdRule
from dlmrt.params import RULE_NAMES

RULES = RULE_NAMES  # the names live with DecodeParams, which validates them without torch


def make_rule(
    name: str,
    *,
    threshold: float = 0.9,
    entropy_budget: float = 0.8,
    denoising_steps: int = 23,
    editing: str = "quality",
    max_post_steps: int = 16,
) -> DecodeRule:
    """Build a rule by name from the per-request knobs (validated by `DecodeParams`)."""
    if name == "threshold":
        return ThresholdRule(threshold)
    if name == "entropy_budget":
        return EntropyBudgetRule(entropy_budget)
    if name == "fixed_steps":
        return FixedStepsRule(denoising_steps)
    if name == "llada_editing":
        return LLaDAEditingRule.preset(editing, max_post_steps)
    raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})")


__all__ = ["RULES", "DecodeRule", "Proposal", "RuleOutput", "make_rule", "propose"]
