"""The acceptance rules by name, each with its knobs: one registry for the CLI, `DecodeParams`,
the server, bench sweeps and `make_rule` (no torch).

A rule belongs to one decoding style (see `docs/decoding.md`):
  block            QwenDLM and LLaDA2: rounds over a block of B rows (`dlmrt/decoding/*.py`)
  encoder_decoder  DiffusionGemma: denoising steps over a canvas (`CanvasSettings`, built from the
                   checkpoint's generation_config and the canvas knobs of `DecodeParams`)
A rule's `knobs` (`dlmrt/knobs.py`) are declared here and nowhere else: adding one to a rule's
tuple gives it a `DecodeParams` field, a flag, an HTTP field and a sweep, and `make_rule` passes
it to the rule's class under its name (a block rule's class takes its knobs as keywords).
"""

from __future__ import annotations

from dataclasses import dataclass

from dlmrt.knobs import Knob

BLOCK, ENCODER_DECODER = "block", "encoder_decoder"
NATS = 1e4  # the upper bound of the entropy and temperature knobs: finite


@dataclass(frozen=True, slots=True)
class RuleInfo:
    name: str
    style: str  # BLOCK | ENCODER_DECODER
    summary: str
    knobs: tuple[Knob, ...] = ()


# The registry as a table (the formatter skips it): a rule per row, its knobs one per row beneath.
_INFOS = (
    RuleInfo("threshold", BLOCK, "accept rows with confidence > tau (SDAR)", (
        Knob("threshold", float, "`threshold` rule: accept rows with confidence > tau",
             fallback=0.9, checkpoint=True, low=0.0, high=1.0),
    )),
    RuleInfo("entropy_budget", BLOCK, "accept by an entropy budget (ORL)", (
        Knob("entropy_budget", float, "`entropy_budget` rule: gamma, in nats",
             fallback=0.8, checkpoint=True, low=0.0, high=NATS),
    )),
    RuleInfo("fixed_steps", BLOCK, "a fixed number of rounds per block", (
        Knob("denoising_steps", int, "`fixed_steps` rule: rounds per block; None: the block length",
             low=1),
    )),
    RuleInfo("llada_editing", BLOCK, "LLaDA2's mask-to-token + token-to-token editing", (
        Knob("editing", str, "`llada_editing` preset: quality (tau_mask 0.7, tau_edit 0.5) | speed "
             "(0.5, 0.0); implies that rule; None: quality when the rule is llada_editing",
             fallback="quality", choices=("quality", "speed"), selects_rule=True),
        Knob("max_post_steps", int,
             "`llada_editing`: editing rounds at most once a block has no masks",
             default=16, low=0),
    )),
    RuleInfo("entropy_bound_canvas", ENCODER_DECODER,
             "DiffusionGemma's canvas decoder (self-conditioning, entropy-bounded acceptance)", (
        # fallbacks: transformers' global defaults (`CanvasSettings` reads them)
        Knob("max_denoising_steps", int, "canvas decoder: denoising steps per canvas at most",
             fallback=48, checkpoint=True, low=1),
        Knob("entropy_bound", float, "canvas decoder: entropy bound of the acceptance (nats)",
             fallback=0.1, checkpoint=True, low=0.0, high=NATS, above_low=True),
        Knob("t_min", float, "canvas decoder: temperature at the last step",
             fallback=0.4, checkpoint=True, low=0.0, high=NATS, above_low=True),
        Knob("t_max", float, "canvas decoder: temperature at the first step",
             fallback=0.8, checkpoint=True, low=0.0, high=NATS, above_low=True),
        Knob("stability_threshold", int, "canvas decoder: steps the argmax canvas must be stable",
             fallback=1, checkpoint=True, low=0),
        Knob("confidence_threshold", float, "canvas decoder: mean entropy below which it may stop",
             fallback=0.005, checkpoint=True, low=0.0, high=NATS),
        Knob("rng", str, "canvas decoder noise: torch (transformers' draws) or counter (hashed "
             "from seed and step: graph-replayable); None: counter in a graph mode, else torch "
             "(torch in a graph mode runs that request on the eager reference path)",
             choices=("torch", "counter")),
    )),
)  # fmt: skip
RULES: dict[str, RuleInfo] = {info.name: info for info in _INFOS}
RULE_NAMES: tuple[str, ...] = tuple(RULES)
# Every knob by name, in registry order, and the rule that declares it (one rule per knob name).
KNOBS: dict[str, Knob] = {k.name: k for info in _INFOS for k in info.knobs}
RULE_OF_KNOB: dict[str, RuleInfo] = {k.name: info for info in _INFOS for k in info.knobs}
assert len(KNOBS) == sum(len(info.knobs) for info in _INFOS), "a knob name declared twice"


def rule_names(style: str) -> tuple[str, ...]:
    """The names of the rules of one decoding style."""
    return tuple(name for name, info in RULES.items() if info.style == style)


def style_knobs(style: str, checkpoint: bool | None = None) -> tuple[Knob, ...]:
    """The knobs of one decoding style's rules; `checkpoint` True / False: only those a
    checkpoint may (may not) set."""
    return tuple(
        k
        for k in KNOBS.values()
        if RULE_OF_KNOB[k.name].style == style and checkpoint in (None, k.checkpoint)
    )


def knob_help(knob: Knob) -> str:
    """The knob's help text, with who decides when it is unset."""
    return knob.describe(RULE_OF_KNOB[knob.name].style)
