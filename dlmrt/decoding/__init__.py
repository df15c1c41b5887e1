"""Acceptance rules, one per file, registered by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlmrt.decoding.base import DecodeRule, Proposal, RuleOutput
from dlmrt.decoding.entropy_budget import EntropyBudgetRule
from dlmrt.decoding.fixed_steps import FixedStepsRule
from dlmrt.decoding.llada_editing import LLaDAEditingRule
from dlmrt.decoding.proposal import propose
from dlmrt.decoding.threshold import ThresholdRule
from dlmrt.rules import BLOCK, KNOBS, RULES

# Each block rule's class (or constructor), called with the rule's declared knobs as keywords.
BUILDERS: dict[str, Callable[..., DecodeRule]] = {
    "threshold": ThresholdRule,
    "entropy_budget": EntropyBudgetRule,
    "fixed_steps": FixedStepsRule,
    "llada_editing": LLaDAEditingRule.preset,
}


def make_rule(name: str, **knobs: Any) -> DecodeRule:
    """Build a block-style rule by name (`dlmrt/rules.py` lists the names and each rule's knobs).

    Each of the rule's knobs is passed to its builder under its name: the value given here (None:
    not given), else the knob's declared fallback; values are validated by `DecodeParams`. Knobs
    of other rules are ignored, so a caller may pass every knob of a request. A knob without a
    value or a fallback (`denoising_steps`, the block length by default) is a ValueError."""
    info = RULES.get(name)
    if info is None:
        raise ValueError(f"rule: unknown rule {name!r} (choose from {', '.join(RULES)})")
    if info.style != BLOCK:
        raise ValueError(
            f"rule: {name!r} is the {info.style}-style decoder ({info.summary}), not a block rule: "
            "it is configured by CanvasSettings"
        )
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise TypeError(f"make_rule: no knob(s) {unknown} (declared: {', '.join(KNOBS)})")
    values = {}
    for knob in info.knobs:
        value = knob.fallback if knobs.get(knob.name) is None else knobs[knob.name]
        if value is None:
            raise ValueError(f"{knob.name}: rule {name!r} needs it (it has no default)")
        values[knob.name] = value
    return BUILDERS[name](**values)


__all__ = ["RULES", "DecodeRule", "Proposal", "RuleOutput", "make_rule", "propose"]
