"""The acceptance rules by name: one registry for the CLI, `DecodeParams` and `make_rule` (no torch).

A rule belongs to one decoding style (see `docs/decoding.md`):
  block            QwenDLM and LLaDA2: rounds over a block of B rows (`dlmrt/decoding/*.py`)
  encoder_decoder  DiffusionGemma: denoising steps over a canvas (`CanvasSettings`, built from the
                   checkpoint's generation_config and the canvas fields of `DecodeParams`)
`knobs` are the `DecodeParams` fields the rule reads; their defaults live on `DecodeParams` only.
"""

from __future__ import annotations

from dataclasses import dataclass

BLOCK, ENCODER_DECODER = "block", "encoder_decoder"


@dataclass(frozen=True, slots=True)
class RuleInfo:
    name: str
    style: str  # BLOCK | ENCODER_DECODER
    knobs: tuple[str, ...]
    summary: str


_INFOS = (
    RuleInfo("threshold", BLOCK, ("threshold",), "accept rows with confidence > tau (SDAR)"),
    RuleInfo("entropy_budget", BLOCK, ("entropy_budget",), "accept by an entropy budget (ORL)"),
    RuleInfo("fixed_steps", BLOCK, ("denoising_steps",), "a fixed number of rounds per block"),
    RuleInfo(
        "llada_editing",
        BLOCK,
        ("editing", "max_post_steps"),
        "LLaDA2's mask-to-token + token-to-token editing",
    ),
    RuleInfo(
        "entropy_bound_canvas",
        ENCODER_DECODER,
        ("max_denoising_steps", "entropy_bound", "t_min", "t_max", "stability_threshold"),
        "DiffusionGemma's canvas decoder (self-conditioning, entropy-bounded acceptance)",
    ),
)
RULES: dict[str, RuleInfo] = {info.name: info for info in _INFOS}
RULE_NAMES: tuple[str, ...] = tuple(RULES)


def rule_names(style: str) -> tuple[str, ...]:
    """The names of the rules of one decoding style."""
    return tuple(name for name, info in RULES.items() if info.style == style)
