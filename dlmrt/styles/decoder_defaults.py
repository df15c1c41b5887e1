"""DecoderDefaults: the block decoder a request gets for the knobs it leaves unset.

Per knob (`rule`, and the block knobs declared `checkpoint` in `dlmrt/rules.py`: `threshold`,
`entropy_budget`), the first that is set wins:

1. the request's own value (`LLM.generate(threshold=...)`, `--threshold`, the HTTP field);
2. the checkpoint's default, `generation_config.json`:
   `"dlmrt_decoder": {"rule": "entropy_budget", "entropy_budget": 0.4}`;
3. dlmrt's: the family's rule for the checkpoint's role (`dlmrt/models/__init__.py`) and the
   knobs' fallbacks, declared with their rules in `dlmrt/rules.py`.

Why a checkpoint may carry one: a model trained for a decoder setting (an ORL model measured best
at one entropy budget, say) should decode that way by default, as vLLM applies the sampling
defaults a model ships in its `generation_config.json`. A `role` whose rule differs from the one
the checkpoint gets without a role (`LLM(role="base")` on an ORL checkpoint) asks for the
family's decoder of that role, so the checkpoint's entry is then not used; `role="orl"` on an
ORL checkpoint keeps it. A knob given as null counts as unset. Block-style families only;
DiffusionGemma's canvas decoder reads its own settings (`CanvasSettings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmrt.errors import CheckpointError
from dlmrt.params import ENTROPY_BUDGET, THRESHOLD, DecodeParams
from dlmrt.rules import BLOCK, RULE_OF_KNOB, RULES, style_knobs

KEY = "dlmrt_decoder"  # the generation_config.json entry
# What the entry may set: the rule and the block knobs declared `checkpoint` (dlmrt/rules.py),
# each a field below (tests/test_knobs.py checks that they agree).
KNOBS = ("rule", *(k.name for k in style_knobs(BLOCK, checkpoint=True)))


@dataclass(frozen=True, slots=True)
class DecoderDefaults:
    """The decoder of a request that names none (`resolve` fills a request's unset knobs)."""

    rule: str
    threshold: float = THRESHOLD
    entropy_budget: float = ENTROPY_BUDGET

    @classmethod
    def read(
        cls, family_rule: str, generation_config: dict[str, Any], path: Path, use_entry: bool = True
    ) -> DecoderDefaults:
        """The checkpoint's defaults over the family's rule; CheckpointError naming the file and
        the key for a malformed entry. use_entry False (a role that changes the rule): the
        family's rule and dlmrt's knobs."""
        entry = generation_config.get(KEY)
        if entry is None or not use_entry:
            return cls(family_rule)
        where = f"{path}: {KEY!r}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: expected an object, got {entry!r}")
        unknown = sorted(set(entry) - set(KNOBS))
        if unknown:
            raise CheckpointError(
                f"{where}: unknown key(s) {unknown} (allowed: {', '.join(KNOBS)})"
            )
        entry = {k: v for k, v in entry.items() if v is not None}  # null: unset
        try:
            DecodeParams(**entry)  # the same checks (and messages) as a request's knobs
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: {e}") from None
        rule = entry.pop("rule", family_rule)
        if RULES[rule].style != BLOCK:
            raise CheckpointError(f"{where}: rule {rule!r} is not a block-style rule")
        return cls(rule, **entry)

    def resolve(self, params: DecodeParams) -> tuple[str, float, float]:
        """(rule, threshold, entropy_budget) of a request: its values where set, else these."""
        rule, knobs = self.rule_knobs(params)
        return rule, knobs["threshold"], knobs["entropy_budget"]

    def rule_knobs(self, params: DecodeParams) -> tuple[str, dict[str, Any]]:
        """A request's rule (its own; else that of a knob it sets that selects its rule, as
        `editing`; else this default) and every block knob: the request's value, else this
        checkpoint's, else None (`make_rule` then applies the knob's declared fallback)."""
        knobs = {k.name: getattr(params, k.name) for k in style_knobs(BLOCK)}
        selected = [
            RULE_OF_KNOB[k.name].name
            for k in style_knobs(BLOCK)
            if k.selects_rule and knobs[k.name] is not None
        ]
        for name in KNOBS[1:]:
            if knobs[name] is None:
                knobs[name] = getattr(self, name)
        return params.rule or (selected[0] if selected else self.rule), knobs
