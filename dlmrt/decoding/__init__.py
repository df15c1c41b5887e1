"""Acceptance rules, one per file, registered by name."""

from __future__ import annotations

from dlmrt.decoding.base import DecodeRule, Proposal, RuleOutput
from dlmrt.decoding.entropy_budget import EntropyBudgetRule
from dlmrt.decoding.fixed_steps import FixedStepsRule
from dlmrt.decoding.llada_editing import LLaDAEditingRule
from dlmrt.decoding.proposal import propose
from dlmrt.decoding.threshold import ThresholdRule
from dlmrt.params import ENTROPY_BUDGET, THRESHOLD, DecodeParams
from dlmrt.rules import BLOCK, RULES

_DEFAULTS = DecodeParams()  # the knobs' defaults live in dlmrt/params.py only


def make_rule(
    name: str,
    *,
    threshold: float = THRESHOLD,
    entropy_budget: float = ENTROPY_BUDGET,
    denoising_steps: int | None = None,
    editing: str = "quality",
    max_post_steps: int = _DEFAULTS.max_post_steps,
) -> DecodeRule:
    """Build a block-style rule by name from the per-request knobs (validated by `DecodeParams`;
    `dlmrt/rules.py` lists the names). denoising_steps: `fixed_steps` only, required there."""
    info = RULES.get(name)
    if info is None:
        raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})")
    if info.style != BLOCK:
        raise ValueError(
            f"rule: {name!r} is the {info.style}-style decoder ({info.summary}), not a block rule: "
            "it is configured by CanvasSettings"
        )
    if name == "threshold":
        return ThresholdRule(threshold)
    if name == "entropy_budget":
        return EntropyBudgetRule(entropy_budget)
    if name == "fixed_steps":
        if denoising_steps is None:
            raise ValueError("denoising_steps: rule 'fixed_steps' needs it (rounds per block)")
        return FixedStepsRule(denoising_steps)
    if name == "llada_editing":
        return LLaDAEditingRule.preset(editing, max_post_steps)
    raise AssertionError(f"rule {name!r} is registered in dlmrt/rules.py but has no builder")


__all__ = ["RULES", "DecodeRule", "Proposal", "RuleOutput", "make_rule", "propose"]
